"""Minitron importance: which neurons, heads, channels and blocks matter.

Forward passes only, on calibration batches, with activations read by hooks and
accumulated in fp32 (arXiv 2407.14679, 2408.11796):

- FFN neurons: the input of ``down_proj`` (= act(gate) * up), one score per neuron.
- Attention heads: the input of ``o_proj`` split per head, L2 over head_dim.
  Heads are ranked *within* their KV group (pruning keeps whole groups even).
- Hidden channels: the outputs of every RMSNorm (both norms of every layer and
  the final norm), summed over norms.
- Aggregation: |activation| averaged over the sequence, then L2 over all samples.
  (The magnitude is used so positive and negative activations do not cancel.)
- Depth: per layer and per sub-block ``1 − cos(h_in, h_out)`` of the residual
  stream (mean over tokens), and the loss increase when the block is removed.

Two criteria rank neurons, heads and hidden channels (``criterion``):

- ``activation``: the forward-only scores above (Minitron).
- ``taylor``: first-order Taylor of the language-modelling loss, the magnitude of
  ``w · ∂L/∂w`` summed over every weight that leaves with the unit: an FFN neuron's
  rows of ``gate_proj``/``up_proj`` and column of ``down_proj``; a query head's rows
  of ``q_proj`` and columns of ``o_proj``; a hidden channel's column of every
  projection reading the residual stream, row of every projection writing it, its
  embedding (and untied LM-head) column and its RMSNorm weights. The gradient is
  summed over the calibration batches before the product (the loss change of the
  whole calibration set). The loss is next-token cross-entropy: on the teacher
  itself a distillation loss (KL to the teacher) is zero with a zero gradient.
  ``lab/importance_criteria.py`` measures the two against each other.

Depth scores are the same for both criteria. Sorting once gives nested prefix
orders (``ffn_order``, ``head_order``, ...): the search decides *how many* to keep,
pruning takes the top ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from autocompress.arch import ArchSpec
from autocompress.atomic import atomic_path
from autocompress.errors import AutoCompressError
from autocompress.modeling.blocks import decoder_layers

FORMAT = "autocompress-importance/1"
DEPTH_METRICS = ("cosine", "loss")
CRITERIA = ("activation", "taylor")
Criterion = Literal["activation", "taylor"]
# The criterion the flows, the CLI and the search use unless told otherwise, chosen by
# lab/importance_criteria.py (bundled teacher, whole held-out split, paired per window):
# taylor − activation = −0.110 [−0.130, −0.090] nats (4 heads + FFN 384), +0.006
# [−0.004, +0.016] (2 heads + FFN 192), −0.010 [−0.011, −0.009] (FFN 384 only).
DEFAULT_CRITERION: Criterion = "taylor"


@dataclass
class Importance:
    """Importance scores of one model (higher = more important).

    Per-layer lists hold ``None`` where the model has no such block. Depth
    tensors have one value per layer (NaN where the block is absent or where
    loss-on-removal was not computed).
    """

    arch: ArchSpec
    ffn: list[torch.Tensor | None]
    heads: list[torch.Tensor | None]
    hidden: torch.Tensor
    layer_cosine: torch.Tensor
    attention_cosine: torch.Tensor
    ffn_cosine: torch.Tensor
    layer_loss: torch.Tensor
    attention_loss: torch.Tensor
    ffn_loss: torch.Tensor
    base_loss: float = float("nan")
    num_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------- orders
    def hidden_order(self) -> torch.Tensor:
        """Hidden channels, most important first."""
        return _descending(self.hidden)

    def ffn_order(self, layer: int) -> torch.Tensor:
        """FFN neurons of ``layer``, most important first."""
        return _descending(self._need(self.ffn, layer, "FFN"))

    def kv_group_scores(self, layer: int) -> torch.Tensor:
        """One score per KV group: L2 of its query heads' scores."""
        scores = self._need(self.heads, layer, "attention")
        groups = self.arch.layers[layer].attention.num_kv_heads
        return scores.view(groups, -1).pow(2).sum(dim=1).sqrt()

    def kv_group_order(self, layer: int) -> torch.Tensor:
        """KV groups of ``layer``, most important first."""
        return _descending(self.kv_group_scores(layer))

    def head_order(self, layer: int) -> torch.Tensor:
        """[num_kv_heads, heads_per_group]: query-head indices, best first within each group."""
        scores = self._need(self.heads, layer, "attention")
        groups = self.arch.layers[layer].attention.num_kv_heads
        per_group = scores.view(groups, -1)
        order = torch.argsort(per_group, dim=1, descending=True, stable=True)
        return order + torch.arange(groups).unsqueeze(1) * per_group.shape[1]

    def depth_scores(self, metric: str = "cosine") -> torch.Tensor:
        """Per-layer importance of the whole layer by ``cosine`` or ``loss``."""
        if metric not in DEPTH_METRICS:
            raise AutoCompressError(
                f"unknown depth metric {metric!r}", hint=f"use one of {DEPTH_METRICS}"
            )
        scores = self.layer_cosine if metric == "cosine" else self.layer_loss
        if metric == "loss" and torch.isnan(scores).all():
            raise AutoCompressError(
                "this importance file has no loss-on-removal scores",
                hint="recompute it with removal batches > 0, or use the cosine metric",
            )
        return scores

    def layers_to_drop(
        self, count: int, metric: str = "cosine", protect_first_last: bool = True
    ) -> list[int]:
        """The ``count`` least important layers (first and last protected by default)."""
        scores = self.depth_scores(metric).clone()
        num_layers = scores.numel()
        candidates = list(range(num_layers))
        if protect_first_last and num_layers > 2:
            candidates = candidates[1:-1]
        if count > len(candidates):
            raise AutoCompressError(
                f"cannot drop {count} of {num_layers} layers"
                + (" with the first and last protected" if protect_first_last else ""),
                hint="keep more layers in the ArchSpec",
            )
        ranked = sorted(candidates, key=lambda i: (float(scores[i]), i))
        return sorted(ranked[:count])

    def _need(self, values: list, layer: int, what: str) -> torch.Tensor:
        value = values[layer]
        if value is None:
            raise AutoCompressError(f"layer {layer} of the scored model has no {what} block")
        return value

    # ------------------------------------------------------------ save/load
    def save(self, path: str | Path) -> Path:
        """Write one ``.safetensors`` file (tensors + JSON metadata), atomically."""
        path = Path(path)
        tensors = {
            "hidden": self.hidden,
            "layer_cosine": self.layer_cosine,
            "attention_cosine": self.attention_cosine,
            "ffn_cosine": self.ffn_cosine,
            "layer_loss": self.layer_loss,
            "attention_loss": self.attention_loss,
            "ffn_loss": self.ffn_loss,
        }
        for i, scores in enumerate(self.ffn):
            if scores is not None:
                tensors[f"ffn.{i}"] = scores
        for i, scores in enumerate(self.heads):
            if scores is not None:
                tensors[f"heads.{i}"] = scores
        tensors = {k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}
        meta = {
            "format": FORMAT,
            "arch": self.arch.to_json(indent=None),
            "base_loss": json.dumps(self.base_loss),
            "num_tokens": str(self.num_tokens),
            "meta": json.dumps(self.meta),
        }
        with atomic_path(path) as tmp:
            save_file(tensors, tmp, metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Importance:
        """Read a file written by ``save``."""
        path = Path(path)
        if not path.is_file():
            raise AutoCompressError(
                f"importance file not found: {path}",
                hint="compute one with `autocompress importance --model M --out FILE`",
            )
        try:
            tensors = load_file(path)
            from safetensors import safe_open

            with safe_open(path, framework="pt") as handle:
                meta = handle.metadata() or {}
        except (SafetensorError, OSError) as err:
            raise AutoCompressError(
                f"{path} is not a readable importance file ({err})",
                hint="recompute it with `autocompress importance`",
            ) from None
        if meta.get("format") != FORMAT:
            raise AutoCompressError(
                f"{path} is not an AutoCompress importance file (format {meta.get('format')!r})",
                hint="recompute it with `autocompress importance`",
            )
        arch = ArchSpec.from_json(meta["arch"])
        layers = range(arch.num_layers)
        return cls(
            arch=arch,
            ffn=[tensors.get(f"ffn.{i}") for i in layers],
            heads=[tensors.get(f"heads.{i}") for i in layers],
            hidden=tensors["hidden"],
            layer_cosine=tensors["layer_cosine"],
            attention_cosine=tensors["attention_cosine"],
            ffn_cosine=tensors["ffn_cosine"],
            layer_loss=tensors["layer_loss"],
            attention_loss=tensors["attention_loss"],
            ffn_loss=tensors["ffn_loss"],
            base_loss=json.loads(meta["base_loss"]),
            num_tokens=int(meta["num_tokens"]),
            meta=json.loads(meta["meta"]),
        )

    def summary(self) -> dict[str, Any]:
        """Small JSON-able overview (for logs and reports)."""
        return {
            "num_layers": self.arch.num_layers,
            "num_tokens": self.num_tokens,
            "base_loss": self.base_loss,
            "layer_cosine": [round(float(x), 6) for x in self.layer_cosine],
            "layer_loss": [None if math.isnan(x) else round(float(x), 6) for x in self.layer_loss],
        }


def _descending(scores: torch.Tensor) -> torch.Tensor:
    # Stable, so ties keep the original order (keep-everything is the identity).
    return torch.argsort(scores, descending=True, stable=True)


# -------------------------------------------------------------- computing


class _Accumulator:
    """Sums of squares over samples of (|activation| mean over the sequence)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None

    def add(self, per_sample: torch.Tensor) -> None:
        # per_sample: [B, N] already averaged over the sequence.
        squares = per_sample.pow(2).sum(dim=0)
        self.total = squares if self.total is None else self.total + squares

    def result(self) -> torch.Tensor | None:
        return None if self.total is None else self.total.sqrt()


class _Cosine:
    """Mean over tokens of 1 − cos(h_in, h_out)."""

    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0

    def add(self, h_in: torch.Tensor, h_out: torch.Tensor) -> None:
        cos = nn.functional.cosine_similarity(h_in.float(), h_out.float(), dim=-1)
        self.sum += float((1.0 - cos).sum())
        self.count += cos.numel()

    def result(self) -> float:
        return self.sum / self.count if self.count else float("nan")


def compute_importance(
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    *,
    removal_batches: int = 2,
    criterion: Criterion = DEFAULT_CRITERION,
    progress: bool = False,
) -> Importance:
    """Score ``model`` on calibration ``batches`` (LongTensor [B, T] each).

    ``removal_batches``: how many of the batches to use for loss-on-removal
    (one forward pass per layer and sub-block per batch; 0 skips it).
    ``criterion``: ``activation`` or ``taylor`` for neurons, heads and hidden
    channels (see the module doc); depth scores are the same for both.
    """
    if criterion not in CRITERIA:
        raise AutoCompressError(f"unknown importance criterion {criterion!r}",
                                hint=f"use one of {', '.join(CRITERIA)}")
    from autocompress.modeling import arch_spec_of

    arch = arch_spec_of(model)
    batches = [b for b in batches]
    if not batches:
        raise AutoCompressError(
            "no calibration batches were given", hint="check the data split and sequence length"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        stats = _activation_pass(model, arch, batches, device, progress)
        if criterion == "taylor":
            stats.update(_taylor_pass(model, arch, batches, device, progress))
        removal = _removal_pass(model, arch, batches[:removal_batches], device, progress)
    finally:
        model.train(was_training)
    num_tokens = sum(b.numel() for b in batches)
    return Importance(arch=arch, num_tokens=num_tokens, meta={"criterion": criterion},
                      **stats, **removal)


def _activation_pass(model, arch: ArchSpec, batches, device, progress: bool) -> dict[str, Any]:
    layers = decoder_layers(model)
    ffn_acc = [_Accumulator() for _ in layers]
    head_acc = [_Accumulator() for _ in layers]
    norm_acc: dict[str, _Accumulator] = {}
    cos_layer = [_Cosine() for _ in layers]
    cos_attn = [_Cosine() for _ in layers]
    cos_ffn = [_Cosine() for _ in layers]
    handles = []
    residual: dict[int, dict[str, torch.Tensor]] = {}

    def down_proj_hook(i):
        def hook(_module, args):
            ffn_acc[i].add(args[0].float().abs().mean(dim=1))

        return hook

    def o_proj_hook(i, head_dim):
        def hook(_module, args):
            x = args[0].float()
            per_head = x.view(*x.shape[:-1], -1, head_dim).norm(dim=-1)  # [B, T, heads]
            head_acc[i].add(per_head.mean(dim=1))

        return hook

    def norm_hook(name):
        norm_acc[name] = _Accumulator()

        def hook(_module, _args, output):
            norm_acc[name].add(output.float().abs().mean(dim=1))

        return hook

    def layer_pre_hook(i):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            residual[i] = {"in": hidden.detach()}

        return hook

    def mid_hook(i):
        def hook(_module, args):
            residual[i]["mid"] = args[0].detach()

        return hook

    def layer_hook(i, has_attn, has_ffn):
        def hook(_module, _args, _kwargs, output):
            out = output[0] if isinstance(output, tuple) else output
            h_in = residual[i]["in"]
            mid = residual[i].get("mid", out if not has_ffn else h_in)
            cos_layer[i].add(h_in, out)
            if has_attn:
                cos_attn[i].add(h_in, mid)
            if has_ffn:
                cos_ffn[i].add(mid, out)
            residual.pop(i, None)

        return hook

    for i, layer in enumerate(layers):
        spec = arch.layers[i]
        if spec.ffn is not None:
            handles.append(layer.mlp.down_proj.register_forward_pre_hook(down_proj_hook(i)))
            handles.append(
                layer.post_attention_layernorm.register_forward_hook(norm_hook(f"{i}.post"))
            )
            handles.append(layer.post_attention_layernorm.register_forward_pre_hook(mid_hook(i)))
        if spec.attention is not None:
            o_proj = layer.self_attn.o_proj
            handles.append(o_proj.register_forward_pre_hook(o_proj_hook(i, arch.head_dim)))
            handles.append(layer.input_layernorm.register_forward_hook(norm_hook(f"{i}.input")))
        handles.append(layer.register_forward_pre_hook(layer_pre_hook(i), with_kwargs=True))
        handles.append(
            layer.register_forward_hook(
                layer_hook(i, spec.attention is not None, spec.ffn is not None), with_kwargs=True
            )
        )
    handles.append(model.model.norm.register_forward_hook(norm_hook("final")))
    try:
        with torch.no_grad():
            for ids in _progress(batches, "importance: activations", progress):
                model(ids.to(device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()

    hidden = sum(acc.result() for acc in norm_acc.values())

    def cos_tensor(values):
        return torch.tensor([v.result() for v in values], dtype=torch.float32)

    return {
        "ffn": [acc.result() for acc in ffn_acc],
        "heads": [acc.result() for acc in head_acc],
        "hidden": hidden,
        "layer_cosine": cos_tensor(cos_layer),
        "attention_cosine": cos_tensor(cos_attn),
        "ffn_cosine": cos_tensor(cos_ffn),
    }


def _taylor_pass(model, arch: ArchSpec, batches, device, progress: bool) -> dict[str, Any]:
    """First-order Taylor scores |w · ∂L/∂w| per FFN neuron, query head and hidden channel."""
    params = [p for p in model.parameters()]
    wanted = [p.requires_grad for p in params]
    saved = [p.grad for p in params]
    for p in params:
        p.requires_grad_(True)
        p.grad = None
    # Each batch's summed loss over the tokens of all batches: the gradients add up to
    # that of the mean loss over all of them, however the data is split into batches.
    total = sum(ids[:, 1:].numel() for ids in batches)
    try:
        for ids in _progress(batches, "importance: gradients", progress):
            ids = ids.to(device)
            logits = model(ids, use_cache=False).logits.float()
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                reduction="sum",
            )
            (loss / total).backward()
        return _taylor_scores(model, arch)
    finally:
        for p, req, grad in zip(params, wanted, saved, strict=True):
            p.grad = grad
            p.requires_grad_(req)


def _saliency(linear: nn.Module) -> torch.Tensor:
    """|w · g| of a weight (zeros where it got no gradient), in fp32."""
    weight = linear.weight
    if weight.grad is None:
        return torch.zeros_like(weight, dtype=torch.float32)
    return (weight.detach().float() * weight.grad.float()).abs()


def _taylor_scores(model, arch: ArchSpec) -> dict[str, Any]:
    head_dim = arch.head_dim
    ffn: list[torch.Tensor | None] = []
    heads: list[torch.Tensor | None] = []
    hidden = torch.zeros(arch.hidden_size)
    for i, layer in enumerate(decoder_layers(model)):
        spec = arch.layers[i]
        if spec.ffn is None:
            ffn.append(None)
        else:
            mlp = layer.mlp
            gate, up, down = (_saliency(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
            ffn.append((gate.sum(1) + up.sum(1) + down.sum(0)).cpu())
            hidden += (gate.sum(0) + up.sum(0) + down.sum(1)).cpu()
            hidden += _saliency(layer.post_attention_layernorm).cpu()
        if spec.attention is None:
            heads.append(None)
        else:
            attn = layer.self_attn
            q, k, v, o = (_saliency(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj,
                                                   attn.o_proj))
            per_head = q.sum(1).view(-1, head_dim).sum(1) + o.sum(0).view(-1, head_dim).sum(1)
            heads.append(per_head.cpu())
            hidden += (q.sum(0) + k.sum(0) + v.sum(0) + o.sum(1)).cpu()
            hidden += _saliency(layer.input_layernorm).cpu()
    base = model.model
    hidden += _saliency(base.embed_tokens).sum(0).cpu() + _saliency(base.norm).cpu()
    head = model.get_output_embeddings()
    if head is not None and head.weight is not base.embed_tokens.weight:
        hidden += _saliency(head).sum(0).cpu()
    return {"ffn": ffn, "heads": heads, "hidden": hidden}


def _removal_pass(model, arch: ArchSpec, batches, device, progress: bool) -> dict[str, Any]:
    """Loss increase when each layer / attention / FFN block is skipped."""
    num_layers = arch.num_layers
    nan = torch.full((num_layers,), float("nan"))
    result = {"layer_loss": nan.clone(), "attention_loss": nan.clone(), "ffn_loss": nan.clone()}
    if not batches:
        return {**result, "base_loss": float("nan")}
    base = mean_loss(model, batches, device)
    layers = decoder_layers(model)
    jobs = []
    for i in range(num_layers):
        jobs.append(("layer_loss", i, layers[i]))
        if arch.layers[i].attention is not None:
            jobs.append(("attention_loss", i, layers[i].self_attn))
        if arch.layers[i].ffn is not None:
            jobs.append(("ffn_loss", i, layers[i].mlp))
    for key, i, module in _progress(jobs, "importance: loss on removal", progress):
        with skip_module(module):
            result[key][i] = mean_loss(model, batches, device) - base
    return {**result, "base_loss": base}


@contextmanager
def skip_module(module: nn.Module):
    """Make a decoder layer the identity, or a sub-block output zero, while inside."""

    def hook(_module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        if isinstance(output, tuple):  # attention: (output, weights)
            return (torch.zeros_like(output[0]), *output[1:])
        if output.shape == hidden.shape and _is_decoder_layer(module):
            return hidden  # whole layer: identity on the residual stream
        return torch.zeros_like(output)  # FFN: contributes nothing

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _is_decoder_layer(module: nn.Module) -> bool:
    return hasattr(module, "input_layernorm") or hasattr(module, "post_attention_layernorm")


def mean_loss(model: nn.Module, batches: list[torch.Tensor], device) -> float:
    """Token-weighted mean next-token cross-entropy over ``batches``."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids in batches:
            ids = ids.to(device)
            logits = model(ids, use_cache=False).logits.float()
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                ids[:, 1:].reshape(-1),
                reduction="sum",
            )
            total += float(loss)
            count += ids[:, 1:].numel()
    return total / count


