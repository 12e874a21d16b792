"""Ranking candidate architectures after a short distillation (Minitron's selection).

The Minitron papers choose among their pruned candidates after a light retraining
of each: right after pruning, the ranking mostly says which candidate lost least,
not which one recovers best. Each candidate here is cut from the teacher
(``prune``), distilled for the same token budget with the same data order and
seed (``distill``, reusing the teacher's cached outputs across candidates), and
scored by KL(teacher ‖ student) on fixed calibration batches, which neither the
training stream (train split) nor the benchmarks (held-out split) use.

The search and its ablations end with the same step (``final_selection``): their
own candidates, right after pruning ranked by a KL estimate that favours keeping
many partial blocks, are short-listed (``shortlist``: the best of every depth
first, so one depth's many near-copies cannot fill the list) and the same short
distillation as the baseline's decides. ``depth_variants`` gives the search
candidates at every depth: its answer with the layers that cost least to empty
(by its own measured scores) forced empty, repaired within the budgets.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec
from autocompress.arch_search.discretize import Discretized, Scores, repair, teacher_logits
from autocompress.arch_search.space import Choice, SearchSpace
from autocompress.distill import DistillConfig, DistillData, distill
from autocompress.losses import kd_loss
from autocompress.prune import prune


class SelectionConfig(BaseModel):
    """How the search (and its ablations) pick their final architecture."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(
        default=10, ge=1,
        description="Distinct candidates that get the baseline's short distillation (its "
        "settings: search.minitron.distill_*); the lowest KL after it wins. 1 = keep the "
        "candidate with the best score right after pruning, without training.")
    depth_variants: bool = Field(
        default=True,
        description="Add the search's answer repaired with 1, 2, ... more layers emptied "
        "(least costly by the measured scores), so every depth competes.")
    teacher_anchor: bool = Field(
        default=True,
        description="The search also short-lists repair from the teacher itself (every "
        "option scored there, as the greedy ablation does): each side's best top_k/5 get the "
        "short distillation, the side that scored lower takes the rest of the list. Needs "
        "top_k > 1 and depth_variants.")

    estimate: Literal["additive", "measured"] = Field(
        default="additive",
        description="How candidates are ranked right after pruning, for the short list and "
        "for repair's choice of hidden size: 'additive', the sum of their single-change "
        "scores; 'measured', their KL to the teacher on the score batches (one forward "
        "each). Around a pruned anchor the sum can promise more than the anchor's whole KL; "
        "but measured on the one batch the scores came from, the KL favoured smaller hidden "
        "sizes that recover worse (SmolLM2 @ 50%, seed 0: every teacher-side candidate at "
        "hidden 512 or less, short-distillation KL 1.87-2.74 against 1.59-1.74 at 576 with "
        "'additive').")

    @property
    def varies_depth(self) -> bool:
        """Depth variants are on and matter: more than one candidate is ranked."""
        return self.depth_variants and self.top_k > 1

    @property
    def has_teacher_side(self) -> bool:
        return self.varies_depth and self.teacher_anchor


