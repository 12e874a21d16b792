"""The search space: every choice the search can make, as nested prefix masks.

Built from the teacher's shape, its Minitron importance and a granularity:

- **hidden size** (one global choice): fractions of the teacher's hidden size,
  rounded to the granularity. Option ``h'`` keeps the ``h'`` most important
  hidden channels (``Importance.hidden_order``).
- **attention** (per layer): ``num_kv_heads`` = a divisor ``G'`` of the
  teacher's ``G`` KV groups, and a number of query heads per KV head; or no-op.
  With ``G' = G`` the option keeps the best query heads *within each group*;
  with fewer groups the teacher's groups are merged into ``G'`` contiguous
  clusters whose K/V projections are mean-pooled, each serving its best query
  heads — exactly what ``prune`` does (``prune.select_heads``).
- **FFN** (per layer): width fractions rounded to the granularity (the most
  important neurons first, ``Importance.ffn_order``), or no-op.

A layer whose attention and FFN are both no-ops is removed (depth pruning). The
first and last layers can be protected from no-ops (Minitron protects them).

Because every option is a prefix of one importance order, the search learns
*how many* channels/heads/neurons to keep, never *which*; the masks here are
the same sets ``prune`` slices, so a masked forward of the teacher computes the
pruned model's output exactly (``autocompress.arch_search.masked``).

Every layer has the same list of options (the cost model's tables need equal
lengths); options a layer may not take (a protected layer's no-op) are marked
in ``allowed_attention`` / ``allowed_ffn``.

The options and those marks alone (``SpaceShape``) do not depend on importance: they
are all that the cost tables and the check of the limits need, before importance exists.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.arch_search.options import SpaceConfig, space_options
from autocompress.engine_rules import banned_no_ops
from autocompress.errors import AutoCompressError
from autocompress.importance import Importance
from autocompress.prune import select_heads


@dataclass(frozen=True)
class Choice:
    """One architecture of the space, as option indices."""

    hidden: int
    attention: tuple[int, ...]
    ffn: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"hidden": self.hidden, "attention": list(self.attention), "ffn": list(self.ffn)}

    def replace_block(self, kind: str, layer: int, option: int) -> Choice:
        """A copy with one block's option changed (``kind``: attention|ffn)."""
        values = list(getattr(self, kind))
        values[layer] = option
        if kind == "attention":
            return Choice(self.hidden, tuple(values), self.ffn)
        return Choice(self.hidden, self.attention, tuple(values))


@dataclass
class SpaceShape:
    """The options of one teacher's space and which layer may take which, without masks.

    Everything the cost tables and the reachability check need: it depends on the
    teacher's shape and ``config`` only, not on which channels importance keeps, so limits
    no architecture can meet are refused before importance is computed
    (``context.check_limits_early``). ``SearchSpace`` adds the masks.
    """

    teacher: ArchSpec
    config: SpaceConfig
    hidden_options: list[int]
    attention_options: list[AttentionSpec | None]
    ffn_options: list[FFNSpec | None]
    kv_variants: list[int]
    allowed_attention: torch.Tensor
    allowed_ffn: torch.Tensor

    @classmethod
    def build(cls, teacher: ArchSpec, config: SpaceConfig | None = None) -> SpaceShape:
        """The options of ``teacher`` (a homogeneous Llama-family spec) under ``config``."""
        config = config or SpaceConfig()
        _check_teacher(teacher)
        hidden, attention_opts, ffn_opts = space_options(teacher, config)
        shape = cls(
            teacher=teacher,
            config=config,
            hidden_options=hidden,
            attention_options=attention_opts,
            ffn_options=ffn_opts,
            kv_variants=sorted({a.num_kv_heads for a in attention_opts if a is not None},
                               reverse=True),
            allowed_attention=torch.ones(teacher.num_layers, len(attention_opts), dtype=torch.bool),
            allowed_ffn=torch.ones(teacher.num_layers, len(ffn_opts), dtype=torch.bool),
        )
        shape._forbid_no_ops()
        return shape

    def _forbid_no_ops(self) -> None:
        """Mark the no-ops a layer may not take: the protected first and last layers', and
        those the export engine cannot run without a costly stand-in."""
        config, teacher = self.config, self.teacher
        if config.protect_first_last:
            for layer in {0, teacher.num_layers - 1}:
                if config.allow_no_attention:
                    self.allowed_attention[layer, -1] = False
                if config.allow_no_ffn:
                    self.allowed_ffn[layer, -1] = False
        if config.export_engine:
            for kind, layer in banned_no_ops(config.export_engine, teacher):
                if kind == "attention" and config.allow_no_attention:
                    self.allowed_attention[layer, -1] = False
                if kind == "ffn" and config.allow_no_ffn:
                    self.allowed_ffn[layer, -1] = False

    # ------------------------------------------------------------ queries
    @property
    def num_layers(self) -> int:
        return self.teacher.num_layers

    def full_choice(self) -> Choice:
        """The teacher itself (every first option: the largest)."""
        return Choice(0, (0,) * self.num_layers, (0,) * self.num_layers)

    def spec_of(self, choice: Choice) -> ArchSpec:
        """The ArchSpec a choice describes (all layers kept; removed blocks are None)."""
        layers = [
            LayerSpec(attention=self.attention_options[a], ffn=self.ffn_options[f])
            for a, f in zip(choice.attention, choice.ffn, strict=True)
        ]
        return self.teacher.model_copy(
            update={"hidden_size": self.hidden_options[choice.hidden], "layers": layers}
        )

    def is_legal(self, choice: Choice) -> bool:
        """Allowed options everywhere and at least one attention block."""
        for layer, (a, f) in enumerate(zip(choice.attention, choice.ffn, strict=True)):
            if not self.allowed_attention[layer, a] or not self.allowed_ffn[layer, f]:
                return False
        return any(self.attention_options[a] is not None for a in choice.attention)

    def cost_tables(self, cost_model, workload):
        """The cost model's additive tables over exactly these options."""
        return cost_model.additive_costs(
            self.teacher, workload, self.hidden_options, self.attention_options, self.ffn_options
        )

    def describe(self) -> dict:
        """JSON-able summary of the options."""
        return {
            "hidden": self.hidden_options,
            "attention": [_option_text(o) for o in self.attention_options],
            "ffn": [_option_text(o) for o in self.ffn_options],
            "kv_variants": self.kv_variants,
            "protected_layers": [
                i for i in range(self.num_layers)
                if not bool(self.allowed_attention[i].all() and self.allowed_ffn[i].all())
            ],
            "config": self.config.model_dump(),
        }


