"""End to end: teacher + target + workload + limits -> a searched ArchSpec.

``SearchContext.build`` loads the teacher, its importance (computed on the
calibration split if not given), the cost model of the target and the search
space with its cost tables. ``run_search`` then runs the DNAS, discretizes and
repairs, makes the final pick among its candidates after the baseline's short
distillation (``FinalPick``, ``search.selection``) and checks the result with
``CostModel.predict``; ``run_minitron``
picks the Minitron baseline from the same context (same importance, same
calibration data, same cost model); ``search.ablations`` has the greedy and
random ablations. ``run_method`` / ``method_to_file`` choose one of ``METHODS``.

``search_to_file`` / ``minitron_to_file`` / ``method_to_file`` write
``arch.json`` plus a report (``<stem>.search.json``) and, for the search, the
trajectory (``<stem>.trajectory.json`` and ``.png``). Search checkpoints live in
a work directory (default ``.<stem>.search-work`` beside the output) so an
interrupted search resumes where it stopped; it is removed once the
architecture is written.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec
from autocompress.atomic import remove_path, write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.importance import CalibrationConfig, Importance
from autocompress.limits import Limits
from autocompress.progress import Bar
from autocompress.search.budgets import budgets_from_limits, reachable_text, resolve_limits
from autocompress.search.discretize import (
    CostTables,
    Discretized,
    MeasuredKL,
    Scores,
    feasible,
    measured_job_list,
    measured_scores,
    probability_scores,
    repair,
    smallest_reachable,
    within_radius,
)
from autocompress.search.dnas import CHECKPOINT_NAME, DNAS, DNASConfig, DNASResult
from autocompress.search.masked import MaskedTeacher
from autocompress.search.measured import (
    TIMING_METRICS,
    MeasuredRound,
    SpecTimer,
    calibrate_aim,
    closed_loop,
    measure_spec,
    missed_budgets,
)
from autocompress.search.minitron import (
    BaselineResult,
    MinitronConfig,
    minitron_for_params,
    minitron_matched,
)
from autocompress.search.selection import (
    Finalist,
    SelectionConfig,
    Sides,
    best_scored,
    repaired_finalists,
    select,
)
from autocompress.search.space import Choice, SearchSpace, SpaceConfig
from autocompress.search.trajectory import plot_trajectory, save_trajectory

# How an architecture can be found (``run_method``): the search, and its baseline and ablations.
METHODS = ("autocompress", "greedy", "random", "minitron")

# Repair aims this far inside each budget so float rounding in predict() cannot flip it.
SAFETY = 1e-9


class RandomConfig(BaseModel):
    """How the random-search ablation (``search.ablations``) draws its candidates."""

    model_config = ConfigDict(extra="forbid")

    candidates: int | None = Field(
        default=None, ge=1,
        description="Architectures scored (None = what the full search evaluates: DNAS steps "
        "+ the most single-change scores its repair can take in this space).")
    min_budget_use: float = Field(
        default=0.8, ge=0, le=1,
        description="Reject draws using less than this fraction of every budget.")
    max_tries: int = Field(default=200_000, ge=1, description="Draws before relaxing the floor.")


class SearchConfig(BaseModel):
    """Everything that shapes a search (and the baseline built beside it)."""

    model_config = ConfigDict(extra="forbid")

    space: SpaceConfig = Field(default_factory=SpaceConfig)
    dnas: DNASConfig = Field(default_factory=DNASConfig)
    score: Literal["measured", "probability"] = Field(
        default="measured",
        description="Per-option scores for repair: measured KL changes around the search's "
        "argmax, or the search's log-probabilities.",
    )
    score_batches: int = Field(default=1, ge=1, description="Batches for measured scores.")
    score_radius: int | None = Field(
        default=2, ge=0,
        description="Repair's answer uses measured scores of options within this many size "
        "ranks of the search's argmax (plus no-op); None = every option. The final pick's "
        "depth variants score every option.",
    )
    minitron: MinitronConfig = Field(default_factory=MinitronConfig)
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig,
        description="The final pick of the search and its ablations: their top-k candidates "
        "get the baseline's short distillation (search.minitron.distill_*).")
    random: RandomConfig = Field(default_factory=RandomConfig,
                                 description="The random-search ablation (method random).")
    calibration: CalibrationConfig = Field(
        default_factory=lambda: CalibrationConfig(seq_len=128, batch_size=8, num_batches=8,
                                                  removal_batches=0),
        description="Data for importance when it is not given.",
    )
    threads: int | None = Field(default=None, description="torch threads (None = leave as is).")
    measured_rounds: int = Field(
        default=3, ge=0,
        description="On a target this machine can time: measure the pick (random weights) "
        "and, where it misses a timing budget, tighten that budget by the cost model's error "
        "on it and pick again, at most this many measurements (0 = trust the cost model). "
        "The search and its ablations first do the same with their untrained answer (at most "
        "as many timings), so the final pick's short list is trained at a calibrated aim.")
    measured_repeats: int = Field(default=9, ge=2, description="Timed runs per measurement.")
    timing_drift: float = Field(
        default=0.03, ge=0.0, lt=0.5,
        description="How far, as a fraction, a timing may move between the search's session "
        "and verify's (pairing removes the load, not this drift): a pick, the baseline's "
        "alike, meets a timing budget only if measurement + noise + drift × measurement is "
        "within it.")
    confirm_timing: bool = Field(
        default=True,
        description="Time a pick (the baseline's alike) a second time after choosing it; it "
        "must meet the timing budgets in both (the first of several near-limit candidates to "
        "meet them tends to be one that read low).")

    @property
    def scores_teacher_side(self) -> bool:
        """The final pick's teacher side is built (it needs measured scores at the teacher)."""
        return self.selection.has_teacher_side and self.score == "measured"

    @property
    def dnas_starts_on_greedy(self) -> bool:
        """DNAS starts on greedy's answer (which needs every option measured at the teacher)."""
        return self.dnas.start == "greedy" and self.score == "measured"

    @property
    def scores_at_teacher(self) -> bool:
        """Every option is measured at the teacher once (DNAS's start or the teacher side)."""
        return self.dnas_starts_on_greedy or self.scores_teacher_side


