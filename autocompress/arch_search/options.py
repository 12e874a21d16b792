"""Which shapes the search may choose: the options of each choice, before any masks.

Built from the teacher's shape and a ``SpaceConfig`` alone (no importance, no
torch), so the cost model samples its probe and validation architectures from
exactly the options the search offers (``costmodel.probes``); ``search.space``
adds the importance masks.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec
from autocompress.engine_rules import space_overrides


class SpaceConfig(BaseModel):
    """Which options the search space offers."""

    model_config = ConfigDict(extra="forbid")

    hidden_fractions: list[float] = Field(
        default=[1.0, 0.875, 0.75, 0.625, 0.5],
        description="Global hidden sizes as fractions of the teacher's.",
    )
    ffn_fractions: list[float] = Field(
        default=[1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125],
        description="FFN widths as fractions of the teacher's.",
    )
    head_fractions: list[float] = Field(
        default=[1.0, 0.75, 0.5, 0.25],
        description="Query heads per KV head, as fractions of what its KV cluster holds.",
    )
    kv_reduction: bool = Field(
        default=True, description="Also offer fewer KV groups (mean-pooled clusters)."
    )
    allow_no_attention: bool = Field(default=True, description="Offer removing attention.")
    allow_no_ffn: bool = Field(default=True, description="Offer removing the FFN.")
    protect_first_last: bool = Field(
        default=True, description="The first and last layers keep both blocks."
    )
    granularity: int = Field(
        default=16, ge=1, description="Hidden sizes (and FFN widths) are multiples of this."
    )
    ffn_granularity: int | None = Field(
        default=None, ge=1,
        description="FFN widths are multiples of this (None = granularity); 256 suits the "
        "nemotron-nas ffn_mult export.",
    )
    export_engine: str | None = Field(
        default=None,
        description="Offer only what this engine computes exactly from a nemotron-nas "
        "export (vllm, trtllm, llama.cpp, hf: autocompress.engine_rules); None = no rules.",
    )


def space_options(teacher: ArchSpec, config: SpaceConfig | None = None
                  ) -> tuple[list[int], list[AttentionSpec | None], list[FFNSpec | None]]:
    """Hidden sizes, attention options and FFN options of ``teacher``'s space, largest
    first (the teacher's own size is always option 0), no-ops (None) last.

    The shapes are those of the first layer: the search starts from a homogeneous teacher.
    """
    config = config or SpaceConfig()
    if config.export_engine:  # only shapes that engine computes exactly
        config = config.model_copy(update=space_overrides(config.export_engine, teacher))
    att0, ffn0 = teacher.layers[0].attention, teacher.layers[0].ffn
    h, width = teacher.hidden_size, ffn0.intermediate_size
    gran = config.granularity
    hidden = _unique_desc(_round_to(h * f, gran, h) for f in config.hidden_fractions)
    ffn_gran = config.ffn_granularity or gran
    ffn_widths = _unique_desc(_round_to(width * f, ffn_gran, width) for f in config.ffn_fractions)
    attention: list[AttentionSpec | None] = list(_attention_options(att0, config))
    ffn: list[FFNSpec | None] = [FFNSpec(intermediate_size=w)
                                 for w in _ensure_first(ffn_widths, width)]
    if config.allow_no_attention:
        attention.append(None)
    if config.allow_no_ffn:
        ffn.append(None)
    return _ensure_first(hidden, h), attention, ffn


def _round_to(value: float, multiple: int, upper: int) -> int:
    """``value`` rounded to a multiple of ``multiple``, at least one multiple, at most upper."""
    rounded = max(multiple, int(round(value / multiple)) * multiple)
    return min(rounded, upper)


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _unique_desc(values) -> list[int]:
    return sorted(set(values), reverse=True)


def _ensure_first(values: list[int], full: int) -> list[int]:
    """The teacher's own size is always option 0 (so the space contains the teacher)."""
    return [full] + [v for v in values if v != full]


def _attention_options(teacher_att: AttentionSpec, config: SpaceConfig) -> list[AttentionSpec]:
    groups = teacher_att.num_kv_heads
    per_group = teacher_att.num_heads // groups
    kv_choices = _divisors_desc(groups) if config.kv_reduction else [groups]
    options: list[AttentionSpec] = []
    for kv in kv_choices:
        per_cluster = per_group * (groups // kv)
        fractions = sorted(set(config.head_fractions) | {1.0}, reverse=True) if kv == groups \
            else sorted(set(config.head_fractions), reverse=True)
        counts = _unique_desc(max(1, int(round(per_cluster * f))) for f in fractions)
        for g in counts:
            spec = AttentionSpec(num_heads=kv * g, num_kv_heads=kv)
            if spec not in options:
                options.append(spec)
    return options
