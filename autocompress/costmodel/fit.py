"""Fitting a cost model to measurements of probe architectures on the local target.

1. Build a designed set of probe architectures (``ProbeSampler.probe_specs``:
   the corners of the space + random heterogeneous samples) with random weights.
2. Measure each on every fitting workload with the harness (``measure``),
   repetitions interleaved across probes.
3. Timing (per phase): non-negative least squares (``scipy.optimize.nnls``) of
   the measured median on the summed block + constant features, each row
   divided by its measurement so the fit minimises *relative* error (what MAPE
   scores). Columns are rescaled for conditioning and the scale undone after.
4. Memory: weights and the KV cache are exact; the peak is the largest of
   per-block candidates (cache alive at that moment + fitted temporaries, see
   ``CostModel.peak_bytes``). That max is fitted by alternating: pick each row's
   largest candidate under the current coefficients, solve the NNLS, repeat
   until the picks stop changing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from scipy.optimize import nnls

from autocompress.arch import ArchSpec
from autocompress.costmodel.blocks import (
    activation_const_features,
    activation_features,
    block_shape,
    decode_activation_features,
    decode_const_features,
    decode_features,
    kv_bytes,
    prefill_const_features,
    prefill_features,
)
from autocompress.costmodel.laws import ActivationLaw, LinearLaw
from autocompress.costmodel.measure import (
    STATISTICS,
    PairedTiming,
    measure_grid,
    timing_reference,
)
from autocompress.costmodel.model import CostModel, FitReport, now_iso
from autocompress.costmodel.probes import ProbeSampler, timing_reference_spec
from autocompress.costmodel.target import Target
from autocompress.costmodel.workload import PRESETS, Workload
from autocompress.errors import AutoCompressError
from autocompress.hardware import RobustStat

CPU_FIT_WORKLOADS = ("local-coding-cpu", "datacenter-cpu", "interactive-cpu")


class ProbeRow(BaseModel):
    """One probe measured on one workload."""

    spec: dict[str, Any]
    workload: Workload
    ttft_ms: RobustStat
    tpot_ms: RobustStat
    tpot_steps_ms: RobustStat | None = None
    memory_bytes: float
    paired: PairedTiming | None = None
    threads: int | None = None  # what the timing computed on (vLLM picks its own cores)

    def timing(self, statistic: str) -> tuple[float, float]:
        """(TTFT, TPOT) in ms by ``statistic`` (see ``Measurement.metrics``)."""
        floor = statistic == "floor"
        ttft = self.ttft_ms.p10 if floor and self.ttft_ms.p10 is not None else self.ttft_ms.median
        steps = self.tpot_steps_ms or self.tpot_ms
        tpot = steps.p10 if floor and steps.p10 is not None else self.tpot_ms.median
        return ttft, tpot


# ------------------------------------------------------------ measuring


def measure_probes(
    specs: Sequence[ArchSpec],
    base_config: Any,
    workloads: Sequence[Workload],
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = True,
    dtype: torch.dtype = torch.float32,
    reference: torch.nn.Module | None = None,
    target: Target | None = None,
) -> list[ProbeRow]:
    """Build every probe (random weights, ``dtype``) and measure it on every workload
    (paired with ``reference`` when given; in llama.cpp when ``target`` is its)."""
    from autocompress.modeling import build_model

    models = [
        build_model(spec, base_config, seed=seed + i, dtype=dtype)
        for i, spec in enumerate(specs)
    ]
    grid = measure_on_target(target, models, workloads, repeats=repeats, warmup=warmup,
                             seed=seed, progress=progress, description="measuring probes",
                             reference=reference)
    return rows_from_grid(specs, workloads, grid)


def measure_on_target(target: Target | None, models, workloads, **kwargs):
    """``measure_grid`` (PyTorch) or, for a llama.cpp or vLLM target, the same grid in
    that engine."""
    engine = target.engine.name if target is not None else None
    if engine == "llama.cpp":
        from autocompress.costmodel.measure_llamacpp import measure_models_llamacpp

        return measure_models_llamacpp(models, workloads, target.dtype, target.threads,
                                       **kwargs)
    if engine == "vllm":
        from autocompress.costmodel.measure_vllm import measure_models_vllm

        return measure_models_vllm(models, workloads, target.dtype, **kwargs)
    return measure_grid(models, workloads, **kwargs)


def rows_from_grid(
    specs: Sequence[ArchSpec], workloads: Sequence[Workload], grid: Sequence[Sequence[Any]]
) -> list[ProbeRow]:
    """ProbeRows from ``measure_grid`` results (``grid[w][m]``)."""
    return [
        ProbeRow(
            spec=spec.to_dict(),
            workload=workload,
            ttft_ms=result.ttft_ms,
            tpot_ms=result.tpot_ms,
            tpot_steps_ms=result.tpot_steps_ms,
            memory_bytes=result.memory_bytes,
            paired=result.paired,
            threads=result.threads,
        )
        for workload, results in zip(workloads, grid, strict=True)
        for spec, result in zip(specs, results, strict=True)
    ]


# -------------------------------------------------------------- features


def _sum(dicts: Sequence[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for features in dicts:
        for name, value in features.items():
            total[name] = total.get(name, 0.0) + value
    return total


def timing_features(model: CostModel, spec: ArchSpec, workload: Workload, phase: str):
    """Features of a whole model for one phase (blocks summed + constant part)."""
    env = model.env(spec, workload)
    h = spec.hidden_size
    block_fn = prefill_features if phase == "prefill" else decode_features
    const_fn = prefill_const_features if phase == "prefill" else decode_const_features
    blocks = [block_fn(s, h, env) for s in model._blocks(spec, env)]
    return _sum([const_fn(h, env), *blocks])


# ---------------------------------------------------------------- solving


def relative_nnls(rows: list[dict[str, float]], targets: np.ndarray,
                  scale: np.ndarray | None = None) -> dict[str, float]:
    """θ ≥ 0 minimising Σ ((Σ_k θ_k·x_k − y) / s)², s = ``scale`` (default y)."""
    names = sorted({name for row in rows for name in row})
    x = np.array([[row.get(name, 0.0) for name in names] for row in rows], dtype=np.float64)
    scale = targets if scale is None else scale
    a = x / scale[:, None]
    b = targets / scale
    norms = np.abs(a).max(axis=0)
    keep = norms > 0
    theta = np.zeros(len(names))
    solution, _ = nnls(a[:, keep] / norms[keep], b, maxiter=50 * len(names))
    theta[keep] = solution / norms[keep]
    return {name: float(value) for name, value in zip(names, theta, strict=True)}


def static_memory_candidates(model: CostModel, spec: ArchSpec, workload: Workload):
    """Like ``memory_candidates`` for engines that allocate the KV cache up front
    (llama.cpp): fixed = weights + overhead + the whole cache; candidates are each
    block's temporaries at the engine's activation shape (no cache inside)."""
    env = model.env(spec, workload)
    h = spec.hidden_size
    act_env = model._activation_env(env)
    const = model.const_memory(h, env)
    fixed = const["weights"] + const["overhead"]
    pre_const = activation_const_features(h, act_env, act_env.tokens)
    candidates = []
    last = len(spec.layers) - 1
    for index, layer in enumerate(spec.layers):
        for option in (layer.attention, layer.ffn):
            shape = block_shape(option, h, env, index == last)
            if shape is None:
                continue
            block = model.block_memory(shape, h, env)
            fixed += block["weights"] + block["kv_final"]
            candidates.append((0.0, _merge(pre_const, activation_features(shape, h, act_env))))
    return fixed, candidates


def memory_candidates(model: CostModel, spec: ArchSpec, workload: Workload):
    """Fixed bytes (weights + engine overhead) and the activation-peak candidates
    ``(exact bytes, features)``.

    Mirrors ``CostModel.peak_bytes`` under a dynamic cache: the exact part is the
    KV cache alive at that moment, the features are the fitted temporaries.
    """
    env = model.env(spec, workload)
    h = spec.hidden_size
    const = model.const_memory(h, env)
    weights = const["weights"] + const["overhead"]
    pre_const = activation_const_features(h, env, env.tokens)
    dec_const = activation_const_features(h, env, env.batch)
    shapes = [(block_shape(layer.attention, h, env), block_shape(layer.ffn, h, env))
              for layer in spec.layers]
    final = sum(kv_bytes(att, env, env.final_context) for att, _ in shapes)
    prefix, candidates = 0.0, []
    for att, ffn in shapes:
        for shape in (att, ffn):
            if shape is not None:
                weights += shape.params * env.bytes_weight
        if att is not None:
            prefix += kv_bytes(att, env, env.isl)
            candidates.append((prefix, _merge(pre_const, activation_features(att, h, env))))
            candidates.append((final, _merge(dec_const, decode_activation_features(att, env))))
        if ffn is not None:
            candidates.append((prefix, _merge(pre_const, activation_features(ffn, h, env))))
    return weights, candidates


def fit_activation(
    rows: list[tuple[float, float, list[tuple[float, dict[str, float]]]]],
    start: ActivationLaw,
    max_iter: int = 30,
) -> ActivationLaw:
    """Fit ``memory − fixed ≈ max_c (exact_c + α·features_c)`` with α ≥ 0.

    ``rows``: ``(measured bytes, fixed bytes, candidates)``. Alternates between
    picking each row's largest candidate under the current α and solving the
    non-negative least squares for the picked candidates (relative to the
    measured total), until the picks stop changing.
    """
    coefficients = dict(start.coefficients)
    measured = np.array([m for m, _, _ in rows])
    chosen: list[int] | None = None
    for _ in range(max_iter):
        picks = [
            int(np.argmax([exact + _dot(coefficients, feats) for exact, feats in cands]))
            for _, _, cands in rows
        ]
        if picks == chosen:
            break
        chosen = picks
        residual = np.array([m - w - cands[p][0]
                             for (m, w, cands), p in zip(rows, picks, strict=True)])
        features = [cands[p][1] for (_, _, cands), p in zip(rows, picks, strict=True)]
        coefficients = relative_nnls(features, residual, measured)
    names = set(start.coefficients) | set(coefficients)
    return ActivationLaw(coefficients={n: coefficients.get(n, 0.0) for n in sorted(names)})


def _dot(coefficients: dict[str, float], features: dict[str, float]) -> float:
    return sum(coefficients.get(k, 0.0) * v for k, v in features.items())


def _merge(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {**a, **{k: a.get(k, 0.0) + v for k, v in b.items()}}


def fit_from_rows(
    target: Target, rows: Sequence[ProbeRow], statistic: str = "median"
) -> CostModel:
    """A fitted ``CostModel`` of ``target`` from measured probe rows."""
    if len(rows) < 4:
        raise AutoCompressError("too few probe measurements to fit a cost model",
                                hint="use at least 4 probes")
    if statistic not in STATISTICS:
        raise AutoCompressError(f"unknown statistic {statistic!r}",
                                hint=f"use one of {', '.join(STATISTICS)}")
    start = CostModel.analytic(target)
    pairs = [(ArchSpec.model_validate(row.spec), row.workload) for row in rows]
    ttft = np.array([row.timing(statistic)[0] for row in rows])
    tpot = np.array([row.timing(statistic)[1] for row in rows])
    timing = LinearLaw(
        prefill=relative_nnls([timing_features(start, s, w, "prefill") for s, w in pairs], ttft),
        decode=relative_nnls([timing_features(start, s, w, "decode") for s, w in pairs], tpot),
    )
    candidates = memory_candidates if start.dynamic_cache else static_memory_candidates
    memory_rows = [
        (row.memory_bytes, *candidates(start, s, w))
        for row, (s, w) in zip(rows, pairs, strict=True)
    ]
    activation = fit_activation(memory_rows, start.activation)
    return CostModel(target=target, timing=timing, activation=activation)


def training_mape(
    model: CostModel, rows: Sequence[ProbeRow], statistic: str = "median"
) -> dict[str, float]:
    """Mean absolute percentage error of ``model`` on the probes it was fitted to."""
    errors: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "memory_gb": []}
    for row in rows:
        spec = ArchSpec.model_validate(row.spec)
        ttft, tpot = row.timing(statistic)
        errors["ttft_ms"].append(_ape(model.prefill_latency(spec, row.workload), ttft))
        errors["tpot_ms"].append(_ape(model.decode_latency(spec, row.workload), tpot))
        errors["memory_gb"].append(_ape(model.memory_bytes(spec, row.workload).total,
                                        row.memory_bytes))
    return {metric: float(np.mean(values)) for metric, values in errors.items()}


def reference_times(rows: Sequence[ProbeRow]) -> dict[str, dict[str, float]]:
    """Per workload, the paired-timing reference's times (ms) over the fit, with the
    workload's shape ({} when timing was absolute): ``verify`` scales ratios by them."""
    return {
        row.workload.name: {**row.paired.scale_ms, "batch": row.workload.batch,
                            "isl": row.workload.isl, "osl": row.workload.osl}
        for row in rows if row.paired is not None
    }


