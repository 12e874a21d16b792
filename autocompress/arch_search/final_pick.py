"""After the search: repair an answer to the budgets, then the final pick among candidates.

``Repairs`` turns one DNAS answer into candidates within any budgets (what the search,
the joint search and the Pareto family share); ``FinalPick`` gives a short list of a
method's candidates the baseline's short distillation and keeps the lowest KL that
meets the budgets as measured (what the search and its ablations share).
"""

from __future__ import annotations

import time
from typing import Any

from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import (
    SearchContext,
    at_hidden,
    measured_rank,
    scores_at,
    short_distill,
    spec_timer,
    teacher_scores,
)
from autocompress.arch_search.discretize import (
    CostTables,
    Discretized,
    Scores,
    feasible,
    measured_job_list,
    probability_scores,
    repair,
    within_radius,
)
from autocompress.arch_search.dnas import DNASResult
from autocompress.arch_search.measured import (
    MET,
    MISSED,
    WITHIN_NOISE,
    is_untimed,
    missed_budgets,
    verdict,
)
from autocompress.arch_search.selection import (
    Finalist,
    Sides,
    best_scored,
    repaired_finalists,
    select,
)

# Repair aims this far inside each budget so float rounding in predict() cannot flip it.
SAFETY = 1e-9


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
        # Short-listed candidates that met as measured, all rounds (or read within noise of
        # the budgets twice: the timing cannot judge them, ``measured.verdict``).
        self.met: list[Finalist] = []
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
        met_now = [f for f in short
                   if timed.get(f.choice, {}).get("verdict") in (MET, WITHIN_NOISE)]
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
        last_round = len(self.rounds) + 1 >= self.config.short_list_rounds
        if not self.met or not (last_round or any(f is best for f in met_now)):
            return best
        return min(self.met, key=lambda f: (f.kl, f.estimate))

    def _timed(self, short: list[Finalist]) -> dict:
        """Time the short list, best KL first, up to the first that meets the budgets (so at
        most one timed candidate has met them); with ``confirm_timing`` it must meet them
        in the reading that stands after a second timing too (``SpecTimer.confirm``). A
        reading within noise of the budgets is taken again (``SpecTimer.recheck``); one that
        still cannot tell also ends the walk: a busy machine's noise is no reason to fall
        back on a smaller candidate."""
        if self.timer is None or self.budgets is None:
            return {}
        out = {}
        for f in sorted(short, key=lambda f: (f.kl, f.estimate)):
            spec = self.ctx.space.spec_of(f.choice)
            measured, noise = self.timer(spec)
            row = {"measured": {m: measured[m] for m in self.budgets},
                   **({"timed": False} if is_untimed(noise) else {})}
            said = self._verdict(measured, noise)
            if said == MET and self.config.confirm_timing:
                measured, noise = self.timer.confirm(spec, self._meets)
                row["confirmed"] = {m: measured[m] for m in self.budgets}
                said = self._verdict(measured, noise)
            if said == WITHIN_NOISE:
                measured, noise = self.timer.recheck(spec, self._meets)
                row["rechecked"] = {m: measured[m] for m in self.budgets}
                said = self._verdict(measured, noise)
            out[f.choice] = {**row, "met": said == MET, "verdict": said}
            if said != MISSED:
                break
        return out

    def _verdict(self, measured: dict[str, float], noise: dict[str, float]) -> str:
        return verdict(self.budgets, measured, noise, self.timer.drift)

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
