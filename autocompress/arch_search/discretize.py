"""Discretize + repair: one architecture that meets every budget *exactly*.

The search ends with probabilities; their argmax (the *anchor*) is close to
the budgets but meets them only in expectation. Repair turns it into a legal
choice whose cost under the cost model's tables — equal to ``CostModel.predict``
— is within every budget, then spends the leftover slack:

1. per-option **scores** (lower is better, additive over choices): either the
   measured loss change ``KL(teacher ‖ anchor with one choice changed) −
   KL(teacher ‖ anchor)`` on calibration batches (``measured_scores``), or the
   negative log-probabilities of the search (``probability_scores``);
2. for every hidden size, **greedy repair**: while a budget is violated, apply
   the single block change with the smallest score increase per unit of
   violation removed (relative violations ``max(0, cost/budget − 1)`` summed);
3. **slack filling**: while some single change improves the score and stays
   within every budget, apply the one with the best score gain per unit of
   budget it uses; then **pair exchanges** (one block up, one down) that
   improve the score and stay feasible;
4. the best hidden size wins (by total score, or by a measured KL: ``MeasuredKL``). If no
   choice in the space meets the budgets, ``AutoCompressError`` states the smallest
   reachable value of each budget.

Every candidate's cost is evaluated exactly from the tables (the memory peak
included), and the result is checked once more with ``CostModel.predict``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from autocompress.arch import LayerSpec
from autocompress.arch_search.space import Choice, SearchSpace, SpaceShape
from autocompress.losses import kd_loss

EPS = 1e-12


# --------------------------------------------------------------- cost tables


class CostTables:
    """Numpy view of ``AdditiveCosts`` for fast exact evaluation of discrete choices."""

    def __init__(self, costs, metrics: list[str], exact_memory: bool = False):
        self.costs = costs
        self.metrics = list(metrics)
        self.const = {m: costs.const[m].numpy() for m in metrics}
        self.attention = {m: costs.attention[m].numpy() for m in metrics}
        self.ffn = {m: costs.ffn[m].numpy() for m in metrics}
        self.num_layers = costs.num_layers
        self.exact_memory = exact_memory  # True: ask the cost model for every memory value
        self._memory_tables = _memory_tables(costs) if "memory_gb" in metrics else None

    def evaluate(self, choice: Choice) -> dict[str, float]:
        """Exact cost of ``choice`` per metric (equals ``AdditiveCosts.discrete``)."""
        layers = np.arange(self.num_layers)
        a, f, h = np.asarray(choice.attention), np.asarray(choice.ffn), choice.hidden
        out = {}
        for m in self.metrics:
            total = float(self.const[m][h] + self.attention[m][layers, a, h].sum()
                          + self.ffn[m][layers, f, h].sum())
            if m == "memory_gb":
                total = self.memory(choice) if self.exact_memory \
                    else total + self._peak(layers, a, f, h)
            out[m] = total
        return out

    def evaluate_moves(self, choice: Choice, moves: Moves,
                       rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """``evaluate`` of ``choice`` with each of ``moves`` applied, one array per metric.

        The sums are ``evaluate``'s, row by row, so every value is the same float. With
        memory (its peak is not additive) each move is evaluated on its own, only the
        ``rows`` asked for (the rest are NaN)."""
        n = len(moves)
        if "memory_gb" in self.metrics:
            out = {m: np.full(n, np.nan) for m in self.metrics}
            for i in range(n) if rows is None else np.flatnonzero(rows):
                costs = self.evaluate(_apply(choice, moves.move(i)))
                for m in self.metrics:
                    out[m][i] = costs[m]
            return out
        layers = np.arange(self.num_layers)
        a, f, h = np.asarray(choice.attention), np.asarray(choice.ffn), choice.hidden
        att_rows, ffn_rows = np.flatnonzero(moves.attention), np.flatnonzero(~moves.attention)
        out = {}
        for m in self.metrics:
            att = np.tile(self.attention[m][layers, a, h], (n, 1))
            ffn = np.tile(self.ffn[m][layers, f, h], (n, 1))
            att[att_rows, moves.layer[att_rows]] = \
                self.attention[m][moves.layer[att_rows], moves.option[att_rows], h]
            ffn[ffn_rows, moves.layer[ffn_rows]] = \
                self.ffn[m][moves.layer[ffn_rows], moves.option[ffn_rows], h]
            out[m] = self.const[m][h] + att.sum(1) + ffn.sum(1)
        return out

    def memory(self, choice: Choice) -> float:
        """Memory from the cost model itself (slow: an expectation over one-hot vectors)."""
        return self.costs.discrete(list(choice.attention), list(choice.ffn),
                                   choice.hidden)["memory_gb"]

    def _peak(self, layers, a, f, h) -> float:
        """The activation peak of one architecture (``AdditiveCosts._expected_peak`` one-hot).

        Memory is weights (summed above) plus the largest per-block activation; under a
        dynamic KV cache a block also holds the cache of the layers before it.
        """
        t = self._memory_tables
        att = {k: v[layers, a, h] for k, v in t["attention"].items()}
        ffn = {k: v[layers, f, h] for k, v in t["ffn"].items()}
        c_pre, c_dec = t["const"]["prefill_act"][h], t["const"]["decode_act"][h]
        if not t["dynamic_cache"]:
            att_value = c_pre + att["prefill_act"]
            ffn_value = c_pre + ffn["prefill_act"]
        else:
            before = np.concatenate([[0.0], np.cumsum(att["kv_prefill"])[:-1]])
            others_final = att["kv_final"].sum() - att["kv_final"]
            att_value = np.maximum(c_pre + before + att["kv_prefill"] + att["prefill_act"],
                                   c_dec + others_final + att["kv_final"] + att["decode_act"])
            ffn_value = c_pre + before + att["kv_prefill"] + ffn["prefill_act"]
        att_value = np.where(t["attention_present"][layers, a], att_value, 0.0)
        ffn_value = np.where(t["ffn_present"][layers, f], ffn_value, 0.0)
        return float(max(0.0, att_value.max(), ffn_value.max()))

    def check_memory(self, choice: Choice) -> None:
        """Switch to the cost model's own memory if the fast path disagrees with it."""
        if self._memory_tables is None or self.exact_memory:
            return
        fast = self.evaluate(choice)["memory_gb"]
        exact = self.memory(choice)
        if abs(fast - exact) > 1e-9 * max(1.0, abs(exact)):
            self.exact_memory = True