@torch.no_grad()
def kl_to_teacher(student, batches: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Mean KL(teacher ‖ student) per token over ``batches`` (nats), given the teacher's
    logits on them (``reference``, computed once for all candidates)."""
    student.eval()
    total = 0.0
    for batch, ref in zip(batches, reference, strict=True):
        total += float(kd_loss(student(input_ids=batch).logits[:, :-1], ref[:, :-1]))
    return total / max(1, len(batches))


def short_distill_kl(teacher, importance, specs: list[ArchSpec], train, batches: list[torch.Tensor],
                     tokens: int, seq_len: int, batch_size: int, lr: float, seed: int,
                     progress: Callable[[int, int], None] | None = None) -> list[float]:
    """For each spec: prune, distil ``tokens`` tokens from ``train`` (a ``BatchSource``),
    return KL to the teacher on ``batches``. ``tokens == 0``: KL right after pruning."""
    return [r["kl"] for r in short_distill_scores(teacher, importance, specs, train, batches,
                                                   tokens, seq_len, batch_size, lr, seed,
                                                   progress)]


def short_distill_scores(teacher, importance, specs: list[ArchSpec], train,
                         batches: list[torch.Tensor], tokens: int, seq_len: int, batch_size: int,
                         lr: float, seed: int, progress: Callable[[int, int], None] | None = None
                         ) -> list[dict[str, float]]:
    """``short_distill_kl`` that also gives each spec's KL right after pruning:
    ``[{"pruned_kl": .., "kl": ..}]`` (equal when ``tokens == 0``)."""
    was_training = teacher.training
    teacher.eval()
    config = None
    if tokens > 0:
        steps = max(1, -(-tokens // (seq_len * batch_size)))
        config = DistillConfig(tokens=tokens, seq_len=seq_len, batch_size=batch_size, lr=lr,
                               warmup_steps=max(1, steps // 10), ckpt_every=steps, seed=seed)
    values = []
    try:
        with torch.no_grad():
            reference = teacher_logits(teacher, batches)
        with tempfile.TemporaryDirectory(prefix="ac-selection-") as tmp:
            for i, spec in enumerate(specs):
                student = prune(teacher, importance, spec)
                pruned = kl_to_teacher(student, batches, reference)
                if config is not None:
                    out = Path(tmp) / f"candidate-{i}"
                    distill(teacher, student, DistillData(train=train), config, out,
                            work_dir=Path(tmp) / f"candidate-{i}.work")
                values.append({"pruned_kl": pruned,
                               "kl": kl_to_teacher(student, batches, reference)
                               if config is not None else pruned})
                if progress is not None:
                    progress(i + 1, len(specs))
    finally:
        teacher.train(was_training)
    return values


# ------------------------------------------------------------------ the search's final pick


@dataclass
class Finalist:
    """A candidate for the final pick, with how it was found and, once scored, its KLs."""

    choice: Choice
    estimate: float  # the method's own score of it right after pruning (lower is better)
    origin: str
    layers: int  # layers with at least one block (the depth the short list spreads over)
    found: Discretized | None = None
    pruned_kl: float | None = None
    kl: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self, space: SearchSpace) -> dict[str, Any]:
        spec = space.spec_of(self.choice)
        return {"origin": self.origin, "layers": self.layers,
                "blocks": sum((layer.attention is not None) + (layer.ffn is not None)
                              for layer in spec.layers),
                "attention_blocks": sum(layer.attention is not None for layer in spec.layers),
                "hidden_size": spec.hidden_size,
                "params": spec.num_params(), "estimate": self.estimate,
                "pruned_kl": self.pruned_kl, "kl": self.kl, "choice": self.choice.to_dict(),
                **self.extra}


def layers_kept(space: SearchSpace, choice: Choice) -> int:
    return sum(1 for layer in space.spec_of(choice).layers
               if layer.attention is not None or layer.ffn is not None)


def emptying_order(space: SearchSpace, scores: Scores, anchor: Choice) -> list[int]:
    """Layers that may be emptied (both no-ops allowed), cheapest first by ``scores``: the
    score change of making both of the layer's blocks no-ops at ``anchor``."""
    noop_a, noop_f = len(space.attention_options) - 1, len(space.ffn_options) - 1
    if space.attention_options[noop_a] is not None or space.ffn_options[noop_f] is not None:
        return []
    cost = []
    for layer in range(space.num_layers):
        if not (space.allowed_attention[layer, noop_a] and space.allowed_ffn[layer, noop_f]):
            continue
        value = (scores.attention[layer, noop_a] - scores.attention[layer, anchor.attention[layer]]
                 + scores.ffn[layer, noop_f] - scores.ffn[layer, anchor.ffn[layer]])
        if np.isfinite(value):
            cost.append((float(value), layer))
    return [layer for _, layer in sorted(cost)]


def repaired_finalists(space: SearchSpace, costs, budgets: dict[str, float], anchor: Choice,
                       scores: Scores, found: Discretized, depth: bool,
                       rank: Callable[[Choice], float] | None = None) -> list[Finalist]:
    """Every hidden size's repair of ``anchor`` (``found``, repair's answer, first) and, with
    ``depth``, the same with the 1, 2, ... cheapest layers to empty forced empty. Each is
    estimated by ``rank`` (a measured KL) when given, else by its total score."""
    out = [_finalist(space, scores, d, "repair", rank) for d in [found, *found.alternatives]]
    if not depth:
        return out
    order = emptying_order(space, scores, anchor)
    noop_a, noop_f = len(space.attention_options) - 1, len(space.ffn_options) - 1
    whole = space.full_choice()
    for n in range(1, len(order) + 1):
        forced = order[:n]
        att, ffn = scores.attention.copy(), scores.ffn.copy()
        att[forced, :noop_a] = np.inf  # the forced layers stay empty through the repair
        ffn[forced, :noop_f] = np.inf
        forced_scores = replace(scores, attention=att, ffn=ffn)
        # From the search's answer, and from the kept layers whole (repair then trims them):
        # the score right after pruning undervalues whole blocks that training recovers.
        for start, label in ((anchor, f"{n} layers emptied"),
                             (whole, f"{n} layers emptied, the rest whole")):
            for layer in forced:
                start = start.replace_block("attention", layer, noop_a)
                start = start.replace_block("ffn", layer, noop_f)
            variant = repair(space, costs, budgets, start, forced_scores, rank=rank)
            if variant is None:
                continue
            for d in [variant, *variant.alternatives]:
                out.append(_finalist(space, scores, d, label, rank))
                out[-1].extra["emptied"] = forced
    return out


def _finalist(space: SearchSpace, scores: Scores, found: Discretized, origin: str,
              rank: Callable[[Choice], float] | None = None) -> Finalist:
    estimate = rank(found.choice) if rank else scores.total(found.choice)
    return Finalist(choice=found.choice, estimate=estimate, origin=origin,
                    layers=layers_kept(space, found.choice), found=found)


def shortlist(finalists: list[Finalist], k: int) -> list[Finalist]:
    """``k`` distinct candidates: the first finalist (the method's own answer), then the best
    estimate of every other depth (best depths first), then the best of the rest. Estimates
    right after pruning prefer deep models that keep many partial blocks; after training,
    fewer whole blocks often do better, so each depth gets in."""
    usable = [f for f in finalists if np.isfinite(f.estimate)]
    if not usable:
        return []
    distinct: dict[Choice, Finalist] = {usable[0].choice: usable[0]}
    for f in sorted(usable, key=lambda f: f.estimate):
        distinct.setdefault(f.choice, f)
    ranked = list(distinct.values())
    firsts: dict[int, Finalist] = {}
    for f in ranked:  # the own answer first, then by estimate
        firsts.setdefault(f.layers, f)
    heads = list(firsts.values())[:k]
    return heads + [f for f in ranked if f not in heads][: k - len(heads)]


@dataclass
class Sides:
    """Finalists from two anchors (DNAS's answer and the teacher), whose estimates are not
    on one scale (each is relative to its own anchor)."""

    own: list[Finalist]
    other: list[Finalist]


def probe_places(k: int) -> int:
    """Short-list places each side gets before the short distillation shows which leads."""
    return max(1, k // 5)


def select_sides(sides: Sides, k: int,
                 score: Callable[[list[Choice]], list[dict[str, float]]],
                 memo: dict[Choice, dict[str, float]]) -> tuple[Finalist, list[Finalist]]:
    """``select`` over two sides: each side's ``probe_places`` best (own first) get the
    short distillation, then the rest of the ``k`` places go to the side whose probe scored
    the lower KL (the other side fills any it cannot). A side that loses its probe by a wide
    margin (DNAS's side on SmolLM2: KL 2.8-3.9 against 1.6-1.75) would otherwise hold half
    the list; where the sides are close, the leader still takes most of the places, and a
    better candidate further down the loser's list is the price of that bet."""
    probe = probe_places(k)
    first = shortlist(sides.own, probe)
    taken = {f.choice for f in first}
    second = [f for f in shortlist(sides.other, k) if f.choice not in taken][:probe]
    short = first + second
    if not short:
        raise ValueError("no finite candidate to select from")
    if k == 1:
        return short[0], short
    own_leads = bool(first)  # a side with nothing new to offer cannot lead
    if first and second:
        best_scored(short, score, memo)
        own_leads = min(f.kl for f in first) <= min(f.kl for f in second)
    lead, trail = (sides.own, sides.other) if own_leads else (sides.other, sides.own)
    taken = {f.choice for f in short}
    for f in shortlist(lead, k) + shortlist(trail, k):
        if len(short) >= k:
            break
        if f.choice not in taken:
            short.append(f)
            taken.add(f.choice)
    if len(short) == 1:
        return short[0], short
    return best_scored(short, score, memo), short


def select(finalists: list[Finalist] | Sides, k: int,
           score: Callable[[list[Choice]], list[dict[str, float]]],
           memo: dict[Choice, dict[str, float]]) -> tuple[Finalist, list[Finalist]]:
    """The short list's best after ``score`` (the short distillation; ``memo`` keeps the
    results across the measured loop's rounds). ``k == 1``: the best estimate, untrained.
    Two anchors' finalists (``Sides``) share the list as ``select_sides`` decides."""
    if isinstance(finalists, Sides):
        return select_sides(finalists, k, score, memo)
    short = shortlist(finalists, k)
    if not short:
        raise ValueError("no finite candidate to select from")
    if k == 1 or len(short) == 1:
        return short[0], short
    return best_scored(short, score, memo), short


def best_scored(candidates: list[Finalist],
                score: Callable[[list[Choice]], list[dict[str, float]]],
                memo: dict[Choice, dict[str, float]]) -> Finalist:
    """The lowest KL after ``score`` among ``candidates`` (each scored once: ``memo``)."""
    todo = [f.choice for f in candidates if f.choice not in memo]
    if todo:
        memo.update(zip(todo, score(todo), strict=True))
    for f in candidates:
        f.pruned_kl, f.kl = memo[f.choice]["pruned_kl"], memo[f.choice]["kl"]
    return min(candidates, key=lambda f: (f.kl, f.estimate))
