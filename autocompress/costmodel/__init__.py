"""Serving-engine cost models: predict latency, throughput and memory of an ArchSpec.

API (stable; other areas code against it)
=========================================

Targets and workloads::

    from autocompress.costmodel import Target, Workload, PRESETS, get_workload, CostModel

    target = Target.parse("cpu-local/hf-eager/fp32")        # or "h100-sxm/vllm/bf16", tp=2
    workload = get_workload("local-coding-cpu")               # or Workload(isl=, osl=, batch=)
    model = CostModel.for_target(target)   # fitted model if `costmodel fit` saved one,
                                           # else the analytic spec-sheet model
    # Unknown targets raise AutoCompressError listing the known ones.

One architecture (``spec`` is an ``autocompress.arch.ArchSpec`` with head_dim and
vocab_size set — ``spec.complete_from(teacher_spec)`` fills them)::

    p = model.predict(spec, workload)      # -> CostPrediction
    p.ttft_ms, p.tpot_ms, p.e2e_ms, p.throughput_tok_s, p.memory_gb,
    p.max_concurrency, p.fits, p.max_context_tokens, p.reason, p.memory (breakdown)
    p.metrics()                            # the headline dict
    model.prefill_latency(spec, workload)  # TTFT ms
    model.decode_latency(spec, workload)   # TPOT ms
    model.memory_bytes(spec, workload)     # MemoryBreakdown (bytes; .total)
    model.max_concurrency(spec, workload), model.max_context(spec, workload)

Definitions: TTFT = prefill of ``batch × isl`` tokens; TPOT = one decode step of
the whole batch at context ``isl + osl/2``; e2e = TTFT + (osl − 1)·TPOT;
throughput = 1000·batch / TPOT tokens/s; memory in GB = 1e9 bytes, per device.
**A constraint ``throughput ≥ X`` is the constraint ``TPOT ≤ 1000·batch / X`` ms**
(``workload.throughput_constraint_as_tpot_ms(X)``), which is additive.

Additive decomposition for the search (``costmodel.additive``)::

    costs = model.additive_costs(
        reference=teacher_spec,             # supplies head_dim, vocab, biases, layer count
        workload=workload,
        hidden_options=[256, 224, 192],     # H global hidden sizes
        attention_options=[AttentionSpec(num_heads=8, num_kv_heads=2), ..., None],
        ffn_options=[FFNSpec(intermediate_size=768), ..., None],
    )   # one list for all layers, or one list per layer (same length in every layer)
    costs.const[m]        # [H]        constant part (embeddings, LM head, T0, overhead)
    costs.attention[m]    # [L, Ka, H] per-layer attention option cost
    costs.ffn[m]          # [L, Kf, H] per-layer FFN option cost
    costs.activation_attention, costs.activation_ffn   # [L, K, H] GB, peak candidates
    # m in ("ttft_ms", "tpot_ms", "e2e_ms", "memory_gb"), float64 tensors

    expected = costs.expected(p_attention, p_ffn, p_hidden)   # or expected_costs(costs, ...)
    # p_attention [L, Ka], p_ffn [L, Kf], p_hidden [H]: probabilities (rows sum to 1),
    # returns {m: scalar tensor}, differentiable. For one-hot probabilities it equals
    # model.predict(costs.spec_of(a_idx, f_idx, h_idx), workload) exactly (float64
    # rounding): costs.discrete(a_idx, f_idx, h_idx) does that.

    E[cost] = Σ_h p_h·(C(h) + Σ_l Σ_k p_attn[l,k]·A[l,k,h] + Σ_l Σ_k p_ffn[l,k]·F[l,k,h]);
    memory adds the exact expectation of the largest block activation.

Measuring (``costmodel.measure``; used by fit, validate and ``verify``)::

    m = measure_model(model, workload, repeats=5, warmup=1)   # -> Measurement
    ms = measure_many([m1, m2, ...], workload, repeats=5)     # interleaved repetitions
    grid = measure_grid(models, workloads, repeats=5)         # grid[w][m], all interleaved
    m.ttft_ms.median, m.ttft_ms.spread, m.tpot_ms, m.memory_gb, m.memory_method
    m.metrics()            # medians, keyed like CostPrediction.metrics()
    m.metrics("floor")     # 10th percentiles: uncontended speed on a busy machine
    # memory on CPU = parameter bytes + peak of live tensor bytes (exact, repeatable)

Fitting and validation: ``fit.fit_cost_model(target, base_config, ...)``,
``validate.validate_cost_model(model, base_config, workloads, n, ...)``; saved
models: ``model.save(path)`` / ``CostModel.load(path)`` (JSON with ``sha256``;
``model.version`` = ``target:source:sha[:12]``). Reading configs for prediction:
``configs.load_arch(path_or_default)``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autocompress.costmodel.additive import ADDITIVE_METRICS, AdditiveCosts, expected_max
    from autocompress.costmodel.measure import (
        Measurement,
        measure_grid,
        measure_many,
        measure_model,
    )
    from autocompress.costmodel.model import (
        CostModel,
        CostPrediction,
        MemoryBreakdown,
        default_path,
    )
    from autocompress.costmodel.target import ENGINES, Target, known_targets
    from autocompress.costmodel.workload import (
        PRESETS,
        Workload,
        default_workload_for,
        get_workload,
    )

# Name -> module holding it, imported on first access: ``Target.parse`` (every usage error
# of the CLI) needs neither torch nor transformers, which ``additive`` and ``measure`` load.
# tasks/code_key.py reads this table, so a stage's key follows a name to its module.
_LAZY = {
    **dict.fromkeys(("ADDITIVE_METRICS", "AdditiveCosts", "expected_max"),
                    "autocompress.costmodel.additive"),
    **dict.fromkeys(("Measurement", "measure_grid", "measure_many", "measure_model"),
                    "autocompress.costmodel.measure"),
    **dict.fromkeys(("CostModel", "CostPrediction", "MemoryBreakdown", "default_path"),
                    "autocompress.costmodel.model"),
    **dict.fromkeys(("ENGINES", "Target", "known_targets"), "autocompress.costmodel.target"),
    **dict.fromkeys(("PRESETS", "Workload", "default_workload_for", "get_workload"),
                    "autocompress.costmodel.workload"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autocompress.costmodel' has no attribute {name!r}")


def expected_costs(costs: AdditiveCosts, p_attention, p_ffn, p_hidden):
    """``costs.expected(p_attention, p_ffn, p_hidden)`` (see the module docstring)."""
    return costs.expected(p_attention, p_ffn, p_hidden)


__all__ = [
    "ADDITIVE_METRICS",
    "ENGINES",
    "PRESETS",
    "AdditiveCosts",
    "CostModel",
    "CostPrediction",
    "Measurement",
    "MemoryBreakdown",
    "Target",
    "Workload",
    "default_path",
    "default_workload_for",
    "expected_costs",
    "expected_max",
    "get_workload",
    "known_targets",
    "measure_grid",
    "measure_many",
    "measure_model",
]