def checked_tables(space, costs, budgets: dict[str, float]) -> CostTables:
    """Tables of ``budgets``' metrics, on the cost model's own memory if the fast path
    disagrees with it on the space's full choice."""
    tables = CostTables(costs, list(budgets))
    tables.check_memory(space.full_choice())
    return tables


def _memory_tables(costs) -> dict[str, Any]:
    """Numpy copies of the cost model's activation-peak pieces."""
    return {
        "attention": {k: v.numpy() for k, v in costs.attention_memory.items()},
        "ffn": {k: v.numpy() for k, v in costs.ffn_memory.items()},
        "const": {k: v.numpy() for k, v in costs.const_memory.items()},
        "attention_present": costs.attention_present.numpy(),
        "ffn_present": costs.ffn_present.numpy(),
        "dynamic_cache": bool(costs.dynamic_cache),
    }


def violation(costs: dict[str, float], budgets: dict[str, float]) -> float:
    """Sum of relative excesses ``max(0, cost/budget − 1)``."""
    return float(violations(costs, budgets))


def violations(costs: dict[str, np.ndarray], budgets: dict[str, float]) -> np.ndarray:
    """``violation`` of many candidates at once (arrays of costs) or of one (floats)."""
    total = 0.0
    for m, b in budgets.items():
        total = total + np.maximum(0.0, costs[m] / b - 1.0)
    return total


