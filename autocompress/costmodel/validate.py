"""Validating a cost model against measurements of sampled architectures.

Sample ``n`` heterogeneous ArchSpecs from the default search space around the
teacher (different seeds from the fitting probes), build them with random
weights, measure them with the harness (repetitions interleaved), predict them
with the cost model, and score per metric:

- MAPE (mean absolute percentage error, %) of the prediction vs the median;
- Kendall τ between predicted and measured values (does the model rank
  candidates the way the hardware does? that is what the search needs);
- the spread of the measurements (median relative IQR), which bounds how small
  the MAPE can be on a noisy machine.

Timings are scored against their median, or, with ``statistic="floor"``,
against their 10th percentile, which estimates the uncontended speed when
other jobs share the CPU (the JSON holds both).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field
from scipy.stats import kendalltau

from autocompress.arch import ArchSpec
from autocompress.atomic import atomic_path
from autocompress.costmodel.measure import (
    STATISTICS,
    Measurement,
    timing_reference,
)
from autocompress.costmodel.model import CostModel
from autocompress.costmodel.probes import ProbeSampler, timing_reference_spec
from autocompress.costmodel.workload import Workload

SCORED = {"ttft": "ttft_ms", "tpot": "tpot_ms", "memory": "memory_gb"}


class ValidationSample(BaseModel):
    spec: dict[str, Any]
    workload: str
    params: int
    measured: dict[str, float] = Field(description="By the report's statistic.")
    measured_by_statistic: dict[str, dict[str, float]]
    predicted: dict[str, float]
    spread: dict[str, float]
    absolute_spread: dict[str, float] = Field(
        default_factory=dict, description="Paired timing: the spread of the model's own "
        "absolute times, which pairing removes.")
    measured_at_fit_scale: dict[str, float] | None = Field(
        default=None, description="Paired timing: the ratios scaled by the fit's reference "
        "times instead of this session's (what verify reports).")


class ValidationReport(BaseModel):
    """The JSON of ``costmodel validate`` (keys ``n``, ``mape``, ``kendall_tau``, ``samples``)."""

    n: int
    target: str
    cost_model: str
    workloads: list[str]
    statistic: str
    timing: str = "absolute"
    reference_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Paired timing, per workload: the reference's "
        "times the ratios were scaled by in this session.")
    reference_drift: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Per workload: this session's reference times "
        "relative to the fit's, minus 1 (how much the machine moved between the two).")
    at_fit_scale: dict[str, dict[str, float]] | None = Field(
        default=None, description="Pooled scores against measured_at_fit_scale: the "
        "error of the relative costs alone, without the session-to-session drift.")
    repeats: int
    warmup: int
    seconds: float
    mape: dict[str, float]
    kendall_tau: dict[str, float]
    spread: dict[str, float]
    per_workload: dict[str, dict[str, dict[str, float]]]
    by_statistic: dict[str, dict[str, dict[str, float]]] = Field(
        description="Pooled scores against each measured statistic (median, floor)."
    )
    samples: list[ValidationSample]

    def table(self) -> list[tuple[str, float, float, float]]:
        """(metric, MAPE %, Kendall τ, median spread) rows."""
        return [(m, self.mape[m], self.kendall_tau[m], self.spread[m]) for m in SCORED]


def sample_specs(reference: ArchSpec, n: int, seed: int = 1000,
                 target: Any = None) -> list[ArchSpec]:
    """``n`` distinct heterogeneous specs from the default space (``target``'s search space
    when given: ``ProbeSampler.for_target``), spread over depths."""
    sampler = ProbeSampler.for_target(reference, target) if target is not None \
        else ProbeSampler.around(reference)
    return sampler.sample_spread(n, random.Random(seed))


def score(
    samples: Sequence[ValidationSample], statistic: str | None = None
) -> dict[str, dict[str, float]]:
    """MAPE, Kendall τ and median spread per metric over ``samples`` (measured by
    ``statistic``, default: the samples' own ``measured``)."""
    out: dict[str, dict[str, float]] = {"mape": {}, "kendall_tau": {}, "spread": {}}
    for short, key in SCORED.items():
        measured = np.array([
            (s.measured_by_statistic[statistic] if statistic else s.measured)[key]
            for s in samples
        ])
        predicted = np.array([s.predicted[key] for s in samples])
        out["mape"][short] = float(np.mean(np.abs(predicted - measured) / measured) * 100)
        tau = kendalltau(predicted, measured).statistic if len(samples) > 1 else float("nan")
        out["kendall_tau"][short] = float(tau)
        out["spread"][short] = float(statistics.median(s.spread[key] for s in samples))
    return out


def validate_cost_model(
    model: CostModel,
    base_config: Any,
    workloads: Sequence[Workload],
    n: int = 30,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 1000,
    progress: bool = True,
    statistic: str = "median",
) -> ValidationReport:
    """Measure ``n`` sampled architectures on every workload and score the model.

    All (architecture, workload) pairs are interleaved in every round. Scores use
    ``statistic`` (median, or floor on a busy machine); ``by_statistic`` has both.
    Timing is paired with the model's reference when it was fitted paired, and with
    the base architecture when it has no fit (the analytic model).
    """
    from autocompress.modeling import arch_spec_of, build_model

    if statistic not in STATISTICS:  # fail before minutes of measuring
        raise ValueError(f"statistic must be one of {STATISTICS}")
    start = time.perf_counter()
    base = arch_spec_of(base_config)
    specs = sample_specs(base, n, seed, model.target)
    models = [build_model(spec, base_config, seed=seed + i) for i, spec in enumerate(specs)]
    from autocompress.costmodel.fit import measure_on_target

    grid = measure_on_target(model.target, models, workloads, repeats=repeats, warmup=warmup,
                             seed=seed, progress=progress, description="validating",
                             reference=validation_reference(model, base))
    return score_measurements(model, specs, workloads, grid, statistic,
                              seconds=time.perf_counter() - start)


def validation_reference(model: CostModel, base: ArchSpec) -> torch.nn.Module | None:
    """The paired-timing reference to validate ``model`` with (None: absolute timing)."""
    fit = model.fit
    if not model.target.paired_timing or (fit is not None and fit.timing != "paired"):
        return None
    if fit is not None and fit.reference_spec:
        return timing_reference(fit.reference_spec)
    return timing_reference(timing_reference_spec(base))


def score_measurements(
    model: CostModel,
    specs: Sequence[ArchSpec],
    workloads: Sequence[Workload],
    grid: Sequence[Sequence[Measurement]],
    statistic: str = "median",
    seconds: float = 0.0,
) -> ValidationReport:
    """Score ``model`` on measurements ``grid[w][m]`` of ``specs`` (see the module doc)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}")
    samples: list[ValidationSample] = []
    per_workload = {}
    for workload, results in zip(workloads, grid, strict=True):
        these = []
        for spec, result in zip(specs, results, strict=True):
            prediction = model.predict(spec, workload)
            by_statistic = {name: result.metrics(name) for name in STATISTICS}
            these.append(
                ValidationSample(
                    spec=spec.to_dict(),
                    workload=workload.name,
                    params=spec.num_params(),
                    measured=by_statistic[statistic],
                    measured_by_statistic=by_statistic,
                    predicted=prediction.metrics(),
                    spread={"ttft_ms": result.ttft_ms.spread, "tpot_ms": result.tpot_ms.spread,
                            "memory_gb": 0.0},
                    absolute_spread=_absolute_spread(result),
                    measured_at_fit_scale=_at_fit_scale(model, result, statistic),
                )
            )
        per_workload[workload.name] = score(these)
        samples += these
    pooled = score(samples)
    first = grid[0][0]
    reference_ms = {w.name: row[0].paired.scale_ms for w, row in zip(workloads, grid,
                                                                     strict=True)
                    if row[0].paired is not None}
    fitted_ms = model.fit.reference_ms if model.fit is not None else {}
    return ValidationReport(
        n=len(specs),
        target=model.target.name,
        cost_model=model.version,
        workloads=[w.name for w in workloads],
        statistic=statistic,
        timing=first.timing,
        reference_ms=reference_ms,
        reference_drift={
            name: {k: v / fitted_ms[name][k] - 1 for k, v in now.items()
                   if fitted_ms[name].get(k)}
            for name, now in reference_ms.items() if name in fitted_ms
        },
        repeats=first.repeats,
        warmup=first.warmup,
        seconds=seconds,
        mape=pooled["mape"],
        kendall_tau=pooled["kendall_tau"],
        spread=pooled["spread"],
        per_workload=per_workload,
        by_statistic={name: score(samples, name) for name in STATISTICS},
        at_fit_scale=_score_at_fit_scale(samples),
        samples=samples,
    )


def _at_fit_scale(model: CostModel, result: Measurement, statistic: str):
    scale = model.fit.reference_scale(result.workload) if model.fit is not None else None
    if result.paired is None or scale is None:
        return None
    return result.with_scale(scale).metrics(statistic)


def _score_at_fit_scale(samples: list[ValidationSample]) -> dict | None:
    if not samples or any(s.measured_at_fit_scale is None for s in samples):
        return None
    return score([s.model_copy(update={"measured": s.measured_at_fit_scale}) for s in samples])


def _absolute_spread(result: Measurement) -> dict[str, float]:
    if result.paired is None:
        return {}
    return {"ttft_ms": result.paired.absolute_ttft_ms.spread,
            "tpot_ms": result.paired.absolute_tpot_ms.spread}


def plot_validation(report: ValidationReport, path: str | Path) -> Path:
    """Predicted-vs-measured scatter per metric (y = x line, IQR bars) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SCORED), figsize=(4.2 * len(SCORED), 4.2))
    for ax, (short, key) in zip(axes, SCORED.items(), strict=True):
        for name in report.workloads:
            rows = [s for s in report.samples if s.workload == name]
            measured = [s.measured[key] for s in rows]
            predicted = [s.predicted[key] for s in rows]
            errors = [s.spread[key] * s.measured[key] / 2 for s in rows]
            ax.errorbar(measured, predicted, xerr=errors, fmt="o", ms=4, alpha=0.75,
                        label=name)
        values = [v for s in report.samples for v in (s.measured[key], s.predicted[key])]
        lo, hi = min(values) * 0.9, max(values) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {key}")
        ax.set_ylabel(f"predicted {key}")
        ax.set_title(f"{short}: MAPE {report.mape[short]:.1f}%, "
                     f"τ {report.kendall_tau[short]:.2f}")
        ax.legend(fontsize=7)
    fig.suptitle(f"{report.target} — {report.cost_model} (n={report.n})", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
