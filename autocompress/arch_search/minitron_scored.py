"""``--method minitron-scored``: homogeneous candidates through greedy's selection.

The control that isolates heterogeneity. The Minitron baseline (``minitron``) and the
greedy ablation differ in two things at once: greedy's candidates are heterogeneous
(each layer its own widths), and greedy short-lists them by *measured KL right after
pruning, spread over depth*, where the baseline short-lists the largest by parameters
of each attention shape. This method keeps the baseline's candidates and gives them
greedy's selection, so a gap between it and greedy is heterogeneity alone:

- **candidates**: ``minitron.candidates`` — the same grid (one hidden size, attention
  shape and FFN width for every layer) with the same depth freedom (any number of the
  layers the space may empty, least important by block importance first);
- **within the budgets**: those the cost tables put within the current bounds; of
  those, only the ones no other within-budget candidate covers (at least as large on
  every axis, no more layers dropped): greedy's repair fills a budget's slack the same
  way, never keeping a block smaller than the budget allows;
- **ranked by measured KL right after pruning** (``MeasuredKL`` on the search's score
  batches, the random ablation's ranking; the masked teacher forward is the pruned
  model, exactly), best first;
- **the same final pick and measured loop**: ``final_pick.FinalPick`` (short list of
  ``selection.top_k`` spread over depth, each given the baseline's short distillation,
  timed on the target best KL first) inside ``context.measured_loop`` (time the pick,
  re-aim a missed timing budget by the cost model's error, pick again).
"""

from __future__ import annotations

import time

from autocompress.arch_search.ablations import AblationOutcome, _outcome
from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import (
    SearchContext,
    check_reachable,
    measured_loop,
    raise_unreachable,
)
from autocompress.arch_search.discretize import CostTables, MeasuredKL, checked_tables, feasible
from autocompress.arch_search.final_pick import FinalPick
from autocompress.arch_search.minitron import Candidate, candidates
from autocompress.arch_search.selection import Finalist, layers_kept
from autocompress.arch_search.space import SearchSpace
from autocompress.limits import Limits
from autocompress.progress import Bar


def widest_within(space: SearchSpace, pool: list[Candidate], tables: CostTables,
                  bounds: dict[str, float]) -> list[Candidate]:
    """The candidates of ``pool`` within ``bounds`` that no other one within them covers
    (largest first)."""
    fits = [c for c in pool if feasible(tables.evaluate(c.choice), bounds)]
    fits.sort(key=lambda c: (-c.params, len(c.dropped), c.hidden, c.attention, c.ffn))
    kept: list[Candidate] = []
    for cand in fits:  # a cover has at least as many parameters: it is already in ``kept``
        if not any(other.covers(cand, space) for other in kept):
            kept.append(cand)
    return kept


def is_homogeneous(space: SearchSpace, choice) -> bool:
    """Every layer that has a block has the same attention option and the same FFN option,
    and every other layer is empty (both no-ops)."""
    spec = space.spec_of(choice)
    kept = [layer for layer in spec.layers if not layer.is_empty]
    return len({(layer.attention, layer.ffn) for layer in kept}) == 1 and \
        all(layer.attention is not None and layer.ffn is not None for layer in kept)


def run_minitron_scored(ctx: SearchContext, limits: Limits, config: SearchConfig,
                        progress: bool = False) -> AblationOutcome:
    """Minitron's homogeneous grid, greedy's final pick and measured loop (module doc)."""
    started = time.perf_counter()
    budgets = check_reachable(ctx, limits)
    space = ctx.space
    tables = checked_tables(space, ctx.costs, budgets)
    pool = candidates(space, ctx.importance, config.minitron)
    kl = MeasuredKL(ctx.masked, ctx.score_batches(config))
    final = FinalPick(ctx, config, progress, budgets=budgets)

    def within(bounds) -> list[Candidate]:  # best KL first, each measured once
        found = widest_within(space, pool, tables, bounds)
        if not found:
            raise_unreachable(ctx, limits, budgets, as_measured=bounds != budgets)
        bar = Bar("homogeneous candidates", len(found), progress)
        for i, cand in enumerate(found):
            kl(cand.choice)
            bar.update(i + 1, "")
        bar.close()
        return sorted(found, key=lambda c: (kl(c.choice), -c.params, c.hidden, c.attention,
                                            c.ffn))

    def finalists(bounds) -> list[Finalist]:
        return [Finalist(c.choice, kl(c.choice), "homogeneous", layers_kept(space, c.choice),
                         extra={"dropped_layers": c.dropped})
                for c in within(bounds)]

    def pick(bounds):
        return final.choose(lambda: finalists(bounds)).choice

    choice, rounds = measured_loop(ctx, config, pick, space.spec_of, budgets, dict(budgets),
                                   final.timer, aim=lambda bounds: within(bounds)[0].choice)
    return _outcome(ctx, "minitron-scored", limits, budgets, space.spec_of(choice), rounds,
                    started, len(kl.memo),
                    {"choice": choice.to_dict(), "kl": kl(choice), "grid": len(pool)}, final)
