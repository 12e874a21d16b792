"""What every method searches on, and the checks they share.

``SearchContext.build`` loads the teacher, the cost model of the target, the cost
tables of the search space, its importance (computed on the calibration split if not
given) and the space's masks. Limits are checked before importance, on the space's
shape alone (``check_limits_early``): no heavy work runs for limits nothing can meet.
Around it: measured scores of single-option changes (``scores_at``, ``teacher_scores``),
the short distillation that ranks a short list (``short_distill``), timing on the
target (``spec_timer``, ``measured_loop``) and the budget checks (``check_reachable``,
``final_check``). The search (``run``), its ablations (``ablations``), the joint search
and the Pareto family all build on these.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autocompress.arch import ArchSpec
from autocompress.arch_search.budgets import budgets_from_limits, reachable_text, resolve_limits
from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.discretize import (
    MeasuredKL,
    Scores,
    measured_job_list,
    measured_scores,
    smallest_reachable,
)
from autocompress.arch_search.masked import MaskedTeacher
from autocompress.arch_search.measured import (
    MeasuredRound,
    SpecTimer,
    calibrate_aim,
    closed_loop,
    measure_spec,
    timing_threads,
    untimed,
    untimed_error,
)
from autocompress.arch_search.options import SpaceConfig
from autocompress.arch_search.selection import short_distill_scores
from autocompress.arch_search.space import Choice, SearchSpace, SpaceShape
from autocompress.costmodel.model import CostModel
from autocompress.costmodel.target import Target
from autocompress.costmodel.workload import Workload, get_workload
from autocompress.data.corpus import ensure_corpus
from autocompress.data.tokens import PackedTokens
from autocompress.errors import AutoCompressError
from autocompress.hardware import compute_threads, cores_in_the_way, cores_taken_by_others
from autocompress.importance import Importance, calibration_batches, compute_importance
from autocompress.limits import Limits
from autocompress.model_source import resolve_model_dir
from autocompress.modeling import arch_spec_of, load_causal_lm
from autocompress.progress import Bar


@dataclass
class SearchContext:
    """The teacher, its importance and space, and the cost model of one target/workload."""

    model: Any
    tokenizer: Any
    importance: Importance
    space: SearchSpace
    masked: MaskedTeacher
    cost_model: Any
    workload: Any
    costs: Any
    corpus_dir: Path
    teacher_dir: str | None = None

    @classmethod
    def build(
        cls,
        teacher: str | Path | tuple[Any, Any],
        target: str | None,
        workload: str | Any | None,
        config: SearchConfig | None = None,
        importance: Importance | str | Path | None = None,
        corpus_dir: str | Path | None = None,
        cost_model: Any = None,
        progress: bool = True,
        limits: Limits | None = None,
        budget_fraction: float | None = None,
    ) -> SearchContext:
        """Load everything; ``teacher`` is a directory, ``default`` or ``(model, tokenizer)``.

        ``target`` None (and no ``cost_model``): no cost model (parameter-targeted baseline).
        ``limits`` / ``budget_fraction``: the limits the caller will search under, refused
        before importance is computed when no architecture of the space meets them (the
        caller still resolves them with ``resolve_limits``).
        """
        config = config or SearchConfig()
        teacher_dir = None
        if isinstance(teacher, tuple):
            model, tokenizer = teacher
        else:
            teacher_dir = str(resolve_model_dir(teacher))
            model, tokenizer = load_causal_lm(teacher_dir)
        if tokenizer is None:
            raise AutoCompressError("the teacher has no tokenizer, so calibration text cannot be "
                                    "tokenized", hint="save the tokenizer into the model directory")
        spec = arch_spec_of(model)
        if cost_model is None and target is not None:
            cost_model = CostModel.for_target(Target.parse(target))
        config = obeying_the_engine(config, cost_model)
        wl = get_workload(workload) if isinstance(workload, str) else workload
        has_costs = cost_model is not None and bool(wl)
        if has_costs and (limits is not None or budget_fraction is not None):
            # Before the corpus and importance: unreachable limits stop here (~0.1 s).
            check_limits_early(spec, config.space, cost_model, wl, limits, budget_fraction)
        if config.threads:  # after the early check: the busy-machine probe sleeps 0.5 s
            torch.set_num_threads(config.threads)
        else:
            share_a_busy_machine()
        calib = config.calibration
        corpus_arg = corpus_dir or calib.corpus_dir
        corpus = ensure_corpus(Path(corpus_arg) if corpus_arg else None)
        if importance is None:
            batches = calibration_batches(tokenizer, calib.model_copy(
                update={"corpus_dir": str(corpus)}))
            importance = compute_importance(model, batches, removal_batches=calib.removal_batches,
                                            criterion=calib.criterion,
                                            progress=progress and interactive())
        elif not isinstance(importance, Importance):
            importance = Importance.load(importance)
        space = SearchSpace.build(spec, importance, config.space)
        costs = space.cost_tables(cost_model, wl) if has_costs else None
        return cls(model=model, tokenizer=tokenizer, importance=importance, space=space,
                   masked=MaskedTeacher(model, space), cost_model=cost_model, workload=wl,
                   costs=costs, corpus_dir=corpus, teacher_dir=teacher_dir)

    # --------------------------------------------------------------- data
    def calibration(self, seq_len: int):
        return self.corpus_split("calibration", seq_len)

    def corpus_split(self, split: str, seq_len: int):
        return PackedTokens(self.tokenizer, self.corpus_dir, split, seq_len)

    def score_batches(self, config: SearchConfig, count: int | None = None) -> list[torch.Tensor]:
        """Fixed calibration batches (``config.score_batches`` unless ``count``) for measured
        scores and the baselines' selection."""
        data = self.calibration(config.dnas.seq_len)
        seed = config.dnas.seed + 7919  # not the batches the search trained on first
        return [data.batch_at(i, config.dnas.batch_size, seed)
                for i in range(count or config.score_batches)]

    def teacher_costs(self) -> dict[str, float]:
        return self.cost_model.predict(self.space.teacher, self.workload).metrics()

    def resolve_limits(self, limits: Limits | None, budget_fraction: float | None) -> Limits:
        """``budgets.resolve_limits`` with this teacher's predicted costs."""
        return resolve_limits(limits, budget_fraction, self.teacher_costs, self.workload)


