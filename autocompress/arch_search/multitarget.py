"""One architecture for several targets at once (``autocompress run --target A --target B``).

Each target brings its own cost model, workload and limits. The search treats the
limits of every target as constraints of one problem: a budget ``metric@target``
per limit, so the DNAS keeps one Lagrange multiplier per target and metric (a
target whose limit binds pushes; one with slack does not), and repair meets every
budget of every target exactly under that target's cost tables. The final pick is the
single-target search's (``run.FinalPick``: a short list of repaired candidates, each
given the baseline's short distillation, lowest KL wins), each candidate repaired under
every target's tables. An architecture is
feasible iff it meets every target's limits (``meets_all``). The measured loop
times the pick on every target this machine can time and re-aims the budgets of
the targets it missed, each by its own cost model's error.

Memory limits are refused with several targets: the activation peak is not a sum
over blocks and the joint tables carry latencies only (search one target with the
memory limit instead).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from autocompress.arch import ArchSpec
from autocompress.arch_search.budgets import budgets_from_limits, resolve_limits
from autocompress.arch_search.discretize import smallest_reachable
from autocompress.arch_search.dnas import DNAS
from autocompress.arch_search.final_pick import SAFETY, FinalPick, Repairs
from autocompress.arch_search.measured import TIMING_METRICS, measured_round
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits

SEP = "@"


def joint_metric(metric: str, target: str) -> str:
    return f"{metric}{SEP}{target}"


def split_metric(name: str) -> tuple[str, str]:
    metric, _, target = name.partition(SEP)
    return metric, target


@dataclass
class TargetLimits:
    """One target of a joint search: its cost model, workload, cost tables and limits."""

    name: str
    cost_model: Any
    workload: Any
    costs: Any
    limits: Limits

    def budgets(self) -> dict[str, float]:
        budgets = budgets_from_limits(self.limits, self.workload)
        if "memory_gb" in budgets:
            raise AutoCompressError(
                f"a memory limit with several targets ({self.name}) is not supported",
                hint="search that target alone with its memory limit, or drop the memory limit")
        return budgets

    def check(self, spec: ArchSpec) -> tuple[dict[str, float], list[Any]]:
        """Predicted costs of ``spec`` on this target and its limit checks."""
        predicted = self.cost_model.predict(spec, self.workload).metrics()
        return predicted, self.limits.check(predicted)


def target_limits(ctx, target: str, cost_model, workload, limits: Limits | None,
                  budget_fraction: float | None) -> TargetLimits:
    """``target``'s limits on ``ctx``'s space: ``limits`` plus ``budget_fraction`` of the
    teacher's cost predicted by ``cost_model``."""
    costs = ctx.space.cost_tables(cost_model, workload)

    def teacher_costs() -> dict[str, float]:
        return cost_model.predict(ctx.space.teacher, workload).metrics()

    resolved = resolve_limits(limits, budget_fraction, teacher_costs, workload)
    return TargetLimits(target, cost_model, workload, costs, resolved)


class JointCosts:
    """Several targets' ``AdditiveCosts`` as one table set keyed ``metric@target``.

    It offers what the DNAS and repair read (``const``, ``attention``, ``ffn``,
    ``num_layers``, ``expected``, ``discrete``) for the latency metrics.
    """

    def __init__(self, targets: list[TargetLimits]):
        self.targets = {t.name: t for t in targets}
        self.const, self.attention, self.ffn = {}, {}, {}
        for t in targets:
            for m in TIMING_METRICS:
                key = joint_metric(m, t.name)
                self.const[key] = t.costs.const[m]
                self.attention[key] = t.costs.attention[m]
                self.ffn[key] = t.costs.ffn[m]
        self.num_layers = targets[0].costs.num_layers

    def expected(self, p_attention, p_ffn, p_hidden) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in self.targets.items():
            for m, value in t.costs.expected(p_attention, p_ffn, p_hidden).items():
                out[joint_metric(m, name)] = value
        return out

    def discrete(self, attention_index, ffn_index, hidden_index) -> dict[str, float]:
        out = {}
        for name, t in self.targets.items():
            for m, value in t.costs.discrete(attention_index, ffn_index, hidden_index).items():
                out[joint_metric(m, name)] = value
        return out


def joint_budgets(targets: list[TargetLimits]) -> dict[str, float]:
    return {joint_metric(m, t.name): b for t in targets for m, b in t.budgets().items()}


def meets_all(spec: ArchSpec, targets: list[TargetLimits]) -> dict[str, dict[str, Any]]:
    """Per target: predicted costs, margins and whether every limit holds."""
    out = {}
    for t in targets:
        predicted, checks = t.check(spec)
        out[t.name] = {"predicted": predicted, "limits": t.limits.model_dump(exclude_none=True),
                       "margins": {c.metric: c.margin for c in checks},
                       "meets_limits": all(c.ok for c in checks)}
    return out


def _check_names(targets: list[TargetLimits]) -> None:
    names = [t.name for t in targets]
    if len(targets) < 2:
        raise AutoCompressError("a joint search needs at least two targets",
                                hint="give --target twice or more (one target: plain search)")
    if len(set(names)) != len(names):
        raise AutoCompressError(f"a target is given twice: {names}",
                                hint="give each --target once")


def check_joint_reachable(space, costs: JointCosts, budgets: dict[str, float]) -> None:
    """An error naming, per target, the budgets no architecture of the space reaches alone."""
    smallest = smallest_reachable(space, costs, list(budgets))
    missed = [f"{m} <= {b:.4g} (smallest reachable {smallest[m]:.4g})"
              for m, b in budgets.items() if smallest[m] > b]
    if missed:
        raise AutoCompressError("no architecture in the search space meets these targets' "
                                "limits: " + "; ".join(missed),
                                hint="loosen that target's limit or --budget-fraction")