# ------------------------------------------------------------------ context


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
    ) -> SearchContext:
        """Load everything; ``teacher`` is a directory, ``default`` or ``(model, tokenizer)``.

        ``target`` None (and no ``cost_model``): no cost model (parameter-targeted baseline).
        """
        from autocompress.costmodel.model import CostModel
        from autocompress.costmodel.target import Target
        from autocompress.costmodel.workload import get_workload
        from autocompress.data.corpus import ensure_corpus
        from autocompress.importance import calibration_batches, compute_importance
        from autocompress.modeling import arch_spec_of, load_causal_lm
        from autocompress.paths import resolve_model_dir

        config = config or SearchConfig()
        if config.threads:
            torch.set_num_threads(config.threads)
        teacher_dir = None
        if isinstance(teacher, tuple):
            model, tokenizer = teacher
        else:
            teacher_dir = str(resolve_model_dir(teacher))
            model, tokenizer = load_causal_lm(teacher_dir)
        if tokenizer is None:
            raise AutoCompressError("the teacher has no tokenizer, so calibration text cannot be "
                                    "tokenized", hint="save the tokenizer into the model directory")
        calib = config.calibration
        corpus_arg = corpus_dir or calib.corpus_dir
        corpus = ensure_corpus(Path(corpus_arg) if corpus_arg else None)
        if importance is None:
            batches = calibration_batches(tokenizer, calib.model_copy(
                update={"corpus_dir": str(corpus)}))
            importance = compute_importance(model, batches, removal_batches=calib.removal_batches,
                                            criterion=calib.criterion,
                                            progress=progress and _interactive())
        elif not isinstance(importance, Importance):
            importance = Importance.load(importance)
        spec = arch_spec_of(model)
        space = SearchSpace.build(spec, importance, config.space)
        if cost_model is None and target is not None:
            cost_model = CostModel.for_target(Target.parse(target))
        wl = get_workload(workload) if isinstance(workload, str) else workload
        costs = space.cost_tables(cost_model, wl) if cost_model is not None and wl else None
        return cls(model=model, tokenizer=tokenizer, importance=importance, space=space,
                   masked=MaskedTeacher(model, space), cost_model=cost_model, workload=wl,
                   costs=costs, corpus_dir=corpus, teacher_dir=teacher_dir)

    # --------------------------------------------------------------- data
    def calibration(self, seq_len: int):
        return self.corpus_split("calibration", seq_len)

    def corpus_split(self, split: str, seq_len: int):
        from autocompress.data.tokens import PackedTokens

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
            "selection": self.selection,
            "space": space.describe(),
            "arch": self.spec.to_dict(),
        }


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
    _need_costs(ctx)
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
                         selection=final.report(), dnas_start=start)


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


