"""ArchSpec: the shape of a (possibly heterogeneous) Llama-family decoder.

A spec is a global hidden size plus, per layer, an attention block
``{num_heads, num_kv_heads}`` or ``None`` (removed, a no-op) and an FFN block
``{intermediate_size}`` or ``None``. Everything else about a model's *shape* that
changes its parameter count (head_dim, vocabulary, tied embeddings, biases,
Qwen3's q/k norms) rides along as optional fields: a hand-written JSON may leave
them out and ``complete_from(teacher_spec)`` fills them in.

The JSON form is deliberately small so users and other tools can write it::

    {"hidden_size": 256,
     "layers": [{"attention": {"num_heads": 8, "num_kv_heads": 4},
                 "ffn": {"intermediate_size": 512}},
                {"attention": null, "ffn": {"intermediate_size": 384}}]}
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from autocompress.atomic import write_text_atomic
from autocompress.errors import AutoCompressError

# Model types whose config we know how to read into a spec.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "autocompress_hetero")


# Ceilings for the shape fields of an untrusted config, checked before anything is
# built from them: far above any released decoder (about 128 layers, 128 heads, a
# 30k hidden size, a 256k vocabulary), far below what would exhaust memory.
SHAPE_LIMITS = {
    "num_hidden_layers": 1024,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "head_dim": 1 << 14,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24,
}
MAX_COUNT = max(SHAPE_LIMITS.values())  # any count in an ArchSpec
MAX_FFN_MULT = 64.0  # DeciLM's ffn_mult: the MLP width over the hidden size, times 1.5


def check_shape_fields(values: Mapping[str, Any], where: str,
                       required: Iterable[str] = ()) -> None:
    """Refuse a config whose shape fields are not whole numbers within ``SHAPE_LIMITS``.

    Run on untrusted configs before anything is allocated from them: a
    ``num_hidden_layers`` of 1e9 would otherwise build a billion-entry layer
    list, a 0 divide by zero, a NaN or a string raise deep inside transformers.
    Fields that are absent or null are left to the reader's defaults, except the
    ``required`` ones.
    """
    for name, ceiling in SHAPE_LIMITS.items():
        value = values.get(name)
        if value is None and name not in required:
            continue
        if not _whole_in_range(value, ceiling):
            raise AutoCompressError(
                f"{where}: {name} must be a whole number, at least 1 and at most {ceiling} "
                f"(got {value!r})",
                "the config is corrupt or not a model this tool reads; fix it, or re-save "
                "the model with save_pretrained")


def check_ffn_mult(value: Any, where: str) -> float:
    """A DeciLM ``ffn_mult``: a finite number in (0, ``MAX_FFN_MULT``]."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and 0 < value <= MAX_FFN_MULT)
    if not ok:
        raise AutoCompressError(
            f"{where}: ffn_mult must be a number above 0 and at most {MAX_FFN_MULT:g} "
            f"(got {value!r})", "fix the config's block_configs")
    return float(value)


def _whole_in_range(value: Any, ceiling: int) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return False
    return 1 <= value <= ceiling


def _not_bool(value: Any) -> Any:
    # JSON ``true`` would otherwise pass as the integer 1.
    if isinstance(value, bool):
        raise ValueError("a count must be an integer, not true/false")
    return value


Count = Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=MAX_COUNT)]


class AttentionSpec(BaseModel):
    """One attention block: query heads and KV heads (GQA groups)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    num_heads: Count = Field(description="Query heads.")
    num_kv_heads: Count = Field(description="Key/value heads (= GQA groups).")


class FFNSpec(BaseModel):
    """One gated MLP (gate/up/down projections)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    intermediate_size: Count = Field(description="Width of the gated MLP.")


