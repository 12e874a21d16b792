"""Ablations of the search: what the differentiable search adds, under the same rules.

Both run on the search's ``SearchContext`` (teacher, importance, space, cost
model), meet the same budgets under the same cost tables, make the same final
pick (``final_pick.FinalPick``: the short list of their candidates, each given the
baseline's short distillation) and go through the same measured loop on the
target (``context.measured_loop``: time the pick, re-aim a missed timing budget by
the cost model's error on it, pick again):

- ``greedy`` — repair from the teacher without DNAS. The anchor is the teacher
  itself; every option of every block (and every hidden size) is scored by the
  measured KL change of that one change on the search's score batches, and the
  search's own ``repair`` (restore feasibility cheapest-first, fill slack, pair
  exchanges, every hidden size, and the depth variants) gives the candidates. The search scores
  only a neighbourhood of its DNAS answer; from the teacher that neighbourhood
  would forbid the widths a tight budget needs, so greedy scores every option.
- ``random`` — random search in the same space. ``candidates`` legal
  architectures that the cost model predicts within the budgets are drawn, each
  is scored by KL to the teacher on the same score batches, and those within the
  loop's current budgets, best KL first, are the final pick's candidates. The default count
  is what the full search evaluates: one sampled architecture per DNAS step plus
  the most single-change scores its repair can take in this space (the search's
  report gives its exact count, ``scored_candidates``). Drawing uniformly over
  option indices puts nearly every sample near the teacher's cost (most blocks
  kept) and almost never under a tight budget, so each draw first picks its own
  removal rate ``r ~ U(0, 1)``: every removable block is a no-op with probability
  ``r``, else one of its other options uniformly; the hidden size is uniform.
  Draws that use less than ``min_budget_use`` of every budget are rejected (a
  random search should spend its budget; relaxed to 0 if too few are found).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from autocompress.arch import ArchSpec
from autocompress.arch_search.config import RandomConfig, SearchConfig
from autocompress.arch_search.context import (
    SearchContext,
    check_reachable,
    final_check,
    measured_loop,
    measured_rank,
    raise_unreachable,
    shared_report,
    teacher_scores,
)
from autocompress.arch_search.discretize import (
    CostTables,
    MeasuredKL,
    checked_tables,
    feasible,
    measured_job_list,
    repair,
)
from autocompress.arch_search.final_pick import FinalPick
from autocompress.arch_search.measured import MeasuredRound
from autocompress.arch_search.selection import Finalist, layers_kept, repaired_finalists
from autocompress.arch_search.space import Choice, SearchSpace
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.progress import Bar


def search_evaluations(space: SearchSpace, dnas_steps: int, radius: int | None) -> int:
    """The most architectures the full search evaluates: one per DNAS step, the anchor, and
    every single-change score within ``radius`` of an anchor in the middle of the space."""
    evaluations = dnas_steps + 1 + len(space.hidden_options) - 1
    for kind in ("attention", "ffn"):
        options = getattr(space, f"{kind}_options")
        allowed = getattr(space, f"allowed_{kind}")
        sized = len(options) - (options[-1] is None)
        for layer in range(space.num_layers):
            near = sized - 1 if radius is None else min(sized - 1, 2 * radius)
            evaluations += near + int(options[-1] is None and bool(allowed[layer, -1]))
    return evaluations


def searched_count(space: SearchSpace, config: SearchConfig) -> int:
    """What the search scores under ``config``: its final pick's depth variants score every
    option at DNAS's answer, and its teacher side (or DNAS's start on greedy's answer) every
    option at the teacher."""
    depth = config.selection.varies_depth
    count = search_evaluations(space, config.dnas.steps, None if depth else config.score_radius)
    if config.scores_at_teacher:
        count += len(measured_job_list(space, space.full_choice(), None)) + 1
    return count


# ------------------------------------------------------------------ random search


def sample_choices(space: SearchSpace, tables: CostTables, budgets: dict[str, float],
                   count: int, seed: int, config: RandomConfig) -> tuple[list[Choice], dict]:
    """``count`` distinct legal choices predicted within ``budgets`` (see the module doc)."""
    rng = np.random.default_rng(seed)
    att_ok, ffn_ok = space.allowed_attention.numpy(), space.allowed_ffn.numpy()
    noop_a = len(space.attention_options) - 1 if space.attention_options[-1] is None else None
    noop_f = len(space.ffn_options) - 1 if space.ffn_options[-1] is None else None
    seen: set[Choice] = set()
    floor, tries = config.min_budget_use, 0
    while len(seen) < count:
        if tries == config.max_tries:
            if floor == 0:
                break
            floor, tries = 0.0, 0
        tries += 1
        rate = rng.random()
        attention = tuple(_draw(rng, att_ok[i], noop_a, rate) for i in range(space.num_layers))
        if noop_a is not None and all(a == noop_a for a in attention):
            continue  # at least one attention block
        ffn = tuple(_draw(rng, ffn_ok[i], noop_f, rate) for i in range(space.num_layers))
        choice = Choice(int(rng.integers(len(space.hidden_options))), attention, ffn)
        if choice in seen:
            continue
        costs = tables.evaluate(choice)
        if feasible(costs, budgets) and max(costs[m] / b for m, b in budgets.items()) >= floor:
            seen.add(choice)
    if not seen:
        raise AutoCompressError("random search drew no architecture within the budgets",
                                hint="loosen the limits, or use another method")
    return sorted(seen, key=lambda c: (c.hidden, c.attention, c.ffn)), \
        {"min_budget_use": floor, "requested": count, "drawn": len(seen)}


def _draw(rng, allowed: np.ndarray, noop: int | None, rate: float) -> int:
    if noop is not None and allowed[noop] and rng.random() < rate:
        return noop
    options = [k for k in range(len(allowed)) if allowed[k] and k != noop]
    return int(options[rng.integers(len(options))])


# ------------------------------------------------------------------ outcomes


@dataclass
class AblationOutcome:
    """An ablation's architecture, its checks and what it evaluated."""

    method: str
    spec: ArchSpec
    limits: Limits
    budgets: dict[str, float]
    prediction: Any
    checks: list[Any]
    seconds: dict[str, float]
    scored_candidates: int
    details: dict[str, Any] = field(default_factory=dict)
    measured_rounds: list[MeasuredRound] = field(default_factory=list)

    def report(self, ctx: SearchContext) -> dict[str, Any]:
        return {
            "kind": self.method,
            **shared_report(ctx, self.spec, self.limits, self.budgets, self.prediction,
                            self.checks),
            "scored_candidates": self.scored_candidates,
            "seconds": self.seconds,
            "measured_rounds": [r.model_dump() for r in self.measured_rounds],
            "space": ctx.space.describe(),
            **self.details,
            "arch": self.spec.to_dict(),
        }


