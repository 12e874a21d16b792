"""End to end: teacher + target + workload + limits -> a searched ArchSpec.

On a ``SearchContext`` (``context``: teacher, importance, space, cost model),
``run_search`` runs the DNAS, discretizes and repairs, makes the final pick among
its candidates after the baseline's short distillation (``final_pick``) and checks
the result with ``CostModel.predict``; ``run_minitron`` picks the Minitron baseline
from the same context (same importance, same calibration data, same cost model);
``ablations`` has the greedy and random ablations. ``run_method`` /
``method_to_file`` choose one of ``METHODS``.

``search_to_file`` / ``minitron_to_file`` / ``method_to_file`` write
``arch.json`` plus a report (``<stem>.search.json``) and, for the search, the
trajectory (``<stem>.trajectory.json`` and ``.png``). Search checkpoints live in
a work directory (default ``.<stem>.search-work`` beside the output) so an
interrupted search resumes where it stopped; it is removed once the
architecture is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autocompress.arch import ArchSpec
from autocompress.arch_search.ablations import run_greedy, run_random
from autocompress.arch_search.budgets import budgets_from_limits
from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import (
    LazyBar,
    SearchContext,
    check_reachable,
    final_check,
    measured_loop,
    need_costs,
    raise_unreachable,
    shared_report,
    short_distill,
    spec_timer,
    teacher_scores,
)
from autocompress.arch_search.discretize import Discretized, repair
from autocompress.arch_search.dnas import CHECKPOINT_NAME, DNAS, DNASResult
from autocompress.arch_search.final_pick import SAFETY, FinalPick, Repairs
from autocompress.arch_search.measured import (
    MeasuredRound,
    is_untimed,
    judged_on,
    round_values,
)
from autocompress.arch_search.minitron import (
    BaselineResult,
    minitron_for_params,
    minitron_matched,
)
from autocompress.arch_search.minitron_scored import run_minitron_scored
from autocompress.arch_search.mip import run_mip
from autocompress.arch_search.space import Choice
from autocompress.arch_search.trajectory import plot_trajectory, save_trajectory
from autocompress.atomic import remove_path, write_json_atomic
from autocompress.defaults import METHODS
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.progress import Bar

# ------------------------------------------------------------------ outcomes


@dataclass
class SearchOutcome:
    spec: ArchSpec
    limits: Limits
    budgets: dict[str, float]
    prediction: Any
    checks: list[Any]
    dnas: DNASResult
    discretized: Discretized
    seconds: dict[str, float]
    measured_rounds: list[MeasuredRound] = field(default_factory=list)
    # Architectures evaluated on data: one per DNAS step, then the anchor and its
    # single-change scores (what the random ablation gets as its count).
    evaluations: dict[str, int] = field(default_factory=dict)
    selection: list[dict[str, Any]] = field(default_factory=list)
    dnas_start: Choice | None = None  # where DNAS's logits started (None: uniform)
    # The machine while the pick was timed: load, noise, what was done, a busy warning
    # (``measured.SpecTimer.summary``; None: the target is not timed here).
    timing: dict[str, Any] | None = None

    def report(self, ctx: SearchContext) -> dict[str, Any]:
        space = ctx.space
        d = self.discretized
        return {
            "kind": "search",
            **shared_report(ctx, self.spec, self.limits, self.budgets, self.prediction,
                            self.checks),
            "choice": d.choice.to_dict(),
            "anchor": d.anchor.to_dict(),  # where the winner's repair started
            "anchor_costs": d.anchor_costs,
            "dnas_answer": self.dnas.anchor_choice(space).to_dict(),  # the search side's start
            "repair_changes": d.changes,
            "scores": d.score_source,
            "scored_candidates": sum(self.evaluations.values()),
            "evaluations": self.evaluations,
            "per_hidden": d.per_hidden,
            "dnas_start": self.dnas_start.to_dict() if self.dnas_start else "uniform",
            "final_lambda": self.dnas.lambdas,
            "dnas_best": self.dnas.best,  # keep_best_every: where the anchor came from
            "search_completed": self.dnas.completed,
            "seconds": self.seconds,
            "measured_rounds": [r.model_dump() for r in self.measured_rounds],
            "timing": self.timing,
            "selection": self.selection,
            "space": space.describe(),
            "arch": self.spec.to_dict(),
        }


@dataclass
class BaselineOutcome:
    spec: ArchSpec
    result: BaselineResult
    limits: Limits | None
    prediction: Any
    checks: list[Any]
    seconds: float
    measured_rounds: list[MeasuredRound] = field(default_factory=list)

    def report(self, ctx: SearchContext) -> dict[str, Any]:
        r = self.result
        return {
            "kind": "minitron",
            "mode": r.mode,
            "teacher": ctx.teacher_dir,
            "target": ctx.cost_model.target.name if ctx.cost_model else None,
            "cost_model": ctx.cost_model.version if ctx.cost_model else None,
            "workload": ctx.workload.model_dump() if ctx.workload else None,
            "limits": self.limits.model_dump(exclude_none=True) if self.limits else {},
            "teacher_predicted": ctx.teacher_costs() if ctx.costs is not None else None,
            "param_target": r.param_target,
            "params": self.spec.num_params(),
            "teacher_params": ctx.space.teacher.num_params(),
            "predicted": self.prediction.metrics() if self.prediction else None,
            "margins": {c.metric: c.margin for c in self.checks},
            "meets_limits": all(c.ok for c in self.checks),
            "chosen": r.candidate.describe(ctx.space),
            "scored": [c.describe(ctx.space) for c in r.scored],
            "scored_candidates": len(r.scored),
            "num_candidates": r.num_candidates,
            "could_meet": r.could_meet,
            "timed": [c.describe(ctx.space) for c in r.timed],
            "seconds": self.seconds,
            "measured_rounds": [r.model_dump() for r in self.measured_rounds],
            "arch": self.spec.to_dict(),
        }


# ------------------------------------------------------------------ search


def run_search(
    ctx: SearchContext,
    limits: Limits,
    config: SearchConfig | None = None,
    work_dir: str | Path | None = None,
    progress: bool = True,
    max_steps_this_run: int | None = None,
) -> SearchOutcome | None:
    """DNAS + discretize/repair + final check. None if stopped early (resumable)."""
    config = config or SearchConfig()
    need_costs(ctx)
    budgets = check_reachable(ctx, limits)
    space, costs = ctx.space, ctx.costs

    at_teacher = teacher_scores(ctx, config, progress) if config.scores_at_teacher else None
    start = None  # uniform logits
    if config.dnas_starts_on_greedy:  # greedy's answer at the budgets DNAS is held to
        start = getattr(repair(space, costs, budgets, space.full_choice(), at_teacher),
                        "choice", None)
    data = ctx.calibration(config.dnas.seq_len)
    dnas = DNAS(ctx.masked, costs, budgets, config.dnas, start=start)
    bar = Bar("search", config.dnas.steps, progress)
    result = dnas.run(
        lambda step: data.batch_at(step, config.dnas.batch_size, config.dnas.seed),
        checkpoint_dir=work_dir, max_steps_this_run=max_steps_this_run,
        progress=lambda step, rec: bar.update(step + 1, _step_info(rec)),
    )
    bar.close()
    if not result.completed:
        return None
    t1, c1 = time.perf_counter(), time.process_time()
    inner = {m: b * (1 - SAFETY) for m, b in budgets.items()}
    final = FinalPick(ctx, config, progress, budgets=budgets)
    repairs = Repairs(ctx, config, costs, result, config.score_radius, progress, at_teacher)

    def unreachable(bounds: dict[str, float]):
        raise_unreachable(ctx, limits, budgets, as_measured=bounds != inner)

    found, rounds = measured_loop(ctx, config,
                                  lambda bounds: repairs.pick(bounds, final, unreachable),
                                  lambda f: space.spec_of(f.choice), budgets, inner, final.timer,
                                  aim=lambda bounds: repairs.answer(bounds, unreachable)[0])
    t2, c2 = time.perf_counter(), time.process_time()
    spec = space.spec_of(found.choice)
    prediction, checks = final_check(ctx, spec, limits)
    seconds = {"dnas": result.seconds, "scores_and_repair": t2 - t1 - final.seconds,
               "selection": final.seconds, "final_pick": final.parts(),
               "total": result.seconds + (t2 - t1),
               "cpu_total": result.cpu_seconds + (c2 - c1), "threads": torch.get_num_threads()}
    return SearchOutcome(spec=spec, limits=limits, budgets=budgets, prediction=prediction,
                         checks=checks, dnas=result, discretized=found, seconds=seconds,
                         measured_rounds=rounds, evaluations=repairs.evaluations,
                         selection=final.report(), dnas_start=start,
                         timing=final.timer.summary(list(budgets)) if final.timer else None)


def _step_info(rec: dict[str, Any]) -> str:
    ratios = " ".join(f"{m.split('_')[0]} {1 + g:.2f}" for m, g in rec["g"].items())
    lams = " ".join(f"λ {v:.2f}" for v in rec["lambda"].values())
    held = "mode" if rec.get("constraint") == "mode" else "E"
    return f"kl {rec['kl']:.3f}  {held}/budget {ratios}  {lams}  τ {rec['tau']:.2f}"


# ------------------------------------------------------------------ baseline


def run_minitron(
    ctx: SearchContext,
    limits: Limits | None = None,
    params: int | None = None,
    config: SearchConfig | None = None,
    progress: bool = False,
) -> BaselineOutcome:
    """The Minitron baseline: matched to ``limits``, or to a parameter count ``params``.

    Matched: every homogeneous candidate that could meet the limits is timed on the
    target where this machine can time it (unless ``measured_rounds == 0``: trust the
    cost model, as the search does); the top-k are ranked after a short distillation.
    """
    config = config or SearchConfig()
    if (limits is None) == (params is None):
        raise AutoCompressError("give either a parameter target or limits to match",
                                hint="--params N, or --match-target T --workload W with limits")
    t0 = time.perf_counter()
    score = _minitron_score(ctx, config, progress)
    rounds: list[MeasuredRound] = []
    if params is not None:
        result = minitron_for_params(ctx.space, ctx.importance, params, score, config.minitron)
    else:
        need_costs(ctx)
        budgets = budgets_from_limits(limits, ctx.workload)
        measure = spec_timer(ctx, config)  # the search's timing, drift allowance included
        if not judged_on(budgets, ctx.cost_model):
            measure = None  # a memory budget no reading here measures: as predicted
        confirm = measure.confirm if measure is not None and config.confirm_timing else None
        bar = LazyBar("time candidates", progress)
        result = minitron_matched(ctx.space, ctx.importance, ctx.costs, budgets, measure, score,
                                  config.minitron, progress=bar, confirm=confirm)
        bar.close()
        if measure is not None:
            measure.warn(list(budgets))  # one line where the machine was busy, as the search
        rounds = [_round(ctx, c.spec, c.measured, c.noise, budgets, bool(c.met))
                  for c in result.timed]
        rounds += [_round(ctx, c.spec, c.confirmed, c.confirmed_noise, budgets, bool(c.met))
                   for c in result.timed if c.confirmed is not None]
    prediction = None
    if ctx.cost_model is not None and ctx.workload is not None:
        prediction = ctx.cost_model.predict(result.spec, ctx.workload)
    checks = limits.check(prediction.metrics()) if limits is not None else []
    if limits is not None and not all(c.ok for c in checks) and not result.timed:
        raise AutoCompressError(  # the tables and predict() disagree: a bug, not user input
            f"internal error: the baseline breaks its limits under predict(): {checks}")
    return BaselineOutcome(spec=result.spec, result=result, limits=limits, prediction=prediction,
                           checks=checks, seconds=time.perf_counter() - t0,
                           measured_rounds=rounds)


def _round(ctx: SearchContext, spec: ArchSpec, measured, noise, budgets, met: bool
           ) -> MeasuredRound:
    predicted = ctx.cost_model.predict(spec, ctx.workload).metrics()
    return MeasuredRound(params=spec.num_params(), met=met, budgets=budgets,
                         timed=not is_untimed(noise), **round_values(predicted, measured, noise))


def _minitron_score(ctx: SearchContext, config: SearchConfig, progress: bool):
    """Minitron's ranking of its top-k: KL to the teacher after a short distillation."""
    if config.minitron.top_k == 1:
        return None
    scores = short_distill(ctx, config, progress)
    return lambda cands: [r["kl"] for r in scores([c.spec for c in cands])]