@dataclass
class SearchSpace(SpaceShape):
    """A ``SpaceShape`` with the masks of its options for one teacher's importance.

    Shapes (L layers, h hidden, I FFN width, n_q query heads, V KV variants):
    ``hidden_masks [H, h]``, ``ffn_masks [L, Kf, I]``,
    ``head_masks [L, Ka, V, n_q]`` (option k's kept query heads, in the row of
    its KV variant), ``attention_alive [Ka]`` / ``ffn_alive [Kf]`` (1 unless the
    option is the no-op), ``allowed_attention [L, Ka]`` / ``allowed_ffn [L, Kf]``.
    """

    hidden_masks: torch.Tensor
    ffn_masks: torch.Tensor
    head_masks: torch.Tensor
    attention_alive: torch.Tensor
    ffn_alive: torch.Tensor

    @classmethod
    def build(
        cls, teacher: ArchSpec, importance: Importance, config: SpaceConfig | None = None
    ) -> SearchSpace:
        """The space of ``teacher`` (a homogeneous Llama-family spec) under ``config``."""
        shape = SpaceShape.build(teacher, config)
        _check_importance(teacher, importance)
        att0 = teacher.layers[0].attention
        attention_opts, ffn_opts = shape.attention_options, shape.ffn_options
        ffn_widths = [o.intermediate_size for o in ffn_opts if o is not None]
        return cls(
            **{f.name: getattr(shape, f.name) for f in fields(SpaceShape)},
            hidden_masks=_prefix_masks(importance.hidden_order(), shape.hidden_options),
            ffn_masks=torch.stack(
                [_prefix_masks(importance.ffn_order(i), ffn_widths, len(ffn_opts))
                 for i in range(teacher.num_layers)]
            ),
            head_masks=torch.stack(
                [_head_masks(importance, i, att0, attention_opts, shape.kv_variants)
                 for i in range(teacher.num_layers)]
            ),
            attention_alive=torch.tensor([0.0 if o is None else 1.0 for o in attention_opts]),
            ffn_alive=torch.tensor([0.0 if o is None else 1.0 for o in ffn_opts]),
        )


# ------------------------------------------------------------------ helpers


def _check_teacher(teacher: ArchSpec) -> None:
    first = teacher.layers[0] if teacher.layers else None
    if not teacher.is_homogeneous() or first is None:
        raise AutoCompressError(
            "the search needs a homogeneous teacher (the same attention and FFN in every layer)",
            hint="search from the original (uncompressed) model",
        )
    att = first.attention
    if att.num_heads % att.num_kv_heads:
        raise AutoCompressError(f"teacher has {att.num_heads} heads for {att.num_kv_heads} groups")


def _check_importance(teacher: ArchSpec, importance: Importance) -> None:
    if importance.arch.model_dump() != teacher.model_dump():
        raise AutoCompressError(
            "the importance scores were computed on a model of a different shape",
            hint="recompute importance on this teacher (`autocompress importance`)",
        )


def _prefix_masks(order: torch.Tensor, sizes: list[int], rows: int | None = None) -> torch.Tensor:
    """Row i keeps the first ``sizes[i]`` entries of ``order`` (extra rows: all zero = no-op)."""
    masks = torch.zeros(rows or len(sizes), order.numel())
    for i, size in enumerate(sizes):
        masks[i, order[:size]] = 1.0
    return masks


def _head_masks(
    importance: Importance,
    layer: int,
    teacher_att: AttentionSpec,
    options: list[AttentionSpec | None],
    variants: list[int],
) -> torch.Tensor:
    masks = torch.zeros(len(options), len(variants), teacher_att.num_heads)
    for k, option in enumerate(options):
        if option is None:
            continue
        _, kept = select_heads(
            importance, layer, teacher_att.num_kv_heads, option.num_heads, option.num_kv_heads
        )
        masks[k, variants.index(option.num_kv_heads), torch.cat(kept)] = 1.0
    return masks


def _option_text(option) -> str:
    if option is None:
        return "no-op"
    if isinstance(option, AttentionSpec):
        return f"{option.num_heads}q/{option.num_kv_heads}kv"
    return f"ffn {option.intermediate_size}"
