"""The Minitron baseline: homogeneous pruning, matched fairly to the search.

Minitron (arXiv 2407.14679, 2408.11796) and its NVIDIA ModelOpt implementation
(``mcore_minitron``) prune *uniformly*: one hidden size, one attention shape and
one FFN width for every layer, and may drop whole layers (least important by
block importance). Here is what this module takes from them and what is ours.

Follows ModelOpt / Minitron:

- candidates are homogeneous in width (hidden size, query heads, KV heads, FFN
  width) and may drop the least important layers (block importance, cosine);
- importance is Minitron's activation importance, the same orders the search's
  masks use (every candidate is a prefix of one order per axis);
- among the candidates that meet the constraint, ``top_k`` (ModelOpt's default, 10)
  are ranked by a score, and the best is kept; ModelOpt takes the ``top_k`` largest
  by parameter count (``shortlist="largest"``);
- the score is taken after a short distillation of each of them with the same
  small budget (the Minitron papers pick among candidates after light
  retraining: the ranking right after pruning is not the one after training);
  the winner is then distilled fully by the flow's distillation stage.

Ours, so that the comparison with the search is fair:

- **the constraint** is the measured latency/memory limits on the target, not a
  parameter count (``minitron_matched``; ``minitron_for_params`` keeps the plain
  ModelOpt form). Candidates come from the search space's own options (same
  granularity), so the two methods differ only in heterogeneity;
- **depth freedom and protected layers are the search's**: any number of the
  layers the space lets the search empty may be dropped (by default every one
  but the first and last), not half of them;
- **every candidate that could meet the limit is timed on the target** (random
  weights, the search's measured harness and guard band: measurement plus its
  noise within the budget), so none is dropped because *another* candidate
  missed. "Could meet" = predicted within ``timing_band`` of every timing budget
  (and within the other budgets). Candidates are timed largest first, which is
  the order of the selection, and timing stops once ``top_k`` have met the
  limits (and, for a spread short list, every attention shape has its largest
  that met): smaller ones cannot enter the short list, so the pick is the one
  timing all of them would give (``time_all`` times all). A candidate at least as large
  as a measured miss on every axis (width, heads, KV heads, FFN, layers kept) is
  recorded as a miss without being timed (timing is monotone in size; not with
  ``time_all``);
- **the short list is spread** (``shortlist="spread"``, the default), as the search's is
  spread over depths: the largest candidate of every attention shape first, then the
  largest of the rest. Ranking by parameters alone favours candidates that keep the FFN
  and hidden width and cut attention, which costs few parameters but much quality (on
  SmolLM2 at 50% of its llama.cpp TPOT, all ten largest kept 2-4 of its 9 heads);
- **the pick is timed a second time** (``confirm``), as the search's is: the best
  after the short distillation must meet the limits there too (where that timing
  misses, a third decides), else it drops out and the next is picked (among several
  candidates near the limit, the ones that met tend to be those that read low);
- the short distillation's budget, data and seed are the same for every
  candidate, and it is scored by KL to the teacher on fixed calibration batches
  that neither the training stream nor the benchmarks use
  (``autocompress.arch_search.selection``). ``distill_tokens=0`` ranks by that KL
  without training (ModelOpt's score-only form).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec, LayerSpec
from autocompress.arch_search.discretize import CostTables, feasible
from autocompress.arch_search.measured import TIMING_METRICS, Reading, judged
from autocompress.arch_search.space import Choice, SearchSpace
from autocompress.errors import AutoCompressError
from autocompress.importance import Importance

# measure(spec) -> (metrics, noise); score(candidates) -> one value each, lower is better.
Measure = Callable[[ArchSpec], tuple[dict[str, float], dict[str, float]]]
# (spec, meets) -> the reading that stands after a second timing (``SpecTimer.confirm``)
Confirm = Callable[[ArchSpec, Callable[[dict, dict], bool]], Reading]
Score = Callable[[list["Candidate"]], list[float]]


class MinitronConfig(BaseModel):
    """How the baseline enumerates, times and picks homogeneous candidates."""

    model_config = ConfigDict(extra="forbid")

    max_depth_drop: int | None = Field(
        default=None, ge=0,
        description="Most layers that may be dropped (0 = width only; None = every layer "
        "the search space may empty, i.e. all but the protected ones).",
    )
    top_k: int = Field(default=10, ge=1,
                       description="Feasible candidates that are scored (ModelOpt: 10).")
    shortlist: Literal["spread", "largest"] = Field(
        default="spread",
        description="Which top_k: 'largest' by parameters (ModelOpt), or 'spread': the "
        "largest of every attention shape first, then the largest of the rest (see the "
        "module's docstring for why).")
    depth_metric: str = Field(default="cosine", description="Block importance for depth pruning.")
    timing_band: float = Field(
        default=0.10, ge=0,
        description="Candidates predicted at most this fraction over a timing budget are "
        "timed on the target (they could meet it if the cost model is pessimistic there).")
    time_all: bool = Field(
        default=False, description="Time every candidate that could meet the limits, not only "
        "until top_k have met them.")
    distill_tokens: int = Field(
        default=32_768, ge=0,
        description="Short distillation of each top-k candidate before scoring (the same for "
        "each); 0 = score right after pruning.")
    distill_seq_len: int = Field(default=128, ge=2)
    distill_batch_size: int = Field(default=8, ge=1)
    distill_lr: float = Field(default=1e-3, gt=0)
    score_batches: int = Field(
        default=8, ge=1, description="Calibration batches (of the search's shape) for the score.")


@dataclass
class Candidate:
    """One homogeneous architecture (and, once timed, its measurement)."""

    hidden: int
    attention: int
    ffn: int
    dropped: list[int]
    params: int
    choice: Choice
    spec: ArchSpec
    costs: dict[str, float] = field(default_factory=dict)
    measured: dict[str, float] | None = None
    noise: dict[str, float] | None = None
    met: bool | None = None  # None: not timed
    confirmed: dict[str, float] | None = None  # the pick's second timing (``confirm``)
    confirmed_noise: dict[str, float] | None = None
    skipped_by: int | None = None  # params of the timed miss it is at least as large as
    score: float | None = None

    def describe(self, space: SearchSpace) -> dict[str, Any]:
        att = space.attention_options[self.attention]
        return {
            "hidden_size": space.hidden_options[self.hidden],
            "num_heads": att.num_heads,
            "num_kv_heads": att.num_kv_heads,
            "intermediate_size": space.ffn_options[self.ffn].intermediate_size,
            "num_layers": space.num_layers - len(self.dropped),
            "dropped_layers": self.dropped,
            "params": self.params,
            "costs": self.costs,
            "measured": self.measured,
            "noise": self.noise,
            "met": self.met,
            "confirmed": self.confirmed,
            "score": self.score,
        }

    def covers(self, other: Candidate, space: SearchSpace) -> bool:
        """At least as large as ``other`` on every axis (so at least as slow)."""
        mine, theirs = space.attention_options[self.attention], \
            space.attention_options[other.attention]
        return (space.hidden_options[self.hidden] >= space.hidden_options[other.hidden]
                and mine.num_heads >= theirs.num_heads
                and mine.num_kv_heads >= theirs.num_kv_heads
                and space.ffn_options[self.ffn].intermediate_size
                >= space.ffn_options[other.ffn].intermediate_size
                and len(self.dropped) <= len(other.dropped))


@dataclass
class BaselineResult:
    """The chosen homogeneous architecture and the candidates considered."""

    spec: ArchSpec
    candidate: Candidate
    param_target: int
    scored: list[Candidate]
    num_candidates: int
    mode: str
    timed: list[Candidate] = field(default_factory=list)
    could_meet: int = 0


# ------------------------------------------------------------------ candidates


def droppable_layers(space: SearchSpace) -> list[int]:
    """Layers the search may empty (both no-ops allowed): the baseline may drop the same."""
    if space.attention_options[-1] is not None or space.ffn_options[-1] is not None:
        return []
    return [i for i in range(space.num_layers)
            if bool(space.allowed_attention[i, -1]) and bool(space.allowed_ffn[i, -1])]


def depth_order(space: SearchSpace, importance: Importance, metric: str) -> list[int]:
    """Droppable layers, least important first."""
    scores = importance.depth_scores(metric)
    return sorted(droppable_layers(space), key=lambda i: (float(scores[i]), i))


def homogeneous_spec(space: SearchSpace, importance: Importance, hidden: int, attention: int,
                     ffn: int, dropped: list[int]) -> ArchSpec:
    """The uniform spec. Dropped layers are left out when ``prune`` would drop the same ones
    (it drops by cosine importance, first and last protected); else they stay as empty
    layers, which ``prune`` keeps in place."""
    layer = LayerSpec(attention=space.attention_options[attention], ffn=space.ffn_options[ffn])
    update = {"hidden_size": space.hidden_options[hidden]}
    if not dropped or sorted(importance.layers_to_drop(len(dropped))) == sorted(dropped):
        update["layers"] = [layer] * (space.num_layers - len(dropped))
    else:
        update["layers"] = [LayerSpec() if i in dropped else layer
                            for i in range(space.num_layers)]
    return space.teacher.model_copy(update=update)


def candidates(space: SearchSpace, importance: Importance,
               config: MinitronConfig | None = None) -> list[Candidate]:
    """Every homogeneous architecture of the space, with 0 up to ``max_depth_drop`` layers gone."""
    config = config or MinitronConfig()
    order = depth_order(space, importance, config.depth_metric)
    most = len(order) if config.max_depth_drop is None else min(config.max_depth_drop,
                                                                  len(order))
    noop_a, noop_f = len(space.attention_options) - 1, len(space.ffn_options) - 1
    out = []
    for drop in range(most + 1):
        dropped = sorted(order[:drop])
        for h in range(len(space.hidden_options)):
            for a, att in enumerate(space.attention_options):
                for f, ffn in enumerate(space.ffn_options):
                    if att is None or ffn is None:
                        continue
                    choice = Choice(h, tuple(noop_a if i in dropped else a
                                             for i in range(space.num_layers)),
                                    tuple(noop_f if i in dropped else f
                                          for i in range(space.num_layers)))
                    spec = homogeneous_spec(space, importance, h, a, f, dropped)
                    out.append(Candidate(h, a, f, dropped, spec.num_params(), choice, spec))
    return out


def _largest_first(cands: list[Candidate]) -> list[Candidate]:
    return sorted(cands, key=lambda c: (-c.params, len(c.dropped), c.hidden, c.attention, c.ffn))


def shortlist(pool: list[Candidate], config: MinitronConfig) -> list[Candidate]:
    """The ``top_k`` candidates that are scored (``config.shortlist``)."""
    ranked = _largest_first(pool)
    if config.shortlist == "largest":
        return ranked[: config.top_k]
    firsts: dict[int, Candidate] = {}
    for cand in ranked:  # the largest of every attention shape, largest first
        firsts.setdefault(cand.attention, cand)
    heads = list(firsts.values())[: config.top_k]
    return heads + [c for c in ranked if c not in heads][: config.top_k - len(heads)]


def _short_list_settled(met: list[Candidate], untimed_shapes: Counter[int],
                        config: MinitronConfig) -> bool:
    """Whether timing more candidates (smaller ones, largest first) can change the short list:
    not once ``top_k`` met and, for 'spread', every attention shape still untimed (counted
    in ``untimed_shapes``) has one."""
    if len(met) < config.top_k:
        return False
    shapes = {c.attention for c in met}
    return config.shortlist == "largest" or all(
        shape in shapes for shape, left in untimed_shapes.items() if left)


# ------------------------------------------------------------------ selection


def _pick(pool: list[Candidate], target: int, config: MinitronConfig, score: Score | None,
          mode: str, total: int) -> BaselineResult:
    top = shortlist(pool, config)
    if score is not None and len(top) > 1:
        todo = [c for c in top if c.score is None]  # scored once, across re-picks
        for cand, value in zip(todo, score(todo) if todo else [], strict=True):
            cand.score = float(value)
        best = min(top, key=lambda c: (c.score, -c.params))
    else:
        best = top[0]
    return BaselineResult(spec=best.spec, candidate=best, param_target=target, scored=top,
                          num_candidates=total, mode=mode)


def minitron_for_params(space: SearchSpace, importance: Importance, target_params: int,
                        score: Score | None = None,
                        config: MinitronConfig | None = None) -> BaselineResult:
    """Homogeneous architecture with at most ``target_params`` parameters (ModelOpt's form)."""
    config = config or MinitronConfig()
    pool = candidates(space, importance, config)
    fitting = [c for c in pool if c.params <= target_params]
    if not fitting:
        smallest = min(c.params for c in pool)
        raise AutoCompressError(
            f"no homogeneous architecture has at most {target_params:,} parameters "
            f"(the smallest has {smallest:,})",
            hint="raise --params or widen the search space (smaller fractions, more depth drop)",
        )
    return _pick(fitting, target_params, config, score, "params", len(pool))


def could_meet(costs: dict[str, float], budgets: dict[str, float], band: float) -> bool:
    """Within every budget, timing budgets widened by ``band`` (the cost model's error)."""
    return all(costs[m] <= b * (1 + band) if m in TIMING_METRICS else costs[m] <= b
               for m, b in budgets.items())


def meets_as_measured(costs: dict[str, float], measured: dict[str, float],
                      noise: dict[str, float], budgets: dict[str, float]) -> bool:
    """What the reading judges (timings, and memory where it measured it): measurement plus
    its noise within the budget (the search's guard band); the rest (memory it did not
    measure): the prediction, as in the search's measured loop."""
    judged_here = judged(budgets, measured)
    return all(measured[m] + noise.get(m, 0.0) <= b if m in judged_here
               else costs[m] <= b for m, b in budgets.items())


def time_candidates(space: SearchSpace, pool: list[Candidate], budgets: dict[str, float],
                    measure: Measure, config: MinitronConfig,
                    progress: Callable[[int, int], None] | None = None) -> list[Candidate]:
    """Time the candidates that could meet ``budgets``, largest first; returns those timed
    (each with ``measured``/``noise``/``met``). Unless ``time_all``, it stops once more
    timing cannot change the short list (``top_k`` met, and for 'spread' every attention
    shape's largest that met) and marks a candidate covering a timed miss a miss untimed."""
    todo = _largest_first([c for c in pool if could_meet(c.costs, budgets, config.timing_band)])
    timed: list[Candidate] = []
    misses: list[Candidate] = []
    met: list[Candidate] = []
    untimed_shapes = Counter(c.attention for c in todo)  # the shapes of todo[i:]
    for i, cand in enumerate(todo):
        if not config.time_all and _short_list_settled(met, untimed_shapes, config):
            break
        untimed_shapes[cand.attention] -= 1
        if not config.time_all and len(met) >= config.top_k and \
                cand.attention in {c.attention for c in met}:
            continue  # its shape has its largest that met; top_k are met: it cannot enter
        cover = None if config.time_all else next(
            (m for m in misses if cand.covers(m, space)), None)
        if cover is not None:
            cand.met, cand.skipped_by = False, cover.params
            continue
        cand.measured, cand.noise = measure(cand.spec)
        cand.met = meets_as_measured(cand.costs, cand.measured, cand.noise, budgets)
        timed.append(cand)
        (met if cand.met else misses).append(cand)
        if progress is not None:
            progress(i + 1, len(todo))
    return timed


def minitron_matched(space: SearchSpace, importance: Importance, costs,
                     budgets: dict[str, float], measure: Measure | None = None,
                     score: Score | None = None, config: MinitronConfig | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     confirm: Confirm | None = None) -> BaselineResult:
    """Homogeneous architecture that meets ``budgets``: the top-k largest that meet them
    (as measured with ``measure``, else as predicted), the best by ``score``. Given
    ``confirm`` (a second timing, ``SpecTimer.confirm``), the best must meet them there too;
    one that does not drops out and the pick is made again from the rest."""
    config = config or MinitronConfig()
    tables = CostTables(costs, list(budgets))
    pool = candidates(space, importance, config)
    for cand in pool:
        cand.costs = tables.evaluate(cand.choice)
    timed: list[Candidate] = []
    if measure is None:
        meeting = [c for c in pool if feasible(c.costs, budgets)]
    else:
        timed = time_candidates(space, pool, budgets, measure, config, progress)
        meeting = [c for c in timed if c.met]
    while True:
        if not meeting:
            raise _none_meets(pool, timed, budgets, measure is not None)
        result = _pick(meeting, max(c.params for c in meeting), config, score, "matched",
                       len(pool))
        if confirm is None or not timed or _confirmed(result.candidate, budgets, confirm):
            break
        meeting = [c for c in meeting if c is not result.candidate]
    result.timed = timed
    result.could_meet = sum(could_meet(c.costs, budgets, config.timing_band) for c in pool)
    return result


def _confirmed(cand: Candidate, budgets: dict[str, float], confirm: Confirm) -> bool:
    """Whether ``cand`` meets ``budgets`` in the reading that stands after its second timing
    too (``SpecTimer.confirm``; recorded on it)."""
    def meets(measured, noise):
        return meets_as_measured(cand.costs, measured, noise, budgets)

    cand.confirmed, cand.confirmed_noise = confirm(cand.spec, meets)
    cand.met = meets(cand.confirmed, cand.confirmed_noise)
    return cand.met


def _none_meets(pool: list[Candidate], timed: list[Candidate], budgets: dict[str, float],
                measured: bool) -> AutoCompressError:
    smallest = {m: min(c.costs[m] for c in pool) for m in budgets}
    shown = ", ".join(f"{m} <= {budgets[m]:.4g} (smallest homogeneous predicted: "
                      f"{smallest[m]:.4g})" for m in budgets)
    how = f"as measured ({len(timed)} candidates timed)" if measured else "as predicted"
    return AutoCompressError(f"no homogeneous architecture meets the limits {how}: {shown}",
                             hint="loosen the limits, or allow more depth pruning")