# ------------------------------------------------------------------ files


def report_path(out: Path) -> Path:
    return out.with_name(out.stem + ".search.json")


def search_to_file(
    ctx: SearchContext,
    limits: Limits,
    out: str | Path,
    config: SearchConfig | None = None,
    work_dir: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Search and write ``out`` (ArchSpec JSON), its report, and the trajectory JSON/PNG."""
    out = Path(out)
    work = Path(work_dir) if work_dir else out.with_name(f".{out.stem}.search-work")
    outcome = run_search(ctx, limits, config, work_dir=work, progress=progress)
    report = outcome.report(ctx)
    meta = {"budgets": outcome.budgets, "space": ctx.space.describe(),
            "config": (config or SearchConfig()).model_dump()}
    traj = save_trajectory(out.with_name(out.stem + ".trajectory.json"),
                           outcome.dnas.trajectory, meta)
    title = f"{ctx.workload.name} on {ctx.cost_model.target.name}: {limits.describe()}"
    png = plot_trajectory(out.with_name(out.stem + ".trajectory.png"), outcome.dnas.trajectory,
                          ctx.space, title)
    report.update({"trajectory": str(traj), "plot": str(png)})
    outcome.spec.to_json(out)
    write_json_atomic(report_path(out), report)
    # Only what this search wrote goes: the default work dir is its own; a
    # --work-dir the user gave keeps everything but the checkpoint.
    remove_path(work / CHECKPOINT_NAME if work_dir else work)
    return report


def minitron_to_file(
    ctx: SearchContext,
    out: str | Path,
    limits: Limits | None = None,
    params: int | None = None,
    config: SearchConfig | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Pick the Minitron baseline and write ``out`` and its report."""
    outcome = run_minitron(ctx, limits=limits, params=params, config=config, progress=progress)
    return _write(ctx, outcome, Path(out))


def run_method(ctx: SearchContext, method: str, limits: Limits,
               config: SearchConfig | None = None, progress: bool = False):
    """The architecture ``method`` (one of ``METHODS``) finds for ``limits``: an outcome
    with ``spec``, ``prediction`` and ``report(ctx)``."""
    config = config or SearchConfig()
    if method == "autocompress":
        return run_search(ctx, limits, config, progress=progress)
    if method == "minitron":
        return run_minitron(ctx, limits=limits, config=config, progress=progress)
    if method in ("greedy", "random", "minitron-scored", "mip"):
        need_costs(ctx)
    if method == "minitron-scored":
        return run_minitron_scored(ctx, limits, config, progress)
    if method == "mip":
        return run_mip(ctx, limits, config, progress)
    if method == "greedy":
        return run_greedy(ctx, limits, config, progress)
    if method == "random":
        return run_random(ctx, limits, config, progress)
    raise AutoCompressError(f"unknown method {method!r}", hint=f"use one of {', '.join(METHODS)}")


def method_to_file(ctx: SearchContext, method: str, limits: Limits, out: str | Path,
                   config: SearchConfig | None = None, work_dir: str | Path | None = None,
                   progress: bool = False) -> dict[str, Any]:
    """``run_method`` and write ``out`` (ArchSpec JSON) and its report (the search: also its
    trajectory, and it resumes from ``work_dir``)."""
    if method == "autocompress":
        return search_to_file(ctx, limits, out, config, work_dir=work_dir, progress=progress)
    return _write(ctx, run_method(ctx, method, limits, config, progress), Path(out))


def _write(ctx: SearchContext, outcome, out: Path) -> dict[str, Any]:
    report = outcome.report(ctx)
    outcome.spec.to_json(out)
    write_json_atomic(report_path(out), report)
    return report
