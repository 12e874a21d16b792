"""A Pareto family from one search (``autocompress run --budget-fraction 0.3,0.4,0.5,0.6,0.7``).

What one search of one target shares across budgets: the teacher, its importance,
the cost model, the calibration batches and their teacher outputs, the DNAS
trajectory and the measured single-change scores. So the family runs **one** DNAS
at the middle budget, scores every option of every block once around its answer
(``score_radius`` None: repair may have to walk far from the anchor for the
loosest and tightest budgets), and then, per budget, repairs that anchor to the
budget exactly, makes the search's final pick (``run.FinalPick``) among that
budget's candidates and runs the usual measured loop on the target. The final
pick's short-distillation scores are kept across the budgets (a candidate
short-listed at two budgets is trained once; the teacher's outputs on the training
batches are cached on disk by ``distill`` for all of them). Each member is a
``SearchOutcome`` like a search's; the DNAS, the scores and the final pick's
scores are shared.

The budgets are picked from the tightest to the loosest, and each tighter budget's
pick joins the looser budgets' short lists (where it meets them, as predicted): a
looser budget then never ends with a model worse, by the final pick's score, than
a tighter budget's, so the family is a front rather than independent picks whose
short lists happened to differ.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from autocompress.arch_search.context import (
    check_reachable,
    final_check,
    measured_loop,
    raise_unreachable,
)
from autocompress.arch_search.dnas import DNAS
from autocompress.arch_search.final_pick import SAFETY, FinalPick, Repairs
from autocompress.arch_search.run import SearchOutcome
from autocompress.arch_search.selection import Finalist
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits

FAMILY_MIN = 2


def anchor_index(count: int) -> int:
    """The member whose budget the shared DNAS aims at: the middle one."""
    return count // 2


def run_family(ctx, limits_list: list[Limits], config, progress: bool = False) -> list:
    """One ``SearchOutcome`` per entry of ``limits_list`` (loosest to tightest or any order)."""
    if len(limits_list) < FAMILY_MIN:
        raise AutoCompressError("a family needs at least two budgets",
                                hint="e.g. --budget-fraction 0.3,0.5,0.7 (one budget: 0.5)")
    all_budgets = [check_reachable(ctx, limits) for limits in limits_list]
    middle = anchor_index(len(limits_list))
    t0, c0 = time.perf_counter(), time.process_time()
    data = ctx.calibration(config.dnas.seq_len)
    dnas = DNAS(ctx.masked, ctx.costs, all_budgets[middle], config.dnas).run(
        lambda step: data.batch_at(step, config.dnas.batch_size, config.dnas.seed))
    memo: dict = {}  # the final pick's short-distillation scores, shared by every budget
    repairs = Repairs(ctx, config, ctx.costs, dnas, None, progress)
    shared_s = time.perf_counter() - t0
    members: dict[int, SearchOutcome] = {}
    picked: list[Finalist] = []  # the tighter budgets' picks, offered to the looser ones
    for i in tightest_first(all_budgets):
        limits, budgets = limits_list[i], all_budgets[i]
        t1 = time.perf_counter()
        inner = {m: b * (1 - SAFETY) for m, b in budgets.items()}
        final = FinalPick(ctx, config, progress, memo=memo, budgets=budgets, carried=picked)

        def unreachable(bounds, limits=limits, budgets=budgets, inner=inner):
            raise_unreachable(ctx, limits, budgets, as_measured=bounds != inner)

        found, rounds = measured_loop(
            ctx, config, lambda bounds, final=final: repairs.pick(bounds, final, unreachable),
            lambda f: ctx.space.spec_of(f.choice), budgets, inner, final.timer,
            aim=lambda bounds: repairs.answer(bounds, unreachable)[0])
        spec = ctx.space.spec_of(found.choice)
        prediction, checks = final_check(ctx, spec, limits)
        own = time.perf_counter() - t1
        seconds = {"shared": shared_s, "own": own, "selection": final.seconds,
                   "final_pick": final.parts(),
                   "total": shared_s + own, "cpu_total": time.process_time() - c0,
                   "threads": torch.get_num_threads()}
        members[i] = SearchOutcome(spec=spec, limits=limits, budgets=budgets,
                                   prediction=prediction, checks=checks, dnas=dnas,
                                   discretized=found, seconds=seconds, measured_rounds=rounds,
                                   evaluations=repairs.evaluations, selection=final.report())
        chosen = final.chosen
        if chosen is not None and all(chosen is not p for p in picked):
            picked = picked + [replace(chosen, origin=f"{_budget_text(budgets)}: {chosen.origin}")]
    return [members[i] for i in range(len(limits_list))]


def tightest_first(all_budgets: list[dict[str, float]]) -> list[int]:
    """Member indices from the tightest budgets to the loosest (each metric's budget relative
    to its loosest), so that every member can be offered the tighter members' picks: a
    looser budget's model is then never worse, by the final pick's score, than a tighter
    one's, and the family is a front."""
    loosest = {m: max(b[m] for b in all_budgets) for m in all_budgets[0]}
    return sorted(range(len(all_budgets)),
                  key=lambda i: sum(all_budgets[i][m] / loosest[m] for m in loosest))


def _budget_text(budgets: dict[str, float]) -> str:
    return "pick under " + ", ".join(f"{m} ≤ {v:.4g}" for m, v in budgets.items())
