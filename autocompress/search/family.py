"""A Pareto family from one search (``autocompress run --budgets 0.3,0.4,0.5,0.6,0.7``).

What one search of one target shares across budgets: the teacher, its importance,
the cost model, the calibration batches and their teacher outputs, the DNAS
trajectory and the measured single-change scores. So the family runs **one** DNAS
at the middle budget, scores every option of every block once around its answer
(``score_radius`` None: repair may have to walk far from the anchor for the
loosest and tightest budgets), and then, per budget, repairs that anchor to the
budget exactly and runs the usual measured loop on the target. Each member is a
``SearchOutcome`` like a search's; only the DNAS and the scores are shared.
"""

from __future__ import annotations

import time

import torch

from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.search.discretize import measured_scores, probability_scores, repair
from autocompress.search.dnas import DNAS

FAMILY_MIN = 2


def anchor_index(count: int) -> int:
    """The member whose budget the shared DNAS aims at: the middle one."""
    return count // 2


def run_family(ctx, limits_list: list[Limits], config, progress: bool = False) -> list:
    """One ``SearchOutcome`` per entry of ``limits_list`` (loosest to tightest or any order)."""
    from autocompress.search.run import (
        SAFETY,
        SearchOutcome,
        check_reachable,
        final_check,
        measured_loop,
        raise_unreachable,
    )

    if len(limits_list) < FAMILY_MIN:
        raise AutoCompressError("a family needs at least two budgets",
                                hint="e.g. --budgets 0.3,0.5,0.7 (one budget: --budget-fraction)")
    all_budgets = [check_reachable(ctx, limits) for limits in limits_list]
    middle = anchor_index(len(limits_list))
    t0, c0 = time.perf_counter(), time.process_time()
    data = ctx.calibration(config.dnas.seq_len)
    dnas = DNAS(ctx.masked, ctx.costs, all_budgets[middle], config.dnas).run(
        lambda step: data.batch_at(step, config.dnas.batch_size, config.dnas.seed))
    anchor = dnas.argmax_choice(ctx.space)
    scores = (measured_scores(ctx.masked, anchor, ctx.score_batches(config), radius=None)
              if config.score == "measured" else None)
    fallback = probability_scores(ctx.space, dnas.probabilities(ctx.space))
    shared_s = time.perf_counter() - t0
    evaluations = {"dnas_steps": len(dnas.trajectory),
                   "measured_scores": 0 if scores is None else _count_scores(scores)}
    members = []
    for limits, budgets in zip(limits_list, all_budgets, strict=True):
        t1 = time.perf_counter()
        inner = {m: b * (1 - SAFETY) for m, b in budgets.items()}

        def pick(bounds, limits=limits, budgets=budgets, inner=inner):
            found = repair(ctx.space, ctx.costs, bounds, anchor, scores) \
                if scores is not None else None
            found = found or repair(ctx.space, ctx.costs, bounds, anchor, fallback)
            if found is None:
                raise_unreachable(ctx, limits, budgets, as_measured=bounds != inner)
            return found

        found, rounds = measured_loop(ctx, config, pick, lambda f: ctx.space.spec_of(f.choice),
                                       budgets, inner)
        spec = ctx.space.spec_of(found.choice)
        prediction, checks = final_check(ctx, spec, limits)
        own = time.perf_counter() - t1
        seconds = {"shared": shared_s, "own": own, "total": shared_s + own,
                   "cpu_total": time.process_time() - c0, "threads": torch.get_num_threads()}
        members.append(SearchOutcome(spec=spec, limits=limits, budgets=budgets,
                                     prediction=prediction, checks=checks, dnas=dnas,
                                     discretized=found, seconds=seconds,
                                     measured_rounds=rounds, evaluations=evaluations))
    return members


def _count_scores(scores) -> int:
    import numpy as np

    return int(np.isfinite(scores.attention).sum() + np.isfinite(scores.ffn).sum()
               + np.isfinite(scores.hidden).sum())
