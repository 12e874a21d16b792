"""``--method mip``: a Puzzle-style pick, solved exactly as a mixed-integer program.

Puzzle (arXiv 2411.19146) scores every block variant of every layer, then picks one
variant per layer with a mixed-integer program under the deployment's constraints. Here
the scores are the greedy ablation's — every option of every block measured at the
teacher (``context.teacher_scores``: the KL change of that one change) — and the
constraints are the cost model's own per-block tables (``CostTables``), so the program's
cost of a choice is the cost ``CostModel.predict`` gives it. For each hidden size, HiGHS
(``highspy``) finds the choice with the lowest total score under **every** budget:

- one binary per allowed (layer, option) of each block kind, exactly one per block;
- at least one attention block (``SearchSpace.is_legal``);
- each timing budget: the tables' sum (constant + blocks) within it;
- memory: weights and KV pages (additive) plus the activation peak, modelled exactly
  with a continuous ``peak`` at least every present block's activation (under a dynamic
  KV cache a block also holds the cache of the layers before it; an absent block's
  constraint is switched off with a big-M bound);
- optionally, exactly ``n`` layers kept (both blocks of the others no-ops).

The gap is set to zero, so each answer is the optimum of its program, not a near one;
every answer is evaluated again with the tables (and ``CostModel.predict`` at the end),
and a choice that misses there (the memory mirror drifting from the cost model) is cut
off and the program solved again.

Then, exactly as the greedy ablation: the candidates (each hidden size's optimum and,
with ``selection.depth_variants``, the optimum at every depth) go through
``final_pick.FinalPick`` (short list spread over depth, the same short distillation)
and ``context.measured_loop`` (time, re-aim, pick again). Greedy's repair is a
heuristic answer to the same program: the report gives both totals (``objective``,
``greedy_repair_score``) so "the exact program matches or beats the relaxation" can be
read off.
"""

from __future__ import annotations

import importlib.metadata
import time
from dataclasses import dataclass

import highspy
import numpy as np

from autocompress.arch_search.ablations import _outcome
from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import (
    SearchContext,
    check_reachable,
    measured_loop,
    measured_rank,
    raise_unreachable,
    teacher_scores,
)
from autocompress.arch_search.discretize import (
    CostTables,
    Scores,
    checked_tables,
    feasible,
    measured_job_list,
    repair,
)
from autocompress.arch_search.final_pick import FinalPick
from autocompress.arch_search.selection import Finalist, layers_kept
from autocompress.arch_search.space import Choice, SearchSpace
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits

# Budgets are tightened by this fraction in the program: the solver's feasibility
# tolerance (1e-9 here) must not let a choice a hair over a budget through.
MARGIN = 1e-9
_MAX_CUTS = 50  # re-solves after a choice the tables reject (memory drift); then an error


@dataclass
class Solved:
    """One program's optimum."""

    choice: Choice
    objective: float  # its total score (``Scores.total``)
    kept: int | None  # the depth it was held to (None: free)


class _Program:
    """A small 0-1 program in HiGHS, built row by row (sparse ``{column: coefficient}``)."""

    def __init__(self):
        self.highs = highspy.Highs()
        for option, value in (("output_flag", False), ("mip_rel_gap", 0.0),
                              ("mip_abs_gap", 0.0), ("primal_feasibility_tolerance", 1e-9),
                              ("mip_feasibility_tolerance", 1e-9), ("threads", 1),
                              ("random_seed", 0)):
            self.highs.setOptionValue(option, value)
        self.count = 0

    def column(self, cost: float, lower: float = 0.0, upper: float = 1.0,
               binary: bool = True) -> int:
        self.highs.addVar(lower, upper)
        index = self.count
        self.count += 1
        self.highs.changeColCost(index, float(cost))
        if binary:
            self.highs.changeColIntegrality(index, highspy.HighsVarType.kInteger)
        return index

    def row(self, terms: dict[int, float], lower: float = -highspy.kHighsInf,
            upper: float = highspy.kHighsInf) -> None:
        cols = np.fromiter(terms.keys(), dtype=np.int32, count=len(terms))
        vals = np.fromiter(terms.values(), dtype=np.float64, count=len(terms))
        self.highs.addRow(float(lower), float(upper), len(terms), cols, vals)

    def solve(self) -> np.ndarray | None:
        self.highs.run()
        if self.highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return np.asarray(self.highs.getSolution().col_value)


def _plus(terms: dict[int, float], col: int, value: float) -> None:
    terms[col] = terms.get(col, 0.0) + float(value)