def _outcome(ctx: SearchContext, method: str, limits: Limits, budgets: dict[str, float],
             spec: ArchSpec, rounds: list[MeasuredRound], started: float, scored: int,
             details: dict[str, Any], final: FinalPick) -> AblationOutcome:
    prediction, checks = final_check(ctx, spec, limits)
    return AblationOutcome(method=method, spec=spec, limits=limits, budgets=budgets,
                           prediction=prediction, checks=checks,
                           seconds={"total": time.perf_counter() - started,
                                    "selection": final.seconds,
                                    "final_pick": final.parts()},
                           scored_candidates=scored,
                           details={**details, "selection": final.report()},
                           measured_rounds=rounds)


def run_greedy(ctx: SearchContext, limits: Limits, config: SearchConfig,
               progress: bool = False) -> AblationOutcome:
    """Repair from the teacher with every option scored there; the search's measured loop."""
    started = time.perf_counter()
    budgets = check_reachable(ctx, limits)
    space, anchor = ctx.space, ctx.space.full_choice()
    scores = teacher_scores(ctx, config, progress)
    rank = measured_rank(ctx, config)
    inner = dict(budgets)
    final = FinalPick(ctx, config, progress, budgets=budgets)

    def answer(bounds):  # repair from the teacher, untrained
        found = repair(space, ctx.costs, bounds, anchor, scores, rank=rank)
        if found is None:
            raise_unreachable(ctx, limits, budgets, as_measured=bounds != inner)
        return found

    def pick(bounds):
        return final.choose(lambda: repaired_finalists(
            space, ctx.costs, bounds, anchor, scores, answer(bounds), final.depth, rank)).found

    found, rounds = measured_loop(ctx, config, pick, lambda f: space.spec_of(f.choice),
                                  budgets, inner, final.timer, aim=answer)
    return _outcome(ctx, "greedy", limits, budgets, space.spec_of(found.choice), rounds,
                    started, len(measured_job_list(space, anchor, None)) + 1,
                    {"choice": found.choice.to_dict(), "repair_changes": found.changes,
                     "per_hidden": found.per_hidden}, final)


@torch.no_grad()
def run_random(ctx: SearchContext, limits: Limits, config: SearchConfig,
               progress: bool = False) -> AblationOutcome:
    """The best of ``config.random.candidates`` random architectures; the measured loop."""
    started = time.perf_counter()
    budgets = check_reachable(ctx, limits)
    space = ctx.space
    tables = checked_tables(space, ctx.costs, budgets)
    count = config.random.candidates or searched_count(space, config)
    pool, drawn = sample_choices(space, tables, budgets, count, config.dnas.seed, config.random)
    kl = MeasuredKL(ctx.masked, ctx.score_batches(config))
    bar = Bar("random candidates", len(pool), progress)
    ranked = []
    for i, choice in enumerate(pool):
        ranked.append(kl(choice))
        bar.update(i + 1, "")
    bar.close()
    ranked.sort()
    final = FinalPick(ctx, config, progress, budgets=budgets)

    def within(bounds):  # the pool's candidates within the bounds, best KL first
        found = sorted((c for c in pool if feasible(tables.evaluate(c), bounds)),
                       key=lambda c: (kl(c), c.hidden, c.attention, c.ffn))
        if not found:
            raise_unreachable(ctx, limits, budgets, as_measured=True)
        return found

    def pick(bounds):
        return final.choose(lambda: [Finalist(c, kl(c), "random", layers_kept(space, c))
                                     for c in within(bounds)]).choice

    choice, rounds = measured_loop(ctx, config, pick, space.spec_of, budgets, dict(budgets),
                                   final.timer, aim=lambda bounds: within(bounds)[0])
    return _outcome(ctx, "random", limits, budgets, space.spec_of(choice), rounds, started,
                    len(pool), {"choice": choice.to_dict(), "kl": kl(choice), "sampling": drawn,
                                "kl_of_candidates": {"min": ranked[0],
                                                     "median": float(np.median(ranked)),
                                                     "max": ranked[-1]}}, final)
