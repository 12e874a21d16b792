"""The ``sweep`` flow: several budgets, presets or methods → one compression each → a Pareto set.

Each entry of ``runs`` overrides parameters of ``compress`` (``limits``,
``budget_fraction``, ``workload``, ``method``, ...). Every run is a ``compress``
subflow, so each finished stage is cached individually: a sweep that shares the
teacher, corpus, cost model and importance computes them once. A run that fails
(e.g. a method finds no architecture within the limits) is recorded with its
error and the sweep goes on. The result lists every run's outputs (artifact
references), scores and measured costs and marks the Pareto-optimal ones (no
other run is at least as good on every axis and better on one). ``autocompress
bench compare`` (``bench/compare.py``) is this flow over presets × budgets × methods.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from pydantic import BaseModel, Field

from flows.common import new_report, tracked_flow
from flows.compress import compress


class SweepPoint(BaseModel):
    """One compression run of the sweep, reduced to the axes of the trade-off."""

    label: str
    overrides: dict[str, Any]
    outputs: dict[str, Any] = Field(default_factory=dict, description="compress's outputs.")
    steps: list[dict[str, Any]] = Field(default_factory=list, description="Step timings.")
    error: str | None = Field(None, description="Why the run failed (then no outputs).")
    registered: str | None = None
    score: float | None = None
    costs: dict[str, float] = Field(default_factory=dict)
    pareto: bool = False
    note: str | None = None


class SweepReport(BaseModel):
    points: list[SweepPoint]
    score_metric: str
    cost_metrics: list[str]
    mlflow_run_id: str | None = None
    wall_s: float = 0.0


def pareto_front(points: list[SweepPoint], cost_metrics: list[str]) -> list[SweepPoint]:
    """Mark points not dominated by another (higher score, lower costs is better)."""
    usable = [p for p in points
              if p.score is not None and all(m in p.costs for m in cost_metrics)]

    def dominates(a: SweepPoint, b: SweepPoint) -> bool:
        axes_a = [a.score] + [-a.costs[m] for m in cost_metrics]
        axes_b = [b.score] + [-b.costs[m] for m in cost_metrics]
        return all(x >= y for x, y in zip(axes_a, axes_b, strict=True)) and axes_a != axes_b

    for point in usable:
        point.pareto = not any(dominates(other, point) for other in usable if other is not point)
    return [p for p in usable if p.pareto]


def _point(label: str, overrides: dict[str, Any], report, score_metric: str,
           cost_metrics: list[str]) -> SweepPoint:
    outputs = report.outputs
    evaluation = outputs.get("evaluation")
    verification = outputs.get("verification")
    registered = outputs.get("registered")
    point = SweepPoint(label=label, overrides=overrides, outputs=dict(outputs),
                       steps=[s.model_dump() for s in report.steps])
    if evaluation is not None:
        point.score = evaluation.metrics.get(score_metric)
    if verification is not None:
        point.costs = {m: v for m, v in verification.metrics.items() if m in cost_metrics}
    if registered is not None:
        point.registered = f"{registered.name}@{registered.version}"
    if point.score is None:
        point.note = "; ".join(report.notes) or "no evaluation produced"
    return point


@flow(name="sweep")
def sweep(
    runs: list[dict[str, Any]],
    base: dict[str, Any] | None = None,
    score_metric: str = "mc_mean",
    cost_metrics: list[str] | None = None,
    experiment: str = "autocompress",
    store: str | None = None,
) -> SweepReport:
    """Run ``compress`` once per entry of ``runs`` (each merged over ``base``).

    Args:
        runs: parameter overrides per run, e.g. ``[{"limits": {"max_tpot_ms": 4}},
            {"limits": {"max_tpot_ms": 3}}]``; an optional ``label`` key names the run.
        base: parameters shared by all runs (teacher, target, workload...).
        score_metric: evaluation metric to maximise (``mc_mean``, ``next_token_acc``...).
        cost_metrics: measured metrics to minimise (default ``tpot_ms``, ``memory_gb``).
    """
    started = time.perf_counter()
    cost_metrics = cost_metrics or ["tpot_ms", "memory_gb"]
    params = {"runs": runs, "base": base or {}, "score_metric": score_metric,
              "cost_metrics": cost_metrics}
    with tracked_flow("sweep", params, experiment, store) as run:
        new_report("sweep", run)
        points = []
        for i, entry in enumerate(runs):
            overrides = {k: v for k, v in entry.items() if k != "label"}
            label = str(entry.get("label", f"run{i}"))
            merged = {"experiment": experiment, "store": store, **(base or {}), **overrides}
            state = compress.with_options(flow_run_name=f"sweep-{label}")(
                **merged, return_state=True)
            if state.is_failed():
                error = state.result(raise_on_failure=False)
                points.append(SweepPoint(label=label, overrides=overrides,
                                         error=getattr(error, "message", None) or str(error)))
                continue
            points.append(_point(label, overrides, state.result(), score_metric, cost_metrics))
        front = pareto_front(points, cost_metrics)
        tracker = run.tracker()
        if tracker is not None and run.parent_run_id:
            tracker.log_json(run.parent_run_id, "sweep.json",
                             [p.model_dump(mode="json") for p in points])
            tracker.log_metrics(run.parent_run_id, {"sweep.pareto_points": len(front),
                                                    "sweep.runs": len(points)})
        return SweepReport(points=points, score_metric=score_metric, cost_metrics=cost_metrics,
                           mlflow_run_id=run.parent_run_id, wall_s=time.perf_counter() - started)