def obeying_the_engine(config: SearchConfig, cost_model) -> SearchConfig:
    """For a vLLM target, a space of only what vLLM computes exactly from the nemotron-nas
    export it serves (its rules in ``engine_rules``: e.g. one query-head count for every
    layer), unless the config names an export engine itself."""
    if cost_model is None or config.space.export_engine is not None \
            or cost_model.target.engine.name != "vllm":
        return config
    space = config.space.model_copy(update={"export_engine": "vllm"})
    return config.model_copy(update={"space": space})


def shared_report(ctx: SearchContext, spec: ArchSpec, limits: Limits, budgets: dict[str, float],
                  prediction, checks) -> dict[str, Any]:
    """The fields of every limits-matched method's report (search, ablations)."""
    return {
        "teacher": ctx.teacher_dir,
        "target": ctx.cost_model.target.name,
        "cost_model": ctx.cost_model.version,
        "workload": ctx.workload.model_dump(),
        "limits": limits.model_dump(exclude_none=True),
        "budgets": budgets,
        "predicted": prediction.metrics(),
        "teacher_predicted": ctx.teacher_costs(),
        "margins": {c.metric: c.margin for c in checks},
        "meets_limits": all(c.ok for c in checks),
        "params": spec.num_params(),
        "teacher_params": ctx.space.teacher.num_params(),
    }


# ------------------------------------------------------------------ scores


def scores_at(ctx: SearchContext, config: SearchConfig, anchor: Choice, radius: int | None,
              label: str, progress: bool = False) -> Scores:
    """Single-option changes from ``anchor`` measured on the score batches (within
    ``radius`` size ranks; None: every option), with a progress bar."""
    bar = Bar(label, len(measured_job_list(ctx.space, anchor, radius)), progress)
    count = [0]

    def tick():
        count[0] += 1
        bar.update(count[0], "")

    scores = measured_scores(ctx.masked, anchor, ctx.score_batches(config), radius=radius,
                             progress=tick)
    bar.close()
    return scores


