"""Reading architectures for ``costmodel predict`` from whatever the user has.

Accepted sources (``load_arch``):

- ``default``: the bundled teacher (or its documented shape before it is trained);
- a model directory (``config.json`` inside) or a ``config.json`` file of a
  Llama-family model (llama, mistral, qwen2, qwen3) or of our heterogeneous
  model (``autocompress_hetero``);
- a ``nemotron-nas`` / ``DeciLMForCausalLM`` config with ``block_configs``
  (``n_heads_in_group``, ``ffn_mult`` or ``intermediate_size``, ``no_op``);
- an ArchSpec JSON (``{"hidden_size", "layers": [...]}``), completed from the
  default teacher when it leaves out head_dim / vocabulary.

Only the shape is read: no weights are loaded, no network is used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autocompress.arch import (
    SHAPE_LIMITS,
    SUPPORTED_MODEL_TYPES,
    ArchSpec,
    AttentionSpec,
    FFNSpec,
    LayerSpec,
    check_ffn_mult,
    check_shape_fields,
)
from autocompress.errors import AutoCompressError, invalid_input

NEMOTRON_TYPES = ("nemotron-nas", "deci")
_HINT = (
    "pass a model directory, a config.json of a Llama-family model ("
    + ", ".join(SUPPORTED_MODEL_TYPES)
    + "), a nemotron-nas config with block_configs, an ArchSpec JSON, or `default`"
)


def load_arch(source: str | Path) -> tuple[ArchSpec, list[str]]:
    """The ArchSpec of ``source`` and notes about approximations made while reading it."""
    from autocompress.costmodel.probes import default_base_config

    if str(source) == "default":
        return _from_hf_dict(default_base_config().to_dict()), []
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise AutoCompressError(f"no model config at {path}", hint=_HINT)
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise AutoCompressError(f"{path} is not valid JSON: {err}", hint=_HINT) from None
    if not isinstance(data, dict):
        raise AutoCompressError(f"{path} does not hold a JSON object", hint=_HINT)
    return arch_from_dict(data, where=str(path))


def arch_from_dict(data: dict[str, Any], where: str = "the config") -> tuple[ArchSpec, list[str]]:
    """Dispatch on the kind of config dict (see the module docstring).

    Shape fields are bounds-checked first (``check_shape_fields``): the dict may
    come from anyone, and transformers would allocate from them unchecked.
    """
    model_type = data.get("model_type")
    if model_type is None and "layers" in data and "hidden_size" in data:
        return _from_arch_json(data), []
    if model_type in NEMOTRON_TYPES or _is_decilm(data):
        check_shape_fields(data, where, required=("hidden_size", "num_attention_heads",
                                                  "vocab_size"))
        blocks = data.get("block_configs")
        if isinstance(blocks, list) and len(blocks) > SHAPE_LIMITS["num_hidden_layers"]:
            raise AutoCompressError(f"{where}: {len(blocks)} block_configs, more than "
                                    f"{SHAPE_LIMITS['num_hidden_layers']} layers",
                                    hint=_NEMOTRON_HINT)
        return _from_nemotron(data, where)
    if model_type in SUPPORTED_MODEL_TYPES:
        check_shape_fields(data, where)
        return _from_hf_dict(data), []
    raise AutoCompressError(f"unsupported model type {model_type!r}", hint=_HINT)


def _is_decilm(data: dict[str, Any]) -> bool:
    return "DeciLMForCausalLM" in (data.get("architectures") or [])


def _from_arch_json(data: dict[str, Any]) -> ArchSpec:
    from autocompress.costmodel.probes import default_base_config

    spec = ArchSpec.from_json(json.dumps(data))
    if spec.head_dim is None or spec.vocab_size is None:
        spec = spec.complete_from(_from_hf_dict(default_base_config().to_dict()))
    return spec


def _from_hf_dict(data: dict[str, Any]) -> ArchSpec:
    """A transformers config built from the dict (offline), then ``ArchSpec.from_hf_config``."""
    from transformers import AutoConfig

    import autocompress.modeling  # noqa: F401  (registers autocompress_hetero)

    fields = {k: v for k, v in data.items() if k not in ("model_type", "architectures")}
    try:
        config = AutoConfig.for_model(data["model_type"], **fields)
    except (ValueError, TypeError, KeyError) as err:
        raise AutoCompressError(
            f"cannot read the {data.get('model_type')} config: {err}", hint=_HINT
        ) from None
    return ArchSpec.from_hf_config(config)


def _ffn_mult_to_intermediate(ffn_mult: float, hidden: int) -> int:
    """DeciLM's rule: round_up_256(int(2·ffn_mult·hidden/3))."""
    size = int(2 * ffn_mult * hidden / 3)
    return int(math.ceil(size / 256) * 256)


