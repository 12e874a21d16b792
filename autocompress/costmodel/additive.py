"""Additive cost tables for the search, and their differentiable expectation.

For a fixed workload and global hidden size h, every latency the search
constrains is a constant plus one term per attention block and one per FFN
block, chosen independently per layer:

    cost(h) = C(h) + Σ_l A[l, a_l, h] + Σ_l F[l, f_l, h]            (ttft, tpot, e2e)

so with choice probabilities p_attn[l, k], p_ffn[l, k], p_hidden[h]:

    E[cost] = Σ_h p_h · (C(h) + Σ_l Σ_k p_attn[l,k]·A[l,k,h] + Σ_l Σ_k p_ffn[l,k]·F[l,k,h])

which is exact. Memory is weights (additive, plus KV pages on paged engines)
plus an activation *peak*: the largest of per-block candidates (see
``CostModel.peak_bytes``). Its expectation is computed from the distribution of
the maximum of independent per-layer choices (a product of per-block CDFs).
Under hf-eager's dynamic cache a candidate also holds the cache of the layers
before it; that prefix enters at its expected value (mean field), so the
memory expectation is exact for one-hot probabilities and a close, smooth
approximation in between.

For one-hot probabilities every expectation equals ``CostModel.predict`` of that
architecture (up to float64 rounding); see ``tests/test_costmodel_additive.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.costmodel.blocks import block_shape
from autocompress.costmodel.workload import Workload

ADDITIVE_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "memory_gb")
MEMORY_PARTS = ("kv_prefill", "kv_final", "prefill_act", "decode_act")
GB = 1e9


@dataclass
class AdditiveCosts:
    """Cost tables over the search's choices (float64 tensors, memory in GB).

    Shapes: L layers, Ka attention options, Kf FFN options, H hidden options.

    - ``const[m]``: ``[H]`` — embeddings/LM head/engine overhead (memory: their weights
      and the engine overhead);
    - ``attention[m]``: ``[L, Ka, H]`` and ``ffn[m]``: ``[L, Kf, H]`` — the additive
      cost of option k in layer l (memory: its weights, plus KV pages on paged engines);
    - ``attention_memory[part]`` / ``ffn_memory[part]`` (``[L, K, H]``) and
      ``const_memory[part]`` (``[H]``): the pieces of the activation peak, part in
      ``kv_prefill``, ``kv_final``, ``prefill_act``, ``decode_act``;
    - ``attention_present`` / ``ffn_present``: ``[L, K]`` False for removed blocks.

    ``m`` in ``ADDITIVE_METRICS``: ``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``memory_gb``.
    Throughput is batch/TPOT: a bound ``throughput ≥ X`` is ``tpot_ms ≤ 1000·batch/X``.
    """

    workload: Workload
    reference: ArchSpec
    hidden_options: list[int]
    attention_options: list[list[AttentionSpec | None]]
    ffn_options: list[list[FFNSpec | None]]
    const: dict[str, torch.Tensor]
    attention: dict[str, torch.Tensor]
    ffn: dict[str, torch.Tensor]
    const_memory: dict[str, torch.Tensor]
    attention_memory: dict[str, torch.Tensor]
    ffn_memory: dict[str, torch.Tensor]
    attention_present: torch.Tensor
    ffn_present: torch.Tensor
    dynamic_cache: bool

    @property
    def num_layers(self) -> int:
        return len(self.attention_options)

    def expected(
        self,
        p_attention: torch.Tensor,
        p_ffn: torch.Tensor,
        p_hidden: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """Expected cost per metric (scalar tensors, differentiable in the probabilities).

        ``p_attention``: ``[L, Ka]``, ``p_ffn``: ``[L, Kf]``, ``p_hidden``: ``[H]``; rows
        sum to 1. Computed in the probabilities' dtype (use float64 for exactness).
        """
        self._check_shapes(p_attention, p_ffn, p_hidden)
        dtype = p_attention.dtype
        out: dict[str, torch.Tensor] = {}
        for metric in ADDITIVE_METRICS:
            per_hidden = (
                self.const[metric].to(dtype)
                + torch.einsum("lk,lkh->h", p_attention, self.attention[metric].to(dtype))
                + torch.einsum("lk,lkh->h", p_ffn, self.ffn[metric].to(dtype))
            )
            if metric == "memory_gb":
                peaks = [self._expected_peak(p_attention, p_ffn, h, dtype)
                         for h in range(len(self.hidden_options))]
                per_hidden = per_hidden + torch.stack(peaks)
            out[metric] = (p_hidden * per_hidden).sum()
        return out

    def _expected_peak(
        self, p_a: torch.Tensor, p_f: torch.Tensor, h: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """E[activation peak] at hidden option ``h`` (mirrors ``CostModel.peak_bytes``)."""
        att = {k: v[:, :, h].to(dtype) for k, v in self.attention_memory.items()}
        ffn = {k: v[:, :, h].to(dtype) for k, v in self.ffn_memory.items()}
        c_pre = self.const_memory["prefill_act"][h].to(dtype)
        c_dec = self.const_memory["decode_act"][h].to(dtype)
        if not self.dynamic_cache:
            att_value = c_pre + att["prefill_act"]
            ffn_value = c_pre + ffn["prefill_act"]
        else:
            kv_prefill = (p_a * att["kv_prefill"]).sum(1)  # expected, per layer
            kv_final = (p_a * att["kv_final"]).sum(1)
            before = torch.cat([kv_prefill.new_zeros(1), torch.cumsum(kv_prefill, 0)[:-1]])
            others_final = kv_final.sum() - kv_final  # the rest of the final cache
            att_value = torch.maximum(
                c_pre + (before[:, None] + att["kv_prefill"]) + att["prefill_act"],
                c_dec + (others_final[:, None] + att["kv_final"]) + att["decode_act"],
            )
            ffn_value = c_pre + (before + kv_prefill)[:, None] + ffn["prefill_act"]
        zero = att_value.new_zeros(())
        att_value = torch.where(self.attention_present, att_value, zero)
        ffn_value = torch.where(self.ffn_present, ffn_value, zero)
        return expected_max([att_value, ffn_value], [p_a, p_f])

    def discrete(
        self, attention_index: list[int], ffn_index: list[int], hidden_index: int
    ) -> dict[str, float]:
        """Cost of one architecture given by option indices (one-hot expectation)."""
        p_a = _one_hot(attention_index, len(self.attention_options[0]))
        p_f = _one_hot(ffn_index, len(self.ffn_options[0]))
        p_h = _one_hot([hidden_index], len(self.hidden_options))[0]
        return {k: float(v) for k, v in self.expected(p_a, p_f, p_h).items()}

    def spec_of(
        self, attention_index: list[int], ffn_index: list[int], hidden_index: int
    ) -> ArchSpec:
        """The ArchSpec those option indices describe (reference fields kept)."""
        layers = [
            LayerSpec(attention=self.attention_options[i][a], ffn=self.ffn_options[i][f])
            for i, (a, f) in enumerate(zip(attention_index, ffn_index, strict=True))
        ]
        return self.reference.model_copy(
            update={"hidden_size": self.hidden_options[hidden_index], "layers": layers}
        )

    def _check_shapes(self, p_a: torch.Tensor, p_f: torch.Tensor, p_h: torch.Tensor) -> None:
        want = (
            (tuple(self.attention["ttft_ms"].shape[:2]), tuple(p_a.shape), "p_attention"),
            (tuple(self.ffn["ttft_ms"].shape[:2]), tuple(p_f.shape), "p_ffn"),
            ((len(self.hidden_options),), tuple(p_h.shape), "p_hidden"),
        )
        for expected, got, name in want:
            if expected != got:
                raise ValueError(f"{name} has shape {got}, expected {expected}")


def expected_max(values: list[torch.Tensor], probs: list[torch.Tensor]) -> torch.Tensor:
    """E[max(0, max over variables)] for independent categorical variables.

    ``values[i]``: ``[L, K]`` value of option k of variable l; ``probs[i]``: same shape,
    rows sum to 1. With the sorted values (and 0) as thresholds t_0 ≤ t_1 ≤ ...,
    P(max ≤ t_m) = Π_l Σ_k p[l,k]·[v[l,k] ≤ t_m], and E[max] = Σ_m t_m·ΔP_m.
    For one-hot probabilities this is exactly the maximum. Differentiable in the
    probabilities and in the values.
    """
    zero = values[0].new_zeros(1)
    thresholds, _ = torch.sort(torch.cat([v.flatten() for v in values] + [zero]))
    cdf = torch.ones_like(thresholds)
    for value, prob in zip(values, probs, strict=True):
        below = (value.detach().unsqueeze(-1) <= thresholds.detach()).to(prob.dtype)  # [L,K,M]
        cdf = cdf * (prob.unsqueeze(-1) * below).sum(1).prod(0)
    mass = cdf - torch.cat([cdf.new_zeros(1), cdf[:-1]])
    return (mass * thresholds).sum()


def _one_hot(indices: list[int], size: int) -> torch.Tensor:
    out = torch.zeros(len(indices), size, dtype=torch.float64)
    out[torch.arange(len(indices)), torch.tensor(indices)] = 1.0
    return out


def _per_layer(options: list, num_layers: int, name: str) -> list[list]:
    """Accept one option list for every layer, or one list per layer (same lengths)."""
    if options and isinstance(options[0], list | tuple):
        per_layer = [list(o) for o in options]
        if len(per_layer) != num_layers:
            raise ValueError(f"{name}: {len(per_layer)} lists for {num_layers} layers")
    else:
        per_layer = [list(options) for _ in range(num_layers)]
    if len({len(o) for o in per_layer}) != 1 or not per_layer[0]:
        raise ValueError(f"{name}: every layer needs the same, non-zero number of options")
    return per_layer


def _tabulate(model, reference: ArchSpec, workload: Workload, hidden_options: list[int],
              options: list[list]):
    """Per (layer, option, hidden) block costs: (metric tables, memory-part tables, present)."""
    shape = (len(options), len(options[0]), len(hidden_options))
    costs = {m: torch.zeros(shape, dtype=torch.float64) for m in ADDITIVE_METRICS}
    parts = {p: torch.zeros(shape, dtype=torch.float64) for p in MEMORY_PARTS}
    present = torch.tensor([[o is not None for o in row] for row in options])
    steps = workload.decode_steps
    cache: dict[tuple, tuple] = {}
    for h_index, hidden in enumerate(hidden_options):
        env = model.env(reference.model_copy(update={"hidden_size": hidden}), workload)
        for layer, layer_options in enumerate(options):
            for k, option in enumerate(layer_options):
                last = layer == len(options) - 1
                key = (option, hidden, last)
                if key not in cache:
                    blk = block_shape(option, hidden, env, last)
                    cache[key] = (model.block_ms("prefill", blk, hidden, env),
                                  model.block_ms("decode", blk, hidden, env),
                                  model.block_memory(blk, hidden, env))
                ttft, tpot, mem = cache[key]
                at = (layer, k, h_index)
                costs["ttft_ms"][at] = ttft
                costs["tpot_ms"][at] = tpot
                costs["e2e_ms"][at] = ttft + steps * tpot
                paged_kv = 0.0 if model.dynamic_cache else mem["kv_final"]
                costs["memory_gb"][at] = (mem["weights"] + paged_kv) / GB
                for part in MEMORY_PARTS:
                    parts[part][at] = mem[part] / GB
    return costs, parts, present


def build_additive_costs(
    model,
    reference: ArchSpec,
    workload: Workload,
    hidden_options: list[int],
    attention_options: list,
    ffn_options: list,
) -> AdditiveCosts:
    """Tabulate ``model``'s per-block costs for every (layer, option, hidden size)."""
    num_layers = reference.num_layers
    att_opts = _per_layer(attention_options, num_layers, "attention_options")
    ffn_opts = _per_layer(ffn_options, num_layers, "ffn_options")
    attention, att_memory, att_present = _tabulate(model, reference, workload,
                                                   hidden_options, att_opts)
    ffn, ffn_memory, ffn_present = _tabulate(model, reference, workload, hidden_options, ffn_opts)
    count = len(hidden_options)
    const = {m: torch.zeros(count, dtype=torch.float64) for m in ADDITIVE_METRICS}
    const_memory = {p: torch.zeros(count, dtype=torch.float64)
                    for p in ("prefill_act", "decode_act")}
    for h_index, hidden in enumerate(hidden_options):
        env = model.env(reference.model_copy(update={"hidden_size": hidden}), workload)
        ttft = model.const_ms("prefill", hidden, env)
        tpot = model.const_ms("decode", hidden, env)
        mem = model.const_memory(hidden, env)
        const["ttft_ms"][h_index] = ttft
        const["tpot_ms"][h_index] = tpot
        const["e2e_ms"][h_index] = ttft + workload.decode_steps * tpot
        const["memory_gb"][h_index] = (mem["weights"] + mem["overhead"]) / GB
        for part in const_memory:
            const_memory[part][h_index] = mem[part] / GB
    return AdditiveCosts(
        workload=workload,
        reference=reference,
        hidden_options=list(hidden_options),
        attention_options=att_opts,
        ffn_options=ffn_opts,
        const=const,
        attention=attention,
        ffn=ffn,
        const_memory=const_memory,
        attention_memory=att_memory,
        ffn_memory=ffn_memory,
        attention_present=att_present,
        ffn_present=ffn_present,
        dynamic_cache=model.dynamic_cache,
    )