def at_hidden(scores: Scores, hidden: int) -> Scores:
    """``scores`` that allow only one hidden size: repair from DNAS's answer when the search
    did not move the hidden size (``DNASConfig.search_hidden``). Its block scores were
    measured at that size; summed at another, they promised more than the anchor's whole
    KL (SmolLM2: -8.9 nats for a candidate whose KL was 6.9)."""
    only = np.full_like(scores.hidden, np.inf)
    only[hidden] = scores.hidden[hidden]
    return replace(scores, hidden=only)


def measured_rank(ctx: SearchContext, config: SearchConfig) -> MeasuredKL | None:
    """The KL that ranks repaired candidates when ``selection.estimate`` is 'measured'
    (on the measured scores' batches), else None: their additive scores rank them."""
    if config.selection.estimate != "measured":
        return None
    return MeasuredKL(ctx.masked, ctx.score_batches(config))


def teacher_scores(ctx: SearchContext, config: SearchConfig, progress: bool = False) -> Scores:
    """Every single-option change measured at the teacher (greedy repair's scores)."""
    return scores_at(ctx, config, ctx.space.full_choice(), None, "teacher scores", progress)


class LazyBar:
    """A progress bar whose total is known only at the first update."""

    def __init__(self, description: str, enabled: bool):
        self.description, self.enabled, self.bar = description, enabled, None

    def __call__(self, completed: int, total: int) -> None:
        if self.bar is None:
            self.bar = Bar(self.description, total, self.enabled)
        self.bar.update(completed, "")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def short_distill(ctx: SearchContext, config: SearchConfig, progress: bool):
    """specs -> ``[{"pruned_kl", "kl"}]``: each spec cut from the teacher, distilled with the
    baseline's short budget (``config.minitron``), scored by KL on the fixed score batches.
    The one ranking the baseline and the search's final pick share."""
    mc = config.minitron

    def score(specs):
        train = ctx.corpus_split("train", mc.distill_seq_len)
        bar = LazyBar("rank top-k", progress)
        values = short_distill_scores(
            ctx.model, ctx.importance, specs, train,
            ctx.score_batches(config, mc.score_batches), mc.distill_tokens, mc.distill_seq_len,
            mc.distill_batch_size, mc.distill_lr, config.dnas.seed, progress=bar)
        bar.close()
        return values

    return score


# ------------------------------------------------------------------ checks


def spec_timer(ctx: SearchContext, config: SearchConfig) -> SpecTimer | None:
    """Times architectures on the target (once each), where this machine can time it."""
    if config.measured_rounds == 0 or not ctx.cost_model.target.measurable:
        return None
    model, workload = ctx.cost_model, ctx.workload
    return SpecTimer(lambda spec: measure_spec(spec, ctx.model.config, model, workload,
                                               config.measured_repeats, config.timing_drift),
                     drift=config.timing_drift, busy=config.busy,
                     others=lambda: cores_in_the_way(timing_threads(model)),
                     fallback=lambda spec: untimed(model.predict(spec, workload).metrics(),
                                                   untimed_error(model, config.timing_drift)))


def measured_loop(ctx: SearchContext, config: SearchConfig, pick, spec_of,
                  budgets: dict[str, float], inner: dict[str, float],
                  timer: SpecTimer | None = None, aim=None):
    """``measured.closed_loop`` where the target can be timed here; else one pick. With
    ``aim`` (a cheap pick: no training), the bounds are first calibrated on it
    (``measured.calibrate_aim``); its rounds come first in the history."""
    timer = timer or spec_timer(ctx, config)
    if timer is None:
        return pick(inner), []
    aimed: list[MeasuredRound] = []
    if aim is not None:
        inner, aimed = calibrate_aim(aim, spec_of, ctx.cost_model, ctx.workload, budgets,
                                     inner, config.measured_rounds, timer)
    found, rounds = closed_loop(pick, spec_of, ctx.cost_model, ctx.workload, budgets, inner,
                                config.short_list_rounds, timer)
    return found, aimed + rounds


def need_costs(ctx: SearchContext) -> None:
    if ctx.costs is None:
        raise AutoCompressError("limits need a target and a workload for the cost model",
                                hint="pass --target and --workload")