def solve_hidden(space: SearchSpace, tables: CostTables, scores: Scores,
                 budgets: dict[str, float], hidden: int, kept: int | None = None,
                 excluded: list[Choice] = ()) -> Solved | None:
    """The lowest-score choice at hidden size ``hidden`` within ``budgets`` (None: none),
    with exactly ``kept`` non-empty layers if given, and none of ``excluded``."""
    if not np.isfinite(scores.hidden[hidden]):
        return None
    prog = _Program()
    L = space.num_layers
    # x[kind][layer] = {option: column}; an option is usable if allowed and scored
    x: dict[str, list[dict[int, int]]] = {}
    for kind in ("attention", "ffn"):
        table = scores.block(kind)
        x[kind] = [{k: prog.column(table[layer, k]) for k in range(table.shape[1])
                    if np.isfinite(table[layer, k])} for layer in range(L)]
        for layer in range(L):
            if not x[kind][layer]:
                return None
            prog.row({c: 1.0 for c in x[kind][layer].values()}, 1.0, 1.0)  # one option
    present_a = [o is not None for o in space.attention_options]
    prog.row({c: 1.0 for layer in range(L) for k, c in x["attention"][layer].items()
              if present_a[k]}, lower=1.0)  # at least one attention block
    for metric, budget in budgets.items():
        bound = budget * (1 - MARGIN) - tables.const[metric][hidden]
        terms: dict[int, float] = {}
        for kind in ("attention", "ffn"):
            cost = getattr(tables, kind)[metric]
            for layer in range(L):
                for k, c in x[kind][layer].items():
                    _plus(terms, c, cost[layer, k, hidden])
        if metric == "memory_gb":
            peak = prog.column(0.0, 0.0, highspy.kHighsInf, binary=False)
            _plus(terms, peak, 1.0)
            _peak_rows(prog, tables, x, hidden, peak)
        prog.row(terms, upper=bound)
    if kept is not None:
        _depth_row(prog, space, x, kept)
    for choice in excluded:  # no-good cuts: not this exact choice again
        if choice.hidden != hidden:
            continue
        picked = [x["attention"][i].get(choice.attention[i]) for i in range(L)] + \
            [x["ffn"][i].get(choice.ffn[i]) for i in range(L)]
        if None not in picked:
            prog.row({c: 1.0 for c in picked}, upper=len(picked) - 1)
    values = prog.solve()
    if values is None:
        return None
    def pick(kind):
        return tuple(max(x[kind][layer], key=lambda k: values[x[kind][layer][k]])
                     for layer in range(L))
    choice = Choice(hidden, pick("attention"), pick("ffn"))
    return Solved(choice, scores.total(choice), kept)


def _peak_rows(prog: _Program, tables: CostTables, x, h: int, peak: int) -> None:
    """``peak`` ≥ the activation memory of every present block (``CostTables._peak``)."""
    t = tables._memory_tables
    L = len(x["attention"])
    att = {part: v[:, :, h] for part, v in t["attention"].items()}
    ffn = {part: v[:, :, h] for part, v in t["ffn"].items()}
    c_pre, c_dec = float(t["const"]["prefill_act"][h]), float(t["const"]["decode_act"][h])
    a_on, f_on = t["attention_present"], t["ffn_present"]
    if not t["dynamic_cache"]:  # a block's value is its own: linear in its one-hot option
        for kind, parts, on in (("attention", att, a_on), ("ffn", ffn, f_on)):
            for layer in range(L):
                terms = {peak: 1.0}
                for k, c in x[kind][layer].items():
                    if on[layer, k]:
                        _plus(terms, c, -(c_pre + parts["prefill_act"][layer, k]))
                prog.row(terms, lower=0.0)
        return
    # Under a dynamic cache the values sum over layers: switch absent blocks off with M.
    big = (abs(c_pre) + abs(c_dec) + sum(float(np.abs(att[p]).max(1).sum())
                                         for p in ("kv_prefill", "kv_final"))
           + max(float(np.abs(att["prefill_act"]).max()), float(np.abs(att["decode_act"]).max()),
                 float(np.abs(ffn["prefill_act"]).max())) + 1.0)

    def kv(part: str, layers) -> dict[int, float]:
        terms: dict[int, float] = {}
        for j in layers:
            for k, c in x["attention"][j].items():
                _plus(terms, c, att[part][j, k])
        return terms

    for layer in range(L):
        # attention, prefill: the cache up to and including this layer + its activations
        # attention, decode: every layer's final cache + its decode activations
        for const, cache, act in ((c_pre, kv("kv_prefill", range(layer + 1)), "prefill_act"),
                                  (c_dec, kv("kv_final", range(L)), "decode_act")):
            terms = {peak: 1.0, **{c: -v for c, v in cache.items()}}
            for k, c in x["attention"][layer].items():
                _plus(terms, c, -att[act][layer, k] - (big if a_on[layer, k] else 0.0))
            prog.row(terms, lower=const - big)
        # FFN, prefill: the cache up to and including this layer's attention + its own
        terms = {peak: 1.0, **{c: -v for c, v in kv("kv_prefill", range(layer + 1)).items()}}
        for k, c in x["ffn"][layer].items():
            _plus(terms, c, -ffn["prefill_act"][layer, k] - (big if f_on[layer, k] else 0.0))
        prog.row(terms, lower=c_pre - big)