class Repairs:
    """One DNAS answer repaired to any budgets, ending with the final pick (``FinalPick``):
    what the search, the joint search (``search.multitarget``) and the Pareto family
    (``search.family``) share after their DNAS.

    The measured scores around the answer are taken once: every option when the final pick
    has depth variants (an emptied layer's budget may go to any option elsewhere), else
    those within ``radius`` size ranks; repair's own answer uses those within ``radius``;
    the DNAS probabilities are the fallback where those cannot meet the
    budgets. With depth variants and ``selection.teacher_anchor``, every option is also
    scored at the teacher, and repair from there (the greedy ablation's candidates) competes
    for the short list (``selection.select_sides``): it finds other whole-block trade-offs
    than repair from DNAS's answer, and the short distillation decides between the sides.
    """

    def __init__(self, ctx: SearchContext, config: SearchConfig, costs, result: DNASResult,
                 radius: int | None, progress: bool = False, at_teacher: Scores | None = None):
        space = ctx.space
        self.space, self.costs = space, costs
        self.depth = config.selection.varies_depth
        self.anchor = result.anchor_choice(space)
        # Architectures evaluated on data: one per DNAS step, the anchor and its options.
        self.evaluations = {"dnas_steps": len(result.trajectory), "measured_scores": 0}
        self.scores = self.near = None
        if config.score == "measured":
            measured_radius = None if self.depth else radius
            jobs = measured_job_list(space, self.anchor, measured_radius)
            self.evaluations["measured_scores"] = len(jobs) + 1  # + the anchor itself
            self.scores = scores_at(ctx, config, self.anchor, measured_radius, "scores",
                                    progress)
            if not config.dnas.search_hidden:
                self.scores = at_hidden(self.scores, self.anchor.hidden)
            self.near = within_radius(space, self.scores, self.anchor, radius)
        self.rank = measured_rank(ctx, config)
        self.fallback = probability_scores(space, result.probabilities(space))
        if config.scores_teacher_side and at_teacher is None:
            at_teacher = teacher_scores(ctx, config, progress)
        # Repair from the teacher's side uses them; DNAS's start may have used them alone.
        self.teacher_scores = at_teacher if config.scores_teacher_side else None
        if at_teacher is not None:
            full = space.full_choice()
            self.evaluations["teacher_scores"] = len(measured_job_list(space, full, None)) + 1

    def answer(self, bounds: dict[str, float], unreachable) -> tuple[Discretized, Any]:
        """Repair's own answer within ``bounds`` (no training) and the scores it used.
        ``unreachable(bounds)`` raises when nothing meets ``bounds``."""
        space, costs, anchor = self.space, self.costs, self.anchor
        used = self.scores
        found = (repair(space, costs, bounds, anchor, self.near, rank=self.rank)
                 if self.near is not None else None)
        if found is None:  # probability scores cover the whole space
            used = self.fallback
            found = repair(space, costs, bounds, anchor, used, rank=self.rank)
        if found is None:
            unreachable(bounds)
        return found, used

    def pick(self, bounds: dict[str, float], final: FinalPick, unreachable) -> Discretized:
        """Repair's answer within ``bounds`` and its variants; ``final`` picks among them."""
        found, used = self.answer(bounds, unreachable)
        tables = CostTables(self.costs, list(bounds))
        carried = [f for f in final.carried if feasible(tables.evaluate(f.choice), bounds)]
        chosen = final.choose(lambda: self._finalists(bounds, used, found), carried).found
        if self.rank is not None:
            self.evaluations["measured_candidates"] = len(self.rank.memo)
        return chosen

    def _finalists(self, bounds, used, found) -> list[Finalist] | Sides:
        own = repaired_finalists(self.space, self.costs, bounds, self.anchor, used, found,
                                 self.depth, self.rank)
        if self.teacher_scores is None:
            return own
        full = self.space.full_choice()
        start = repair(self.space, self.costs, bounds, full, self.teacher_scores, rank=self.rank)
        if start is None:
            return own
        other = repaired_finalists(self.space, self.costs, bounds, full, self.teacher_scores,
                                   start, self.depth, self.rank)
        for f in other:
            f.origin = f"teacher: {f.origin}"  # report.TEACHER_SIDE reads this prefix
        return Sides(own, other)