def _ape(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured * 100.0


def fit_cost_model(
    target: Target,
    base_config: Any,
    workloads: Sequence[Workload] | None = None,
    n_probes: int = 20,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = True,
    statistic: str = "median",
    paired: bool = True,
) -> tuple[CostModel, list[ProbeRow]]:
    """Measure probes on ``target`` (must be measurable here) and fit a cost model.

    ``statistic``: fit the median timings (default) or their floor (10th
    percentile; estimates the uncontended speed on a busy machine).
    ``paired``: time every probe in lockstep with the base architecture (random
    weights; its first layers for a deep one, ``probes.timing_reference_spec``), the
    reference, which the saved model records (``costmodel.measure``). A target that
    cannot pair (vLLM: ``Target.paired_timing``) is timed absolutely whatever it says.
    """
    if not target.measurable:
        raise AutoCompressError(
            f"target {target.name} cannot be measured on this machine",
            hint="fit cpu-local/hf-eager, cpu-local/llama.cpp or cpu-local/vllm; GPU targets "
            "use the analytic (spec-sheet) model",
        )
    from autocompress.modeling import arch_spec_of

    workloads = list(workloads or [PRESETS[name] for name in CPU_FIT_WORKLOADS])
    start = time.perf_counter()
    base_spec = arch_spec_of(base_config)
    space = ProbeSampler.for_target(base_spec, target)
    specs = space.probe_specs(n_probes, seed=seed)
    dtype = torch.bfloat16 if target.dtype == "bf16" else torch.float32
    paired = paired and target.paired_timing
    reference_spec = timing_reference_spec(base_spec) if paired else None
    reference = timing_reference(reference_spec, dtype) if reference_spec else None
    rows = measure_probes(specs, base_config, workloads, repeats, warmup, seed, progress, dtype,
                          reference, target)
    model = fit_from_rows(target, rows, statistic)
    report = fit_report(model, rows, statistic, n_probes=len(specs), workloads=workloads,
                        seconds=time.perf_counter() - start,
                        reference_spec=reference_spec)
    if target.engine.name == "llama.cpp":
        report.threads = target.threads
    return model.model_copy(update={"fit": report}), rows


def fit_report(model: CostModel, rows: Sequence[ProbeRow], statistic: str, n_probes: int,
               workloads: Sequence[Workload], seconds: float,
               reference_spec: ArchSpec | None) -> FitReport:
    """How ``model`` was fitted to ``rows``: ``reference_spec`` is the paired-timing
    reference they were measured with (None: absolute timing)."""
    return FitReport(
        statistic=statistic,
        timing="absolute" if reference_spec is None else "paired",
        reference_spec=None if reference_spec is None else reference_spec.to_dict(),
        reference_ms=reference_times(rows),
        created=now_iso(),
        seconds=seconds,
        threads=rows[0].threads if rows and rows[0].threads else torch.get_num_threads(),
        n_probes=n_probes,
        n_rows=len(rows),
        workloads=[w.name for w in workloads],
        train_mape=training_mape(model, rows, statistic),
        median_spread={
            "ttft_ms": float(np.median([r.ttft_ms.spread for r in rows])),
            "tpot_ms": float(np.median([r.tpot_ms.spread for r in rows])),
        },
    )