def _depth_row(prog: _Program, space: SearchSpace, x, kept: int) -> None:
    """Exactly ``kept`` layers have a block: ``empty[l]`` = both of its no-ops chosen."""
    noop_a, noop_f = len(space.attention_options) - 1, len(space.ffn_options) - 1
    empties: dict[int, float] = {}
    for layer in range(space.num_layers):
        a = x["attention"][layer].get(noop_a) if space.attention_options[noop_a] is None \
            else None
        f = x["ffn"][layer].get(noop_f) if space.ffn_options[noop_f] is None else None
        if a is None or f is None:
            continue
        empty = prog.column(0.0, binary=False)  # integral through the three rows
        prog.row({empty: 1.0, a: -1.0}, upper=0.0)
        prog.row({empty: 1.0, f: -1.0}, upper=0.0)
        prog.row({empty: 1.0, a: -1.0, f: -1.0}, lower=-1.0)
        empties[empty] = 1.0
    prog.row(empties, space.num_layers - kept, space.num_layers - kept)


def solve(space: SearchSpace, costs, scores: Scores, budgets: dict[str, float],
          kept: int | None = None) -> list[Solved]:
    """Every hidden size's optimum within ``budgets`` (best first; [] if none), each checked
    with the exact tables (a choice they reject is cut off and its program re-solved)."""
    tables = checked_tables(space, costs, budgets)
    found = []
    for h in range(len(space.hidden_options)):
        excluded: list[Choice] = []
        while True:
            solved = solve_hidden(space, tables, scores, budgets, h, kept, excluded)
            if solved is None or feasible(tables.evaluate(solved.choice), budgets):
                break
            excluded.append(solved.choice)
            if len(excluded) > _MAX_CUTS:
                raise AutoCompressError(  # the tables and the program disagree: a bug
                    "internal error: the integer program's memory model disagrees with the "
                    f"cost tables on {_MAX_CUTS} choices in a row")
        if solved is not None:
            found.append(solved)
    return sorted(found, key=lambda s: (s.objective, s.choice.hidden))


# ------------------------------------------------------------------ the method


def mip_finalists(space: SearchSpace, costs, scores: Scores, budgets: dict[str, float],
                  depth: bool, rank=None) -> list[Finalist]:
    """The program's answer first (the best hidden size), the other hidden sizes' optima,
    then with ``depth`` the optimum at every number of layers kept: greedy's repair
    answer, its alternatives and its depth variants, found exactly."""
    out = []
    solved = solve(space, costs, scores, budgets)
    depths = range(1, space.num_layers + 1) if depth else ()
    for n in depths:
        solved += solve(space, costs, scores, budgets, kept=n)
    for s in solved:
        estimate = rank(s.choice) if rank else s.objective
        origin = "mip" if s.kept is None else f"mip, {s.kept} layers"
        out.append(Finalist(s.choice, estimate, origin, layers_kept(space, s.choice),
                            extra={"objective": s.objective}))
    return out


def run_mip(ctx: SearchContext, limits: Limits, config: SearchConfig, progress: bool = False):
    """The exact program on greedy's scores; greedy's final pick and measured loop."""
    started = time.perf_counter()
    budgets = check_reachable(ctx, limits)
    space, anchor = ctx.space, ctx.space.full_choice()
    scores = teacher_scores(ctx, config, progress)
    rank = measured_rank(ctx, config)
    final = FinalPick(ctx, config, progress, budgets=budgets)
    solve_seconds = [0.0]

    def answer(bounds) -> Finalist:  # the program's own answer, untrained
        return candidates(bounds, depth=False)[0]

    def candidates(bounds, depth: bool) -> list[Finalist]:
        t0 = time.perf_counter()
        found = mip_finalists(space, ctx.costs, scores, bounds, depth, rank)
        solve_seconds[0] += time.perf_counter() - t0
        if not found:
            raise_unreachable(ctx, limits, budgets, as_measured=bounds != budgets)
        return found

    def pick(bounds):
        return final.choose(lambda: candidates(bounds, final.depth)).choice

    choice, rounds = measured_loop(ctx, config, pick, space.spec_of, budgets, dict(budgets),
                                   final.timer, aim=lambda bounds: answer(bounds).choice)
    own = answer(budgets)  # at the limits themselves, beside greedy's repair there
    greedy = repair(space, ctx.costs, budgets, anchor, scores)
    return _outcome(ctx, "mip", limits, budgets, space.spec_of(choice), rounds, started,
                    len(measured_job_list(space, anchor, None)) + 1,
                    {"choice": choice.to_dict(), "objective": scores.total(choice),
                     "program_answer": own.choice.to_dict(),
                     "program_objective": own.extra["objective"],
                     "greedy_repair_score": greedy.score if greedy else None,
                     "solver": f"highspy {importlib.metadata.version('highspy')}",
                     "solve_seconds": solve_seconds[0]}, final)