def random_importance(arch_or_model: ArchSpec | nn.Module, seed: int = 0) -> Importance:
    """Random scores with the right shapes: the random-channel ablation of pruning."""
    if isinstance(arch_or_model, ArchSpec):
        arch = arch_or_model
    else:
        from autocompress.modeling import arch_spec_of

        arch = arch_spec_of(arch_or_model)
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> torch.Tensor:
        return torch.rand(n, generator=gen)

    num_layers = arch.num_layers
    return Importance(
        arch=arch,
        ffn=[rand(la.ffn.intermediate_size) if la.ffn else None for la in arch.layers],
        heads=[rand(la.attention.num_heads) if la.attention else None for la in arch.layers],
        hidden=rand(arch.hidden_size),
        layer_cosine=rand(num_layers),
        attention_cosine=rand(num_layers),
        ffn_cosine=rand(num_layers),
        layer_loss=rand(num_layers),
        attention_loss=rand(num_layers),
        ffn_loss=rand(num_layers),
        meta={"random": True, "seed": seed},
    )


def _progress(items: list, description: str, enabled: bool):
    from autocompress.progress import Bar

    with Bar(description, len(items), enabled=enabled) as bar:
        for item in items:
            yield item
            bar.advance()


# ------------------------------------------------------------ checkpoints


