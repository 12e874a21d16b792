"""The Minitron baseline: homogeneous pruning to a parameter budget.

Minitron (arXiv 2407.14679, 2408.11796) and its NVIDIA ModelOpt implementation
prune *uniformly*: one hidden size, one attention shape and one FFN width for
every layer, optionally dropping whole layers (least important by block
importance, first and last protected). Given a parameter target, ModelOpt
enumerates such candidates, keeps the ``top_k`` whose parameter counts come
closest to the target from below, and picks the one a score function (here:
KL to the teacher on calibration batches, the same data the search uses)
likes best.

- ``minitron_for_params(target)``: that procedure for a parameter count;
- ``minitron_matched(budgets)``: the *matched* baseline for a hardware
  comparison. Candidates must meet the same budgets under the same cost model;
  the parameter target is the largest count any feasible candidate reaches, and
  the same top-k / score selection runs among the feasible candidates.

Candidates are drawn from the search space's own options (same granularity,
same importance orders), so the baseline and the search differ only in
*heterogeneity*, not in the menu of sizes. Scoring uses the masked teacher,
which equals the pruned model (a dropped layer = both blocks no-op).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec, LayerSpec
from autocompress.errors import AutoCompressError
from autocompress.importance import Importance
from autocompress.search.discretize import CostTables, choice_kl, feasible, teacher_logits
from autocompress.search.space import Choice, SearchSpace


class MinitronConfig(BaseModel):
    """How the baseline enumerates and picks homogeneous candidates."""

    model_config = ConfigDict(extra="forbid")

    # Minitron prunes depth as well as width (Llama 3.1 8B: 32 → 16 layers), so by
    # default the baseline may drop up to half the layers; fewer made tight budgets
    # unreachable for it where the heterogeneous search still found a model.
    max_depth_drop: int | None = Field(
        default=None, ge=0,
        description="Most layers that may be dropped (0 = width only; None = half of them).",
    )
    top_k: int = Field(
        default=8, ge=1, description="Candidates closest to the parameter target that are scored."
    )
    depth_metric: str = Field(default="cosine", description="Block importance for depth pruning.")


@dataclass
class Candidate:
    """One homogeneous architecture."""

    hidden: int
    attention: int
    ffn: int
    dropped: list[int]
    params: int
    choice: Choice
    costs: dict[str, float] = field(default_factory=dict)
    kl: float | None = None

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
            "kl": self.kl,
        }


@dataclass
class BaselineResult:
    """The chosen homogeneous architecture and the candidates considered."""

    spec: ArchSpec
    candidate: Candidate
    param_target: int
    scored: list[Candidate]
    num_candidates: int
    mode: str


def homogeneous_spec(space: SearchSpace, cand: Candidate) -> ArchSpec:
    """The uniform spec (dropped layers left out: ``prune`` drops them by importance)."""
    layer = LayerSpec(attention=space.attention_options[cand.attention],
                      ffn=space.ffn_options[cand.ffn])
    count = space.num_layers - len(cand.dropped)
    return space.teacher.model_copy(update={
        "hidden_size": space.hidden_options[cand.hidden], "layers": [layer] * count})


def candidates(space: SearchSpace, importance: Importance,
               config: MinitronConfig | None = None) -> list[Candidate]:
    """Every homogeneous architecture of the space (with up to ``max_depth_drop`` layers gone)."""
    config = config or MinitronConfig()
    has_noop = space.attention_options[-1] is None and space.ffn_options[-1] is None
    most = space.num_layers // 2 if config.max_depth_drop is None else config.max_depth_drop
    max_drop = min(most, max(0, space.num_layers - 2)) if has_noop else 0
    out = []
    for drop in range(max_drop + 1):
        dropped = sorted(importance.layers_to_drop(drop, config.depth_metric)) if drop else []
        for h in range(len(space.hidden_options)):
            for a, att in enumerate(space.attention_options):
                for f, ffn in enumerate(space.ffn_options):
                    if att is None or ffn is None:
                        continue
                    att_idx = [len(space.attention_options) - 1 if i in dropped else a
                               for i in range(space.num_layers)]
                    ffn_idx = [len(space.ffn_options) - 1 if i in dropped else f
                               for i in range(space.num_layers)]
                    choice = Choice(h, tuple(att_idx), tuple(ffn_idx))
                    cand = Candidate(h, a, f, dropped, 0, choice)
                    cand.params = homogeneous_spec(space, cand).num_params()
                    out.append(cand)
    return out


def _pick(space, masked, pool: list[Candidate], target: int, config: MinitronConfig,
          batches, mode: str, total: int) -> BaselineResult:
    pool = sorted(pool, key=lambda c: (-c.params, len(c.dropped)))
    top = pool[: config.top_k]
    if masked is not None and batches and len(top) > 1:
        reference = teacher_logits(masked.model, batches)
        for cand in top:
            cand.kl = choice_kl(masked, cand.choice, batches, reference)
        best = min(top, key=lambda c: (c.kl, -c.params))
    else:
        best = top[0]
    return BaselineResult(spec=homogeneous_spec(space, best), candidate=best, param_target=target,
                          scored=top, num_candidates=total, mode=mode)


@torch.no_grad()
def minitron_for_params(space: SearchSpace, importance: Importance, target_params: int,
                        masked=None, batches: list[torch.Tensor] | None = None,
                        config: MinitronConfig | None = None) -> BaselineResult:
    """Homogeneous architecture with at most ``target_params`` parameters (ModelOpt style)."""
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
    return _pick(space, masked, fitting, target_params, config, batches, "params", len(pool))


@torch.no_grad()
def minitron_matched(space: SearchSpace, importance: Importance, costs,
                     budgets: dict[str, float], masked=None,
                     batches: list[torch.Tensor] | None = None,
                     config: MinitronConfig | None = None) -> BaselineResult:
    """Homogeneous architecture that meets ``budgets`` with the largest parameter target."""
    config = config or MinitronConfig()
    tables = CostTables(costs, list(budgets))
    pool = candidates(space, importance, config)
    for cand in pool:
        cand.costs = tables.evaluate(cand.choice)
    meeting = [c for c in pool if feasible(c.costs, budgets)]
    if not meeting:
        smallest = {m: min(c.costs[m] for c in pool) for m in budgets}
        shown = ", ".join(f"{m} <= {budgets[m]:.4g} (smallest homogeneous: {smallest[m]:.4g})"
                          for m in budgets)
        raise AutoCompressError(
            f"no homogeneous architecture meets the limits: {shown}",
            hint="loosen the limits or allow more depth pruning (--max-depth-drop)",
        )
    target = max(c.params for c in meeting)
    return _pick(space, masked, meeting, target, config, batches, "matched", len(pool))