@dataclass
class JointOutcome:
    spec: ArchSpec
    budgets: dict[str, float]
    per_target: dict[str, dict[str, Any]]
    measured_rounds: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    lambdas: dict[str, float] = field(default_factory=dict)
    selection: list[dict[str, Any]] = field(default_factory=list)  # as the search's report
    evaluations: dict[str, int] = field(default_factory=dict)

    def report(self, ctx) -> dict[str, Any]:
        return {"kind": "joint-search", "teacher": ctx.teacher_dir, "budgets": self.budgets,
                "targets": self.per_target,
                "meets_limits": all(t["meets_limits"] for t in self.per_target.values()),
                "params": self.spec.num_params(),
                "teacher_params": ctx.space.teacher.num_params(),
                "final_lambda": self.lambdas, "measured_rounds": self.measured_rounds,
                "selection": self.selection, "evaluations": self.evaluations,
                "seconds": self.seconds, "arch": self.spec.to_dict()}


def run_joint_search(ctx, targets: list[TargetLimits], config, measure=None,
                     progress: bool = False) -> JointOutcome:
    """DNAS + repair under every target's limits and the single-target search's final pick
    (``final_pick.Repairs``, ``final_pick.FinalPick``), then the measured loop over the targets
    ``measure(target, spec) -> (metrics, noise)`` can time (None: trust the cost models)."""
    _check_names(targets)
    costs = JointCosts(targets)
    budgets = joint_budgets(targets)
    check_joint_reachable(ctx.space, costs, budgets)
    t0 = time.perf_counter()
    data = ctx.calibration(config.dnas.seq_len)
    result = DNAS(ctx.masked, costs, budgets, config.dnas).run(
        lambda step: data.batch_at(step, config.dnas.batch_size, config.dnas.seed))
    t1 = time.perf_counter()
    inner = {m: b * (1 - SAFETY) for m, b in budgets.items()}

    def unreachable(bounds: dict[str, float]):
        raise AutoCompressError(
            "no architecture in the search space meets every target's limits at once"
            + (" as measured" if bounds != inner else ""),
            hint="loosen the tightest target's limit, or search the targets one by one")

    # Every candidate of the final pick is repaired under the joint tables, so it meets
    # every budget of every target under that target's own cost model.
    final = FinalPick(ctx, config, progress)
    repairs = Repairs(ctx, config, costs, result, config.score_radius, progress)
    spec, rounds = joint_measured_loop(
        lambda bounds: ctx.space.spec_of(repairs.pick(bounds, final, unreachable).choice),
        targets, budgets, inner, config.measured_rounds if measure else 0, measure,
        aim=lambda bounds: ctx.space.spec_of(repairs.answer(bounds, unreachable)[0].choice))
    per_target = meets_all(spec, targets)
    if not all(t["meets_limits"] for t in per_target.values()):
        raise AutoCompressError(  # repair met every budget under the same tables: a bug
            f"internal error: the joint pick breaks a limit under predict(): {per_target}")
    total = time.perf_counter() - t0
    return JointOutcome(spec=spec, budgets=budgets, per_target=per_target,
                        measured_rounds=rounds, lambdas=result.lambdas,
                        seconds={"dnas": t1 - t0, "selection": final.seconds, "total": total},
                        selection=final.report(), evaluations=repairs.evaluations)


def joint_measured_loop(pick, targets: list[TargetLimits], budgets: dict[str, float],
                        inner: dict[str, float], rounds: int, measure, aim=None):
    """Pick, time the pick on every measurable target, re-aim the budgets it missed (each by
    its own target's error, ``measured.corrected_budgets``), at most ``rounds`` times. With
    ``aim`` (a cheap pick: repair's untrained answer) the bounds are first calibrated on it,
    as ``measured.calibrate_aim`` does for one target; its rounds come first."""
    aimed: list[dict[str, Any]] = []
    if aim is not None:
        _, aimed, inner = _joint_rounds(aim, targets, budgets, inner, rounds, measure, "aim")
    spec, history, _ = _joint_rounds(pick, targets, budgets, inner, rounds, measure, "pick")
    return spec, aimed + history


def _joint_rounds(pick, targets, budgets, inner, rounds, measure, stage):
    """Up to ``rounds`` timed picks, each re-aimed by the last's misses: the last pick, the
    rounds and the bounds a next pick would aim at."""
    spec = pick(inner)
    history: list[dict[str, Any]] = []
    measurable = [t for t in targets if t.cost_model.target.measurable]
    for _ in range(rounds if measurable else 0):
        tightened = dict(inner)
        record = {"params": spec.num_params(), "stage": stage, "targets": {}}
        for t in measurable:
            own = {split_metric(k)[0]: v for k, v in budgets.items()
                   if split_metric(k)[1] == t.name}
            own_inner = {split_metric(k)[0]: v for k, v in inner.items()
                         if split_metric(k)[1] == t.name}
            timed, fixed = measured_round(spec, t.cost_model, t.workload, own, own_inner,
                                          lambda s, t=t: measure(t, s), stage)
            record["targets"][t.name] = timed.model_dump()
            for m, v in (fixed or {}).items():
                tightened[joint_metric(m, t.name)] = v
        record["met"] = all(r["met"] for r in record["targets"].values())
        history.append(record)
        if record["met"]:
            break
        inner = tightened
        if len(history) < rounds:
            spec = pick(inner)
    return spec, history, inner