class FinalPick:
    """The final pick of the search and its ablations (``selection.select``): the short list
    of a method's candidates, each given the baseline's short distillation (the same
    settings, ``config.minitron.distill_*``), lowest KL wins. Scores are kept across the
    measured loop's rounds (and across picks that pass the same ``memo``: a Pareto family's
    budgets); the report has the last round's short list (and the winner, if an earlier
    round's candidate won).

    Given ``budgets`` on a target this machine times, the short list is also timed, best KL
    first, up to the first candidate that meets the budgets as measured — the care the
    Minitron baseline gets (it times every candidate that could meet the limit). The
    lowest KL that met in any round wins once a round's best-KL candidate meets or the
    measured loop has no round left. Until then a round whose best missed hands that
    miss to the loop, which re-aims by the cost model's error on it: the short list is
    built around the *predicted* limit, and where the cost model is optimistic by a few
    per cent every candidate near the limit misses and the one that met is often a much
    worse, much smaller model (KL 0.61 where the misses had 0.42, interactive-cpu @ 40%
    on a quiet machine); the re-aimed short list sits under the limit as measured. To
    spare that whole round of short distillations, the measured loop first calibrates the
    aim on the method's untrained answer (``measured.calibrate_aim``, one timing a round)."""

    def __init__(self, ctx: SearchContext, config: SearchConfig, progress: bool = False,
                 memo: dict | None = None, budgets: dict[str, float] | None = None,
                 carried: list[Finalist] | None = None):
        self.ctx, self.config, self.progress = ctx, config, progress
        self.carried = carried or []  # scored candidates from elsewhere (``choose``)
        self.depth = config.selection.varies_depth
        self.memo: dict = {} if memo is None else memo
        self.budgets = budgets
        self.timer = spec_timer(ctx, config)
        self.rounds: list[list[dict[str, Any]]] = []
        self.met: list[Finalist] = []  # short-listed candidates that met as measured, all rounds
        self.chosen: Finalist | None = None
        self.seconds = 0.0
        self._parts = {"candidates": 0.0, "short_distill": 0.0}

    def choose(self, finalists, carried: list[Finalist] = ()) -> Finalist:
        """The winner among ``finalists()`` (the method's own answer first) and ``carried``:
        candidates already scored elsewhere that meet these bounds (a Pareto family's
        tighter members' picks), which join the short list without taking a place in it."""
        started = time.perf_counter()
        k = self.config.selection.top_k
        candidates = finalists()
        self._parts["candidates"] += time.perf_counter() - started
        best, short = select(candidates, k, self._score, self.memo)
        taken = {f.choice for f in short}
        extra = [f for f in carried if f.choice not in taken and f.choice in self.memo]
        if k > 1 and extra:
            short += extra
            best = best_scored(short, self._score, self.memo)
        timed = self._timed(short) if k > 1 else {}
        met_now = [f for f in short if timed.get(f.choice, {}).get("met")]
        self.met += met_now
        chosen = self._settle(best, met_now)
        self.rounds.append([{**f.describe(self.ctx.space), **timed.get(f.choice, {}),
                             "round": len(self.rounds) + 1} for f in short])
        self.chosen = chosen
        self.seconds += time.perf_counter() - started
        return chosen

    def _settle(self, best: Finalist, met_now: list[Finalist]) -> Finalist:
        """The lowest KL that met in any round, once this round's best met or this is the
        loop's last round; before that, this round's best although it missed (a re-aim)."""
        last_round = len(self.rounds) + 1 >= self.config.measured_rounds
        if not self.met or not (last_round or any(f is best for f in met_now)):
            return best
        return min(self.met, key=lambda f: (f.kl, f.estimate))

    def _timed(self, short: list[Finalist]) -> dict:
        """Time the short list, best KL first, up to the first that meets the budgets (so at
        most one timed candidate has met them); with ``confirm_timing`` it must meet them
        in the reading that stands after a second timing too (``SpecTimer.confirm``)."""
        if self.timer is None or self.budgets is None:
            return {}
        out = {}
        for f in sorted(short, key=lambda f: (f.kl, f.estimate)):
            spec = self.ctx.space.spec_of(f.choice)
            measured, noise = self.timer(spec)
            row = {"measured": {m: measured[m] for m in self.budgets}}
            met = self._meets(measured, noise)
            if met and self.config.confirm_timing:
                again, noise = self.timer.confirm(spec, self._meets)
                row["confirmed"] = {m: again[m] for m in self.budgets}
                met = self._meets(again, noise)
            out[f.choice] = {**row, "met": met}
            if met:
                break
        return out

    def _meets(self, measured: dict[str, float], noise: dict[str, float]) -> bool:
        return not missed_budgets(self.budgets, measured, noise)

    def _score(self, choices) -> list[dict[str, float]]:
        space, started = self.ctx.space, time.perf_counter()
        scores = short_distill(self.ctx, self.config, self.progress)(
            [space.spec_of(c) for c in choices])
        self._parts["short_distill"] += time.perf_counter() - started
        return scores

    def parts(self) -> dict[str, float]:
        """Where the final pick's time went: building the candidates (repair and its
        variants), their short distillations, and every timing on the target (the measured
        loop's included: it shares this pick's timer)."""
        timer = self.timer
        return {**self._parts, "timing_on_target": timer.seconds if timer else 0.0,
                "timings": timer.timings if timer else 0}

    def report(self) -> list[dict[str, Any]]:
        """The last round's short list, and the winner's row from its own round if an earlier
        round's candidate won (each row says its ``round``)."""
        if not self.rounds:
            return []
        rows = [{**r, "chosen": False} for r in self.rounds[-1]]
        won = self.chosen.choice.to_dict()
        same = [r for r in rows if r["choice"] == won]
        if not same:
            earlier = next(r for rows_i in reversed(self.rounds[:-1]) for r in rows_i
                           if r["choice"] == won)
            same = [{**earlier, "chosen": False}]
            rows += same
        same[0]["chosen"] = True
        return rows


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
        _need_costs(ctx)
        budgets = budgets_from_limits(limits, ctx.workload)
        measure = spec_timer(ctx, config)  # the search's timing, drift allowance included
        confirm = measure.confirm if measure is not None and config.confirm_timing else None
        bar = _LazyBar("time candidates", progress)
        result = minitron_matched(ctx.space, ctx.importance, ctx.costs, budgets, measure, score,
                                  config.minitron, progress=bar, confirm=confirm)
        bar.close()
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
                         predicted={m: float(predicted[m]) for m in TIMING_METRICS},
                         measured={m: float(measured[m]) for m in TIMING_METRICS},
                         noise={m: float(noise.get(m, 0.0)) for m in TIMING_METRICS})