def _from_nemotron(data: dict[str, Any], where: str = "the config") -> tuple[ArchSpec, list[str]]:
    """nemotron-nas ``block_configs`` → ArchSpec; a missing or bad field is a usage error."""
    try:
        return _parse_nemotron(data, where)
    except KeyError as err:
        raise AutoCompressError(f"the nemotron-nas config has no {err.args[0]!r}",
                                hint=_NEMOTRON_HINT) from None
    except ValidationError as err:
        raise invalid_input(err, "nemotron-nas config", _NEMOTRON_HINT) from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
        raise AutoCompressError(f"cannot read the nemotron-nas config: {err}",
                                hint=_NEMOTRON_HINT) from None


_NEMOTRON_HINT = ("it needs hidden_size, num_attention_heads, vocab_size and block_configs "
                  "of {attention: {n_heads_in_group | no_op}, ffn: {ffn_mult | "
                  "intermediate_size | no_op}} with positive numbers")


def _parse_nemotron(data: dict[str, Any], where: str = "the config") -> tuple[ArchSpec, list[str]]:
    """nemotron-nas ``block_configs`` → ArchSpec; ``replace_with_linear`` is approximated."""
    hidden = int(data["hidden_size"])
    heads = int(data["num_attention_heads"])
    if hidden < 1 or heads < 1:
        raise ValueError(f"hidden_size ({hidden}) and num_attention_heads ({heads}) must be "
                         "at least 1")
    head_dim = int(data.get("head_dim") or hidden // heads)
    blocks = data.get("block_configs")
    if not blocks:
        raise AutoCompressError("the nemotron-nas config has no block_configs", hint=_HINT)
    notes: list[str] = []
    layers = []
    for index, block in enumerate(blocks):
        att, ffn = block.get("attention", {}), block.get("ffn", {})
        attention = None
        if att.get("replace_with_linear"):
            notes.append(f"layer {index}: linear attention replacement counted as removed "
                         f"(its {hidden}x{hidden} matmul is not modelled)")
        elif not att.get("no_op"):
            group = int(att.get("n_heads_in_group") or 1)
            if group < 1 or heads % group:
                raise ValueError(f"layer {index}: n_heads_in_group {group} does not divide "
                                 f"num_attention_heads {heads}")
            attention = AttentionSpec(num_heads=heads, num_kv_heads=heads // group)
        mlp = None
        if ffn.get("replace_with_linear"):
            # A hidden×hidden linear has the weights and FLOPs of a gated MLP of width h/3.
            mlp = FFNSpec(intermediate_size=max(1, hidden // 3))
            notes.append(f"layer {index}: linear FFN replacement modelled as an MLP of width "
                         f"{hidden // 3} (same weights and FLOPs)")
        elif not ffn.get("no_op"):
            width = ffn.get("intermediate_size") or _ffn_mult_to_intermediate(
                check_ffn_mult(ffn["ffn_mult"], f"{where}: layer {index}"), hidden
            )
            mlp = FFNSpec(intermediate_size=int(width))
        layers.append(LayerSpec(attention=attention, ffn=mlp))
    spec = ArchSpec(
        hidden_size=hidden,
        layers=layers,
        head_dim=head_dim,
        vocab_size=int(data["vocab_size"]),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        attention_bias=bool(data.get("attention_bias", False)),
        attention_output_bias=bool(data.get("attention_bias", False)),
        mlp_bias=bool(data.get("mlp_bias", False)),
        qk_norm=False,
    )
    return spec, notes