def feasible(costs: dict[str, float], budgets: dict[str, float]) -> bool:
    return all(costs[m] <= b for m, b in budgets.items())


# -------------------------------------------------------------------- scores


@dataclass
class Scores:
    """Additive per-option scores (lower = better; inf = not allowed)."""

    hidden: np.ndarray  # [H]
    attention: np.ndarray  # [L, Ka]
    ffn: np.ndarray  # [L, Kf]
    source: str = ""

    def total(self, choice: Choice) -> float:
        layers = np.arange(len(choice.attention))
        return float(self.hidden[choice.hidden]
                     + self.attention[layers, np.asarray(choice.attention)].sum()
                     + self.ffn[layers, np.asarray(choice.ffn)].sum())

    def block(self, kind: str) -> np.ndarray:
        return self.attention if kind == "attention" else self.ffn


def _forbid(space: SearchSpace, attention: np.ndarray, ffn: np.ndarray):
    attention = np.where(space.allowed_attention.numpy(), attention, np.inf)
    ffn = np.where(space.allowed_ffn.numpy(), ffn, np.inf)
    return attention, ffn


def probability_scores(space: SearchSpace, probabilities) -> Scores:
    """``−log p`` of each option under the search's final distribution."""
    p_h, p_a, p_f = (p.detach().double().clamp_min(1e-30).log().neg().numpy()
                     for p in probabilities)
    p_a, p_f = _forbid(space, p_a, p_f)
    return Scores(p_h, p_a, p_f, source="probability")


@torch.no_grad()
def teacher_logits(model, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(input_ids=b).logits for b in batches]


@torch.no_grad()
def choice_kl(masked, choice: Choice, batches: list[torch.Tensor],
              reference: list[torch.Tensor]) -> float:
    """Mean KL(teacher ‖ choice) over the batches (nats per token)."""
    return _mean_kl((masked.forward_choice(b, choice) for b in batches), reference)


class MeasuredKL:
    """``choice_kl`` on fixed batches, each choice measured once: how the random ablation
    ranks its draws, and repaired candidates with ``SelectionConfig.estimate='measured'``."""

    def __init__(self, masked, batches: list[torch.Tensor]):
        self.masked, self.batches = masked, batches
        self.reference = teacher_logits(masked.model, batches)
        self.memo: dict[Choice, float] = {}

    def __call__(self, choice: Choice) -> float:
        if choice not in self.memo:
            self.memo[choice] = choice_kl(self.masked, choice, self.batches, self.reference)
        return self.memo[choice]