class CalibrationConfig(BaseModel):
    """Which calibration data importance is computed on."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not ignored
    corpus_dir: str | None = None  # None: the default stdlib corpus (built if absent)
    seq_len: int = 256
    batch_size: int = 8
    num_batches: int = 16
    removal_batches: int = 2
    seed: int = 0
    criterion: Criterion = DEFAULT_CRITERION  # how neurons, heads and channels are ranked


def calibration_batches(tokenizer, calib: CalibrationConfig) -> list[torch.Tensor]:
    """Packed ``[batch_size, seq_len]`` batches of the corpus's calibration split."""
    from autocompress.data.corpus import ensure_corpus
    from autocompress.data.tokens import token_batches

    corpus_dir = ensure_corpus(Path(calib.corpus_dir) if calib.corpus_dir else None)
    return list(
        token_batches(
            tokenizer,
            corpus_dir,
            "calibration",
            seq_len=calib.seq_len,
            batch_size=calib.batch_size,
            max_batches=calib.num_batches,
            seed=calib.seed,
        )
    )


def importance_for_checkpoint(
    model_dir: str | Path,
    calib: CalibrationConfig | None = None,
    out_path: str | Path | None = None,
    progress: bool = True,
) -> Importance:
    """Load a model + tokenizer, score it on calibration data, optionally save the scores."""
    from autocompress.modeling import load_causal_lm

    calib = calib or CalibrationConfig()
    torch.manual_seed(calib.seed)
    model, tokenizer = load_causal_lm(model_dir)
    if tokenizer is None:
        raise AutoCompressError(
            f"{model_dir} has no tokenizer, so calibration text cannot be tokenized",
            hint="save the tokenizer into the model directory",
        )
    batches = calibration_batches(tokenizer, calib)
    importance = compute_importance(
        model, batches, removal_batches=calib.removal_batches, criterion=calib.criterion,
        progress=progress,
    )
    importance.meta.update({"model": str(model_dir), "calibration": calib.model_dump()})
    if out_path is not None:
        importance.save(out_path)
    return importance