def final_check(ctx: SearchContext, spec: ArchSpec, limits: Limits):
    prediction = ctx.cost_model.predict(spec, ctx.workload)
    checks = limits.check(prediction.metrics())
    if not all(c.ok for c in checks):
        raise AutoCompressError(
            f"internal error: the repaired architecture breaks a limit under predict(): "
            f"{[c.model_dump() for c in checks if not c.ok]}")
    if not prediction.fits:
        raise AutoCompressError(
            f"the searched architecture does not fit on {ctx.cost_model.target.name}: "
            f"{prediction.reason}",
            hint="add a memory limit below the device memory (--limit memory=GB)")
    return prediction, checks


def check_reachable(ctx: SearchContext, limits: Limits) -> dict[str, float]:
    """The budgets of ``limits``; an error naming the smallest reachable costs when the
    space cannot meet them."""
    return reachable_budgets(ctx.space, ctx.costs, ctx.workload, limits)


def check_limits_early(teacher: ArchSpec, space: SpaceConfig, cost_model: Any,
                       workload: Workload, limits: Limits | None,
                       budget_fraction: float | None = None) -> Limits:
    """``limits`` resolved (``budget_fraction``: of the teacher's predicted cost) and
    checked against the space of ``teacher`` before importance is computed: the same
    error as ``check_reachable`` when no architecture of the space meets them.

    Needs only the teacher's shape: a block's cost depends on how many channels it
    keeps, never on which, so the space's options (``SpaceShape``) price every choice.
    """
    resolved = resolve_limits(limits, budget_fraction,
                              lambda: cost_model.predict(teacher, workload).metrics(), workload)
    # the space the search will have: a vLLM target's holds only what vLLM loads exactly
    space = obeying_the_engine(SearchConfig(space=space), cost_model).space
    shape = SpaceShape.build(teacher, space)
    reachable_budgets(shape, shape.cost_tables(cost_model, workload), workload, resolved)
    return resolved


def reachable_budgets(space: SpaceShape, costs: Any, workload: Workload,
                      limits: Limits) -> dict[str, float]:
    """``check_reachable`` on a space's options and cost tables (no importance needed)."""
    budgets = budgets_from_limits(limits, workload)
    smallest = smallest_reachable(space, costs, list(budgets))
    if any(smallest[m] > b for m, b in budgets.items()):
        raise unreachable_error(limits, budgets, smallest, workload)
    return budgets


def raise_unreachable(ctx, limits, budgets, smallest=None, as_measured=False) -> None:
    if as_measured:
        raise AutoCompressError(
            "no architecture in the search space meets the limits as measured on "
            f"{ctx.cost_model.target.name}: the cost model is optimistic here, and the budgets "
            "corrected by its measured error are below the smallest reachable costs",
            hint="loosen the limits, or refit the cost model (autocompress costmodel fit)")
    smallest = smallest or smallest_reachable(ctx.space, ctx.costs, list(budgets))
    raise unreachable_error(limits, budgets, smallest, ctx.workload)


def unreachable_error(limits: Limits, budgets: dict[str, float], smallest: dict[str, float],
                      workload: Workload) -> AutoCompressError:
    """The one line that names, per budget, whether it is reachable and the smallest
    reachable cost."""
    parts = []
    for m, b in budgets.items():
        status = "unreachable" if smallest[m] > b else "reachable alone"
        parts.append(f"{m} <= {b:.4g} ({status}; smallest reachable: "
                     f"{reachable_text(m, smallest[m], limits, workload)})")
    return AutoCompressError(
        "no architecture in the search space meets every limit: " + "; ".join(parts),
        hint="loosen the limits, or widen the space (smaller hidden/FFN fractions, no-op blocks)",
    )


def share_a_busy_machine() -> None:
    """Compute on fewer torch threads where other processes keep cores busy (one line says
    so). Timing on the target is unaffected: it runs on the cost model's thread count."""
    current = torch.get_num_threads()
    if current <= 1:
        return
    taken = cores_taken_by_others(niced=False)  # a niced process gives its core way
    threads = compute_threads(current, taken)
    if threads < current:
        print(f"note: other processes keep {taken:.1f} cores busy: the search computes on "
              f"{threads} of {current} torch threads (timing on the target keeps the cost "
              "model's count)", file=sys.stderr)
        torch.set_num_threads(threads)


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("AUTOCOMPRESS_QUIET")