def _mean_kl(logits: Iterable[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Mean KL over the batches; ``logits`` may be lazy (one vocabulary-wide batch at a time)."""
    return sum(float(kd_loss(a[:, :-1], r[:, :-1]))
               for a, r in zip(logits, reference, strict=True)) / len(reference)


@torch.no_grad()
def block_change_kl(masked, choice: Choice, block: int, batches: list[torch.Tensor],
                    entering: list[list[torch.Tensor]], reference: list[torch.Tensor]) -> float:
    """``choice_kl`` of a choice that differs from the one ``entering`` was taken at
    (``MaskedTeacher.block_inputs``) only in ``block`` (2i: layer i's attention, 2i+1: its
    FFN): the blocks before it are unchanged, so the forward starts from its input."""
    logits = (masked.forward_from(b, choice, block, states[block])
              for b, states in zip(batches, entering, strict=True))
    return _mean_kl(logits, reference)


def _neighbourhood(space: SearchSpace, kind: str, layer: int, anchor: int,
                   radius: int | None) -> list[int]:
    """Allowed options within ``radius`` size ranks of the anchor's (plus the no-op)."""
    options = space.attention_options if kind == "attention" else space.ffn_options
    allowed = space.allowed_attention if kind == "attention" else space.allowed_ffn
    candidates = [k for k in range(len(options)) if bool(allowed[layer, k]) and k != anchor]
    if radius is None:
        return candidates
    teacher = space.teacher
    sizes = [teacher.attention_params(LayerSpec(attention=o)) if kind == "attention"
             else teacher.ffn_params(LayerSpec(ffn=o)) for o in options]
    ranked = sorted(range(len(options)), key=lambda k: (-sizes[k], k))
    pos = ranked.index(anchor)
    near = set(ranked[max(0, pos - radius): pos + radius + 1])
    return [k for k in candidates if k in near or options[k] is None]


def measured_scores(masked, anchor: Choice, batches: list[torch.Tensor],
                    radius: int | None = 2, progress=None) -> Scores:
    """Loss change of single-option changes from ``anchor`` (the anchor scores 0).

    Only options within ``radius`` size ranks of the anchor's (and the no-op) are
    measured; the others score inf, so repair stays in a neighbourhood of the
    search's answer (None measures every option).
    """
    space = masked.space
    reference = teacher_logits(masked.model, batches)
    base = choice_kl(masked, anchor, batches, reference)
    hidden = np.zeros(len(space.hidden_options))
    attention = np.full((space.num_layers, len(space.attention_options)), np.inf)
    ffn = np.full((space.num_layers, len(space.ffn_options)), np.inf)
    jobs = measured_job_list(space, anchor, radius)
    # A one-block change leaves the blocks before it as they are: run from there.
    entering = [masked.block_inputs(b, anchor) for b in batches]
    for kind, layer, k in jobs:
        cand = Choice(k, anchor.attention, anchor.ffn) if kind == "hidden" \
            else anchor.replace_block(kind, layer, k)
        value = np.inf
        if kind == "hidden":
            value = choice_kl(masked, cand, batches, reference) - base
        elif space.is_legal(cand):
            value = block_change_kl(masked, cand, 2 * layer + (kind == "ffn"), batches,
                                    entering, reference) - base
        if kind == "hidden":
            hidden[k] = value
        else:
            (attention if kind == "attention" else ffn)[layer, k] = value
        if progress is not None:
            progress()
    for layer in range(space.num_layers):
        attention[layer, anchor.attention[layer]] = 0.0
        ffn[layer, anchor.ffn[layer]] = 0.0
    attention, ffn = _forbid(space, attention, ffn)
    return Scores(hidden, attention, ffn, source="measured")


def within_radius(space: SearchSpace, scores: Scores, anchor: Choice,
                  radius: int | None) -> Scores:
    """``scores`` with every option farther than ``radius`` size ranks from the anchor's
    (the no-op excepted) set to inf: what ``measured_scores(radius=radius)`` would give."""
    if radius is None:
        return scores
    tables = {"attention": scores.attention.copy(), "ffn": scores.ffn.copy()}
    for kind, table in tables.items():
        for layer in range(space.num_layers):
            current = getattr(anchor, kind)[layer]
            keep = set(_neighbourhood(space, kind, layer, current, radius)) | {current}
            for k in range(table.shape[1]):
                if k not in keep:
                    table[layer, k] = np.inf
    return replace(scores, attention=tables["attention"], ffn=tables["ffn"])


def measured_job_list(space: SearchSpace, anchor: Choice,
                      radius: int | None) -> list[tuple[str, int, int]]:
    """The (kind, layer, option) evaluations ``measured_scores`` runs."""
    jobs = [("hidden", 0, h) for h in range(len(space.hidden_options)) if h != anchor.hidden]
    for layer in range(space.num_layers):
        for kind, current in (("attention", anchor.attention[layer]),
                              ("ffn", anchor.ffn[layer])):
            jobs += [(kind, layer, k)
                     for k in _neighbourhood(space, kind, layer, current, radius)]
    return jobs


# -------------------------------------------------------------------- repair


@dataclass
class Discretized:
    """The repaired architecture and how it was reached."""

    choice: Choice
    costs: dict[str, float]
    score: float
    anchor: Choice
    anchor_costs: dict[str, float]
    changes: list[dict[str, Any]] = field(default_factory=list)
    per_hidden: list[dict[str, Any]] = field(default_factory=list)
    score_source: str = ""
    # The other hidden sizes' repaired choices, best first (the final selection's candidates).
    alternatives: list[Discretized] = field(default_factory=list)


@dataclass
class Moves:
    """Every allowed single-block change of one choice, as parallel arrays (layer by layer,
    its attention options before its FFN options: the order repair breaks ties in)."""

    attention: np.ndarray  # bool: an attention move (else an FFN move)
    layer: np.ndarray
    option: np.ndarray

    @classmethod
    def of(cls, space: SearchSpace, choice: Choice) -> Moves:
        allowed_a, allowed_f = space.allowed_attention.numpy(), space.allowed_ffn.numpy()
        k_a = allowed_a.shape[1]
        other_a = np.arange(k_a)[None, :] != np.asarray(choice.attention)[:, None]
        other_f = np.arange(allowed_f.shape[1])[None, :] != np.asarray(choice.ffn)[:, None]
        layer, column = np.nonzero(np.concatenate([allowed_a & other_a, allowed_f & other_f], 1))
        attention = column < k_a
        return cls(attention, layer, np.where(attention, column, column - k_a))

    def __len__(self) -> int:
        return len(self.layer)

    def move(self, i: int) -> tuple[str, int, int]:
        """The ``i``-th move as ``(kind, layer, option)``."""
        return ("attention" if self.attention[i] else "ffn", int(self.layer[i]),
                int(self.option[i]))

    def subset(self, keep: np.ndarray) -> Moves:
        return Moves(self.attention[keep], self.layer[keep], self.option[keep])

    def legal(self, space: SearchSpace, choice: Choice) -> np.ndarray:
        """``space.is_legal`` of each move's result: every option allowed (each move's
        own is) and at least one attention block left."""
        allowed_a = space.allowed_attention.numpy()
        allowed_f = space.allowed_ffn.numpy()
        layers = np.arange(space.num_layers)
        a, f = np.asarray(choice.attention), np.asarray(choice.ffn)
        bad_a, bad_f = ~allowed_a[layers, a], ~allowed_f[layers, f]
        present = np.array([o is not None for o in space.attention_options])
        own_bad = np.where(self.attention, bad_a[self.layer], bad_f[self.layer])
        bad_after = int(bad_a.sum() + bad_f.sum()) - own_bad
        kept_after = np.full(len(self), int(present[a].sum()))
        rows = np.flatnonzero(self.attention)
        kept_after[rows] += present[self.option[rows]].astype(int) \
            - present[a[self.layer[rows]]].astype(int)
        return (bad_after == 0) & (kept_after > 0)

    def score_deltas(self, scores: Scores, choice: Choice) -> np.ndarray:
        """Each move's score change (inf where its option has no score)."""
        a, f = np.asarray(choice.attention), np.asarray(choice.ffn)
        out = np.empty(len(self))
        with np.errstate(invalid="ignore"):
            for rows, table, current in ((np.flatnonzero(self.attention), scores.attention, a),
                                         (np.flatnonzero(~self.attention), scores.ffn, f)):
                layer = self.layer[rows]
                out[rows] = table[layer, self.option[rows]] - table[layer, current[layer]]
        return out


def _apply(choice: Choice, move: tuple[str, int, int]) -> Choice:
    kind, layer, k = move
    return choice.replace_block(kind, layer, k)


def _row(costs: dict[str, np.ndarray], i: int) -> dict[str, float]:
    return {m: float(v[i]) for m, v in costs.items()}


def _restore_feasibility(space, tables, scores, budgets, choice, log):
    """Greedy: cheapest score increase per unit of violation removed."""
    current = tables.evaluate(choice)
    while violation(current, budgets) > 0:
        moves = Moves.of(space, choice)
        legal = moves.legal(space, choice)
        costs = tables.evaluate_moves(choice, moves, rows=legal)
        with np.errstate(invalid="ignore", divide="ignore"):
            removed = violation(current, budgets) - violations(costs, budgets)
            ds = moves.score_deltas(scores, choice)
            usable = legal & (removed > EPS) & np.isfinite(ds)
            key = np.where(usable, np.where(ds > 0, ds / removed, ds - 1e6), np.inf)
        if not usable.any():
            return None, current
        best = int(np.argmin(key))  # the first of equal keys, as a scan would keep
        choice, current = _apply(choice, moves.move(best)), _row(costs, best)
        log.append({"phase": "repair", "move": list(moves.move(best))})
    return choice, current


def _fill_slack(space, tables, scores, budgets, choice, current, log):
    """Greedy: best score gain per unit of budget used, staying feasible."""
    while True:
        moves = Moves.of(space, choice)
        with np.errstate(invalid="ignore"):
            ds = moves.score_deltas(scores, choice)
            gains = (ds < -EPS) & moves.legal(space, choice)
        if not gains.any():
            return choice, current
        costs = tables.evaluate_moves(choice, moves, rows=gains)
        with np.errstate(invalid="ignore"):
            fits = gains & np.all([costs[m] <= b for m, b in budgets.items()], axis=0)
            used = 0.0
            for m, b in budgets.items():
                used = used + np.maximum(0.0, (costs[m] - current[m]) / b)
            key = np.where(fits, -ds / (used + 1e-9), -np.inf)
        best = int(np.argmax(key))
        if not key[best] > 0.0:
            return choice, current
        choice, current = _apply(choice, moves.move(best)), _row(costs, best)
        log.append({"phase": "slack", "move": list(moves.move(best))})


def _pair_exchanges(space, tables, scores, budgets, choice, current, log, max_rounds=50):
    """Apply improving (block up, other block down) pairs that stay feasible."""
    for _ in range(max_rounds):
        moves = Moves.of(space, choice)
        ds = moves.score_deltas(scores, choice)
        finite = np.isfinite(ds)
        moves, ds = moves.subset(finite), ds[finite]
        if len(moves) < 2:
            return choice, current
        metrics = list(budgets)
        costs = tables.evaluate_moves(choice, moves)
        deltas = np.stack([costs[k] - current[k] for k in metrics], axis=1)
        pair_ds = ds[:, None] + ds[None, :]
        same_block = ((moves.attention[:, None] == moves.attention[None, :])
                      & (moves.layer[:, None] == moves.layer[None, :]))
        pair_ds[same_block] = np.inf
        pair_ds[np.tril_indices(len(moves))] = np.inf
        slack = np.array([budgets[k] - current[k] for k in metrics])
        # Additive estimate of the pair's cost change (memory's peak is re-checked exactly).
        ok = ((deltas[:, None, :] + deltas[None, :, :]) <= slack + 1e-12).all(-1)
        pair_ds[~ok] = np.inf
        improved = False
        for flat in np.argsort(pair_ds, axis=None)[:64]:
            i, j = np.unravel_index(flat, pair_ds.shape)
            if not pair_ds[i, j] < -EPS:
                break
            cand = _apply(_apply(choice, moves.move(i)), moves.move(j))
            if not space.is_legal(cand):
                continue
            cand_costs = tables.evaluate(cand)
            if feasible(cand_costs, budgets):
                choice, current = cand, cand_costs
                log.append({"phase": "exchange",
                            "move": [list(moves.move(i)), list(moves.move(j))]})
                improved = True
                break
        if not improved:
            return choice, current
        choice, current = _fill_slack(space, tables, scores, budgets, choice, current, log)
    return choice, current


def repair(space: SearchSpace, costs, budgets: dict[str, float], anchor: Choice,
           scores: Scores, exact_memory: bool = False,
           rank: Callable[[Choice], float] | None = None) -> Discretized | None:
    """The best feasible choice found from ``anchor`` over every hidden size (None: none):
    the lowest total score, or the lowest ``rank`` when given (a measured KL:
    ``SelectionConfig.estimate``). Every hidden size is repaired with block scores measured
    at the anchor's, so away from a pruned anchor the total can promise more than the
    anchor's whole KL (SmolLM2: -8.9 nats for a candidate whose KL was 6.9, the anchor's 4.7).

    Memory is evaluated by a fast one-hot mirror of the cost model's activation peak;
    if it ever disagrees with ``AdditiveCosts.discrete``, repair reruns with every
    memory value taken from the cost model (``exact_memory``).
    """
    tables = CostTables(costs, list(budgets), exact_memory)
    tables.check_memory(anchor)
    if not tables.exact_memory:
        tables.check_memory(space.full_choice())
    found: list[Discretized] = []
    per_hidden = []
    for h in range(len(space.hidden_options)):
        if not np.isfinite(scores.hidden[h]):
            continue
        log: list[dict[str, Any]] = []
        start = Choice(h, anchor.attention, anchor.ffn)
        if not space.is_legal(start):
            start = _legalize(space, start)
        choice, current = _restore_feasibility(space, tables, scores, budgets, start, log)
        if choice is None:
            per_hidden.append({"hidden": space.hidden_options[h], "feasible": False})
            continue
        choice, current = _fill_slack(space, tables, scores, budgets, choice, current, log)
        choice, current = _pair_exchanges(space, tables, scores, budgets, choice, current, log)
        total = scores.total(choice)
        per_hidden.append({"hidden": space.hidden_options[h], "feasible": True,
                           "score": total, "changes": len(log)})
        found.append(Discretized(choice=choice, costs=current, score=total, anchor=anchor,
                                 anchor_costs=tables.evaluate(anchor), changes=log,
                                 score_source=scores.source))
    if not found:
        return None
    # stable: ties keep the larger hidden
    best, *others = sorted(found, key=lambda d: rank(d.choice) if rank else d.score)
    if "memory_gb" in budgets and not tables.exact_memory:
        tables.check_memory(best.choice)
        if tables.exact_memory:  # the fast path drifted from the cost model: redo exactly
            return repair(space, costs, budgets, anchor, scores, exact_memory=True, rank=rank)
    best.per_hidden, best.alternatives = per_hidden, others
    return best


def _legalize(space: SearchSpace, choice: Choice) -> Choice:
    """Give a choice with no attention block its first layer's smallest attention."""
    smallest = len(space.attention_options) - 2
    return choice.replace_block("attention", 0, max(0, smallest))


# -------------------------------------------------------------- infeasibility


def smallest_reachable(space: SpaceShape, costs, metrics: list[str]) -> dict[str, float]:
    """Per metric, the smallest value any legal choice of the space reaches (its options
    and cost tables are enough: no masks, so no importance needed)."""
    tables = CostTables(costs, metrics)
    out = {}
    for m in metrics:
        best = np.inf
        for h in range(len(space.hidden_options)):
            att = np.where(space.allowed_attention.numpy(), tables.attention[m][:, :, h], np.inf)
            ffn = np.where(space.allowed_ffn.numpy(), tables.ffn[m][:, :, h], np.inf)
            a = [int(i) for i in att.argmin(1)]
            f = [int(i) for i in ffn.argmin(1)]
            choice = Choice(h, tuple(a), tuple(f))
            if not space.is_legal(choice):  # keep the cheapest attention block somewhere
                kept = att[:, :-1]
                layer = int(kept.min(1).argmin())
                choice = choice.replace_block("attention", layer, int(kept[layer].argmin()))
            best = min(best, tables.evaluate(choice)[m])
        out[m] = float(best)
    return out