class _LazyBar:
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


def _minitron_score(ctx: SearchContext, config: SearchConfig, progress: bool):
    """Minitron's ranking of its top-k: KL to the teacher after a short distillation."""
    if config.minitron.top_k == 1:
        return None
    scores = short_distill(ctx, config, progress)
    return lambda cands: [r["kl"] for r in scores([c.spec for c in cands])]


def short_distill(ctx: SearchContext, config: SearchConfig, progress: bool):
    """specs -> ``[{"pruned_kl", "kl"}]``: each spec cut from the teacher, distilled with the
    baseline's short budget (``config.minitron``), scored by KL on the fixed score batches.
    The one ranking the baseline and the search's final pick share."""
    mc = config.minitron

    def score(specs):
        from autocompress.search.selection import short_distill_scores

        train = ctx.corpus_split("train", mc.distill_seq_len)
        bar = _LazyBar("rank top-k", progress)
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
    return SpecTimer(lambda spec: measure_spec(spec, ctx.model.config, ctx.cost_model,
                                               ctx.workload, config.measured_repeats,
                                               config.timing_drift))


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
                                config.measured_rounds, timer)
    return found, aimed + rounds


def _need_costs(ctx: SearchContext) -> None:
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
            f"{prediction.reason}", hint="add a --max-memory-gb limit below the device memory")
    return prediction, checks


