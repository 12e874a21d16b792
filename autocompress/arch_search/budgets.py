"""Limits as cost budgets: every limit becomes ``cost_metric ≤ bound``.

The cost model's additive tables cover ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` and
``memory_gb``. Throughput is ``1000 · batch / TPOT`` tokens per second, so
``throughput ≥ X`` is the budget ``tpot_ms ≤ 1000 · batch / X`` (the tighter of
it and ``max_tpot_ms`` when both are set).

``--budget-fraction F`` sets one limit at ``F ×`` the teacher's predicted cost on
the workload's main metric (``Workload.main_metric``).
"""

from __future__ import annotations

from collections.abc import Callable

from autocompress.costmodel.workload import Workload
from autocompress.errors import AutoCompressError
from autocompress.limits import LIMIT_OF_METRIC, Limits

BUDGET_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "memory_gb")
UNITS = {"ttft_ms": "ms", "tpot_ms": "ms", "e2e_ms": "ms", "memory_gb": "GB",
         "throughput_tok_s": "tok/s"}


def budgets_from_limits(limits: Limits, workload: Workload) -> dict[str, float]:
    """``{metric: upper bound}`` over the additive metrics."""
    budgets = {m: v for m, v in limits.by_metric().items() if m in BUDGET_METRICS}
    if limits.min_throughput_tok_s is not None:
        bound = workload.throughput_constraint_as_tpot_ms(limits.min_throughput_tok_s)
        budgets["tpot_ms"] = min(bound, budgets.get("tpot_ms", bound))
    if not budgets:
        raise AutoCompressError(
            "no limit was given",
            hint="give a --limit (tpot=, ttft=, e2e=, throughput=, memory=) or "
            "--budget-fraction",
        )
    return budgets


def limits_from_fraction(fraction: float, teacher_costs: dict[str, float],
                         workload: Workload, base: Limits | None = None) -> Limits:
    """``base`` plus a limit at ``fraction ×`` the teacher's cost on the main metric.

    For throughput the limit is the teacher's throughput divided by ``fraction``
    (the same TPOT budget).
    """
    if not 0 < fraction:
        raise AutoCompressError(f"budget fraction {fraction} must be positive",
                                hint="e.g. --budget-fraction 0.5 for half the teacher's cost")
    metric = workload.main_metric
    if metric not in teacher_costs:
        raise AutoCompressError(f"workload {workload.name} has main metric {metric!r}, "
                                "which the cost model does not predict")
    value = teacher_costs[metric]
    bound = value / fraction if metric == "throughput_tok_s" else value * fraction
    update = {LIMIT_OF_METRIC[metric]: bound}
    return (base or Limits()).model_copy(update=update)


def resolve_limits(limits: Limits | None, budget_fraction: float | None,
                   teacher_costs: Callable[[], dict[str, float]], workload: Workload) -> Limits:
    """The limits a search runs under: ``limits`` plus, with ``budget_fraction``, a limit at
    that fraction of the teacher's predicted cost (``teacher_costs()``, called only then)
    on the workload's main metric. An error when that leaves no limit at all."""
    limits = limits or Limits()
    if budget_fraction is not None:
        limits = limits_from_fraction(budget_fraction, teacher_costs(), workload, limits)
    if limits.is_empty():
        raise AutoCompressError(
            "no limit was given",
            hint="give a --limit (tpot=, ttft=, e2e=, throughput=, memory=) or "
            "--budget-fraction",
        )
    return limits


def reachable_text(metric: str, smallest: float, limits: Limits, workload: Workload) -> str:
    """The smallest reachable value of a budget, in the terms of the user's limits."""
    parts = [f"{metric} >= {smallest:.4g} {UNITS[metric]}"]
    if metric == "tpot_ms" and limits.min_throughput_tok_s is not None and smallest > 0:
        best = 1000.0 * workload.batch / smallest
        parts.append(f"throughput <= {best:.4g} tok/s (asked >= {limits.min_throughput_tok_s:g})")
    return ", ".join(parts)