class LayerSpec(BaseModel):
    """One decoder layer; ``None`` for a block means it is removed (a no-op)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    attention: AttentionSpec | None = None
    ffn: FFNSpec | None = None

    @property
    def is_empty(self) -> bool:
        """True when both blocks are removed (the layer is the identity)."""
        return self.attention is None and self.ffn is None


class Granularity(BaseModel):
    """Optional size multiples a target engine/kernel prefers (1 = any size)."""

    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(default=1, ge=1)
    intermediate: int = Field(default=1, ge=1)
    heads: int = Field(default=1, ge=1)
    kv_heads: int = Field(default=1, ge=1)


class ArchSpec(BaseModel):
    """A heterogeneous decoder shape; see the module docstring for the JSON."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: Count
    layers: list[LayerSpec] = Field(max_length=SHAPE_LIMITS["num_hidden_layers"])
    # Optional in hand-written JSON; ``complete_from`` takes them from the teacher.
    head_dim: Count | None = None
    vocab_size: Count | None = None
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = Field(default=None, description="Bias on q/k/v projections.")
    attention_output_bias: bool | None = Field(default=None, description="Bias on o_proj.")
    mlp_bias: bool | None = None
    qk_norm: bool | None = Field(default=None, description="RMSNorm on q and k per head (Qwen3).")

    # ----------------------------------------------------------------- basics
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def kv_heads_total(self) -> int:
        """KV heads summed over layers (what the KV cache scales with)."""
        return sum(layer.attention.num_kv_heads for layer in self.layers if layer.attention)

    def heads_total(self) -> int:
        """Query heads summed over layers."""
        return sum(layer.attention.num_heads for layer in self.layers if layer.attention)

    def attention_layers(self) -> list[int]:
        """Indices of layers that keep an attention block."""
        return [i for i, layer in enumerate(self.layers) if layer.attention is not None]

    def ffn_layers(self) -> list[int]:
        """Indices of layers that keep an FFN block."""
        return [i for i, layer in enumerate(self.layers) if layer.ffn is not None]

    def is_homogeneous(self) -> bool:
        """True when every layer has the same, complete, blocks."""
        first = self.layers[0] if self.layers else None
        return bool(first and first.attention and first.ffn) and all(
            layer == first for layer in self.layers
        )

    # ------------------------------------------------------------ completion
    def missing_fields(self) -> list[str]:
        """Optional fields still unset (``None``)."""
        names = [
            "head_dim",
            "vocab_size",
            "tie_word_embeddings",
            "attention_bias",
            "attention_output_bias",
            "mlp_bias",
            "qk_norm",
        ]
        return [name for name in names if getattr(self, name) is None]

    def complete_from(self, reference: ArchSpec) -> ArchSpec:
        """Copy of this spec with unset optional fields taken from ``reference``."""
        updates = {name: getattr(reference, name) for name in self.missing_fields()}
        return self.model_copy(update=updates)

    def _require(self, *names: str) -> None:
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise AutoCompressError(
                f"the architecture spec does not set {', '.join(missing)}",
                hint="add the field(s) to the JSON, or complete the spec from the teacher "
                "(ArchSpec.complete_from(teacher_spec); `autocompress prune` does this)",
            )

    # ------------------------------------------------------- parameter count
    def attention_params(self, layer: int | LayerSpec, hidden_size: int | None = None) -> int:
        """Parameters of one layer's attention block incl. its input RMSNorm (0 if removed)."""
        spec = self.layers[layer] if isinstance(layer, int) else layer
        if spec.attention is None:
            return 0
        self._require("head_dim")
        h = hidden_size or self.hidden_size
        d = self.head_dim
        nq, nkv = spec.attention.num_heads, spec.attention.num_kv_heads
        count = h * d * (2 * nq + 2 * nkv)  # q, k, v, o weights
        if self.attention_bias:
            count += d * (nq + 2 * nkv)
        if self.attention_output_bias:
            count += h
        if self.qk_norm:
            count += 2 * d
        return count + h  # input_layernorm

    def ffn_params(self, layer: int | LayerSpec, hidden_size: int | None = None) -> int:
        """Parameters of one layer's FFN block incl. its RMSNorm (0 if removed)."""
        spec = self.layers[layer] if isinstance(layer, int) else layer
        if spec.ffn is None:
            return 0
        h = hidden_size or self.hidden_size
        width = spec.ffn.intermediate_size
        count = 3 * h * width
        if self.mlp_bias:
            count += 2 * width + h
        return count + h  # post_attention_layernorm

    def layer_params(self, layer: int | LayerSpec) -> int:
        return self.attention_params(layer) + self.ffn_params(layer)

    def embedding_params(self) -> int:
        """Token embeddings + LM head (once if tied) + the final norm."""
        self._require("vocab_size")
        tied = bool(self.tie_word_embeddings)
        return self.vocab_size * self.hidden_size * (1 if tied else 2) + self.hidden_size

    def num_params(self) -> int:
        """Exact parameter count of the model this spec builds (tied weights once).

        Unset boolean fields count as False; ``head_dim`` and ``vocab_size`` must
        be set (use ``complete_from``).
        """
        return self.embedding_params() + sum(self.layer_params(layer) for layer in self.layers)

    # -------------------------------------------------------------- legality
    def legality_errors(
        self,
        granularity: Granularity | int | dict | None = None,
        reference: ArchSpec | None = None,
        tp: int = 1,
    ) -> list[str]:
        """Every rule this spec breaks, as ``"layer N: ..."`` strings (empty = legal).

        ``granularity``: size multiples (an int applies to hidden and FFN sizes).
        ``reference``: a teacher spec the model will be pruned from: sizes may
        only shrink and ``head_dim`` / vocabulary may not change.
        ``tp``: tensor-parallel degree; every GPU needs whole query heads, and
        KV heads are split over GPUs or replicated on them (vLLM's rule).
        """
        gran = _as_granularity(granularity)
        errors: list[str] = []
        if not self.layers:
            errors.append("model: the spec has no layers")
        if self.layers and not self.attention_layers():
            errors.append("model: at least one layer must keep its attention block")
        if self.hidden_size % gran.hidden:
            errors.append(
                f"model: hidden_size {self.hidden_size} is not a multiple of {gran.hidden}"
            )
        for i, layer in enumerate(self.layers):
            errors.extend(f"layer {i}: {msg}" for msg in _layer_errors(layer, gran, tp))
        if reference is not None:
            errors.extend(self._reference_errors(reference))
        return errors

    def validate_legality(
        self,
        granularity: Granularity | int | dict | None = None,
        reference: ArchSpec | None = None,
        tp: int = 1,
    ) -> None:
        """Raise ``AutoCompressError`` naming the first broken rules, if any."""
        errors = self.legality_errors(granularity, reference, tp)
        if errors:
            shown = "; ".join(errors[:5]) + (
                f"; … ({len(errors)} in all)" if len(errors) > 5 else ""
            )
            raise AutoCompressError(
                f"illegal architecture: {shown}",
                hint="fix the listed layers in the ArchSpec JSON",
            )

    def _reference_errors(self, ref: ArchSpec) -> list[str]:
        errors: list[str] = []
        if self.head_dim is not None and ref.head_dim is not None and self.head_dim != ref.head_dim:
            errors.append(
                f"model: head_dim {self.head_dim} differs from the teacher's {ref.head_dim} "
                "(head_dim is never pruned: RoPE depends on it)"
            )
        if self.vocab_size is not None and ref.vocab_size and self.vocab_size != ref.vocab_size:
            errors.append(f"model: vocab_size {self.vocab_size} differs from the teacher's")
        if self.hidden_size > ref.hidden_size:
            errors.append(
                f"model: hidden_size {self.hidden_size} exceeds the teacher's {ref.hidden_size}"
            )
        if self.num_layers > ref.num_layers:
            errors.append(f"model: {self.num_layers} layers exceed the teacher's {ref.num_layers}")
        max_heads = max((la.attention.num_heads for la in ref.layers if la.attention), default=0)
        max_kv = max((la.attention.num_kv_heads for la in ref.layers if la.attention), default=0)
        max_ffn = max((la.ffn.intermediate_size for la in ref.layers if la.ffn), default=0)
        for i, layer in enumerate(self.layers):
            att, ffn = layer.attention, layer.ffn
            if att and not max_heads or ffn and not max_ffn:
                errors.append(f"layer {i}: the teacher has no such block to keep")
                continue
            if att and att.num_heads > max_heads:
                errors.append(f"layer {i}: {att.num_heads} heads exceed the teacher's {max_heads}")
            if att and att.num_kv_heads > max_kv:
                errors.append(
                    f"layer {i}: {att.num_kv_heads} KV heads exceed the teacher's {max_kv}"
                )
            if ffn and ffn.intermediate_size > max_ffn:
                errors.append(
                    f"layer {i}: intermediate_size {ffn.intermediate_size} exceeds the "
                    f"teacher's {max_ffn}"
                )
        return errors

    # ----------------------------------------------------------------- JSON
    def to_json(self, path: str | Path | None = None, *, indent: int | None = 2) -> str:
        """JSON text (null for removed blocks); also written to ``path`` if given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            write_text_atomic(Path(path), text + "\n")
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; optional fields that are unset are left out."""
        data = self.model_dump(exclude_none=True)
        # Keep removed blocks explicit: ``null`` is the documented spelling.
        data["layers"] = [
            {
                "attention": layer.attention.model_dump() if layer.attention else None,
                "ffn": layer.ffn.model_dump() if layer.ffn else None,
            }
            for layer in self.layers
        ]
        return data

    @classmethod
    def from_json(cls, source: str | Path) -> ArchSpec:
        """Parse a spec from a JSON file path or a JSON string."""
        text = str(source)
        if not text.lstrip().startswith("{"):
            path = Path(text)
            if not path.is_file():
                raise AutoCompressError(
                    f"architecture file not found: {path}",
                    hint="pass a JSON file written by `autocompress arch show --json` or by hand",
                )
            text = path.read_text()
        try:
            spec = cls.model_validate_json(text)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise AutoCompressError(
                f"invalid architecture JSON at {where or 'top level'}: {first['msg']} "
                f"({err.error_count()} problem(s))",
                hint='expected {"hidden_size": int, "layers": [{"attention": {"num_heads": int, '
                '"num_kv_heads": int} | null, "ffn": {"intermediate_size": int} | null}]}',
            ) from None
        _require_both_blocks(text)
        return spec

    # ------------------------------------------------------------- builders
    @classmethod
    def uniform(
        cls,
        *,
        num_layers: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        intermediate_size: int,
        **extra: Any,
    ) -> ArchSpec:
        """A homogeneous spec (every layer the same)."""
        layer = LayerSpec(
            attention=AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv_heads),
            ffn=FFNSpec(intermediate_size=intermediate_size),
        )
        return cls(hidden_size=hidden_size, layers=[layer] * num_layers, **extra)

    @classmethod
    def from_hf_config(cls, config: Any) -> ArchSpec:
        """Spec of a transformers config (Llama, Mistral, Qwen2, Qwen3 or our hetero)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise AutoCompressError(
                f"unsupported architecture {model_type!r}",
                hint=f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}",
            )
        if model_type == "autocompress_hetero":
            return _spec_from_hetero_config(config)
        return _spec_from_llama_family(config, model_type)


def sample_spec(
    reference: ArchSpec,
    rng: random.Random,
    *,
    p_no_attention: float = 0.2,
    p_no_ffn: float = 0.2,
    hidden_multiple: int = 1,
    intermediate_multiple: int = 1,
) -> ArchSpec:
    """A random legal spec that fits inside ``reference`` (for tests and timing).

    Per layer: query heads a multiple of a KV-head count that divides the
    reference's, FFN width up to the reference's, either block removed with the
    given probabilities; at least one attention block is kept.
    """
    ref_heads = max(la.attention.num_heads for la in reference.layers if la.attention)
    ref_kv = max(la.attention.num_kv_heads for la in reference.layers if la.attention)
    ref_ffn = max(la.ffn.intermediate_size for la in reference.layers if la.ffn)
    hidden = _random_multiple(rng, reference.hidden_size, hidden_multiple)
    layers = []
    for _ in reference.layers:
        attention = None
        if rng.random() >= p_no_attention:
            kv = rng.choice([k for k in range(1, ref_kv + 1) if ref_kv % k == 0])
            group = rng.randint(1, max(1, ref_heads // kv))
            attention = AttentionSpec(num_heads=kv * group, num_kv_heads=kv)
        ffn = None
        if rng.random() >= p_no_ffn:
            ffn = FFNSpec(intermediate_size=_random_multiple(rng, ref_ffn, intermediate_multiple))
        layers.append(LayerSpec(attention=attention, ffn=ffn))
    if not any(layer.attention for layer in layers):
        keep = rng.randrange(len(layers))
        kv = ref_kv
        layers[keep] = LayerSpec(
            attention=AttentionSpec(num_heads=ref_heads, num_kv_heads=kv), ffn=layers[keep].ffn
        )
    spec = ArchSpec(hidden_size=hidden, layers=layers)
    return spec.complete_from(reference)


def _random_multiple(rng: random.Random, upper: int, multiple: int) -> int:
    """Uniform in {multiple, 2*multiple, ...} up to ``upper`` (at least ``multiple``)."""
    return multiple * rng.randint(1, max(1, upper // multiple))


# ---------------------------------------------------------------- helpers


def _as_granularity(value: Granularity | int | dict | None) -> Granularity:
    if value is None:
        return Granularity()
    if isinstance(value, Granularity):
        return value
    if isinstance(value, int):
        return Granularity(hidden=value, intermediate=value)
    return Granularity(**value)


def _require_both_blocks(text: str) -> None:
    """Every JSON layer names both blocks: a forgotten key must not delete a block."""
    try:
        data = json.loads(text)
    except ValueError:
        return  # model_validate_json reports it
    layers = data.get("layers") if isinstance(data, dict) else None
    for i, layer in enumerate(layers if isinstance(layers, list) else []):
        missing = [k for k in ("attention", "ffn") if isinstance(layer, dict) and k not in layer]
        if missing:
            raise AutoCompressError(
                f"invalid architecture JSON: layer {i} has no {missing[0]!r} key",
                hint=f'write "{missing[0]}": null to remove that block, or give its shape',
            )


def _layer_errors(layer: LayerSpec, gran: Granularity, tp: int = 1) -> Iterable[str]:
    att, ffn = layer.attention, layer.ffn
    if att is not None and tp > 1:
        if att.num_heads % tp:
            yield f"num_heads {att.num_heads} cannot be split over tp={tp} GPUs"
        if att.num_kv_heads % tp and tp % att.num_kv_heads:
            yield (f"num_kv_heads {att.num_kv_heads} can be neither split over nor replicated "
                   f"on tp={tp} GPUs")
    if att is not None:
        if att.num_heads % att.num_kv_heads:
            yield (
                f"num_heads {att.num_heads} is not a multiple of num_kv_heads "
                f"{att.num_kv_heads} (GQA needs whole groups)"
            )
        if att.num_heads % gran.heads:
            yield f"num_heads {att.num_heads} is not a multiple of {gran.heads}"
        if att.num_kv_heads % gran.kv_heads:
            yield f"num_kv_heads {att.num_kv_heads} is not a multiple of {gran.kv_heads}"
    if ffn is not None and ffn.intermediate_size % gran.intermediate:
        yield f"intermediate_size {ffn.intermediate_size} is not a multiple of {gran.intermediate}"


def _spec_from_llama_family(config: Any, model_type: str) -> ArchSpec:
    fields = {name: getattr(config, name, None) for name in SHAPE_LIMITS}
    check_shape_fields(fields, f"the {model_type} config", required=(
        "num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size",
        "vocab_size"))
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if model_type == "qwen2":  # Qwen2Attention hard-codes q/k/v bias, no o bias
        qkv_bias, o_bias = True, False
    elif model_type == "mistral":
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = bool(getattr(config, "attention_bias", False))
    return ArchSpec.uniform(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=config.intermediate_size,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=qkv_bias,
        attention_output_bias=o_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)) if model_type == "llama" else False,
        qk_norm=model_type == "qwen3",
    )


def _spec_from_hetero_config(config: Any) -> ArchSpec:
    layers = [LayerSpec.model_validate(block) for block in config.block_configs]
    return ArchSpec(
        hidden_size=config.hidden_size,
        layers=layers,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        tie_word_embeddings=bool(config.tie_word_embeddings),
        attention_bias=bool(config.attention_bias),
        attention_output_bias=bool(config.attention_output_bias),
        mlp_bias=bool(config.mlp_bias),
        qk_norm=bool(config.qk_norm),
    )