def check_reachable(ctx: SearchContext, limits: Limits) -> dict[str, float]:
    """The budgets of ``limits``; an error naming the smallest reachable costs when the
    space cannot meet them."""
    budgets = budgets_from_limits(limits, ctx.workload)
    smallest = smallest_reachable(ctx.space, ctx.costs, list(budgets))
    if any(smallest[m] > b for m, b in budgets.items()):
        raise_unreachable(ctx, limits, budgets, smallest)
    return budgets


def raise_unreachable(ctx, limits, budgets, smallest=None, as_measured=False) -> None:
    if as_measured:
        raise AutoCompressError(
            "no architecture in the search space meets the limits as measured on "
            f"{ctx.cost_model.target.name}: the cost model is optimistic here, and the budgets "
            "corrected by its measured error are below the smallest reachable costs",
            hint="loosen the limits, or refit the cost model (autocompress costmodel fit)")
    smallest = smallest or smallest_reachable(ctx.space, ctx.costs, list(budgets))
    parts = []
    for m, b in budgets.items():
        status = "unreachable" if smallest[m] > b else "reachable alone"
        parts.append(f"{m} <= {b:.4g} ({status}; smallest reachable: "
                     f"{reachable_text(m, smallest[m], limits, ctx.workload)})")
    raise AutoCompressError(
        "no architecture in the search space meets every limit: " + "; ".join(parts),
        hint="loosen the limits, or widen the space (smaller hidden/FFN fractions, no-op blocks)",
    )


def _step_info(rec: dict[str, Any]) -> str:
    ratios = " ".join(f"{m.split('_')[0]} {1 + g:.2f}" for m, g in rec["g"].items())
    lams = " ".join(f"λ {v:.2f}" for v in rec["lambda"].values())
    held = "mode" if rec.get("constraint") == "mode" else "E"
    return f"kl {rec['kl']:.3f}  {held}/budget {ratios}  {lams}  τ {rec['tau']:.2f}"


def _interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("AUTOCOMPRESS_QUIET")


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
    from autocompress.search.ablations import run_greedy, run_random

    config = config or SearchConfig()
    if method == "autocompress":
        return run_search(ctx, limits, config, progress=progress)
    if method == "minitron":
        return run_minitron(ctx, limits=limits, config=config, progress=progress)
    if method in ("greedy", "random"):
        _need_costs(ctx)
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
