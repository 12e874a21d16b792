"""Loading supported models and building heterogeneous ones.

Supported teachers are the Llama family (Llama, Mistral, Qwen2, Qwen3: q/k/v/o
attention with GQA, gated MLP, RMSNorm, RoPE) and our own heterogeneous model.
Anything else is refused with a message that lists what is supported, because
the surgery (importance, pruning, export) relies on that exact block structure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

from autocompress.arch import SUPPORTED_MODEL_TYPES, ArchSpec, check_shape_fields
from autocompress.errors import AutoCompressError
from autocompress.model_source import resolve_model_dir
from autocompress.modeling.configuration_autocompress_hetero import HeteroConfig
from autocompress.modeling.modeling_autocompress_hetero import HeteroForCausalLM

MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "llama": LlamaForCausalLM,
    "mistral": MistralForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "autocompress_hetero": HeteroForCausalLM,
}
_SUPPORTED_HINT = (
    "supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
    "Qwen3ForCausalLM and AutoCompress's HeteroForCausalLM (model_type "
    + ", ".join(SUPPORTED_MODEL_TYPES)
    + ")"
)
# Config fields copied verbatim from a teacher into a hetero config.
_SHARED_FIELDS = (
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "attention_dropout",
)


# ------------------------------------------------------------------ loading


def load_causal_lm(
    path_or_id: str | Path,
    dtype: torch.dtype = torch.float32,
    *,
    with_tokenizer: bool = True,
) -> tuple[PreTrainedModel, Any | None]:
    """Load a supported causal LM (eval mode) and its tokenizer (None if it has none).

    ``path_or_id``: a model directory, a named teacher (``default``,
    ``smollm2-135m``) or a hub id (only where a network is available).
    """
    source = _resolve_source(path_or_id)
    config = _load_config(source)
    check_supported(config)
    model_class = MODEL_CLASSES[config.model_type]
    try:
        model, info = model_class.from_pretrained(
            source, config=config, dtype=dtype, output_loading_info=True
        )
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
        raise AutoCompressError(
            f"could not load the weights of {source}: {_first_line(err)}",
            hint="the checkpoint is corrupt or incomplete: re-save it with save_pretrained",
        ) from err
    _check_loading_info(info, source)
    model.eval()
    tokenizer = _load_tokenizer(source) if with_tokenizer else None
    return model, tokenizer


def load_config(path_or_id: str | Path) -> tuple[str, Any]:
    """(resolved source, config) of a supported model, without loading weights."""
    source = _resolve_source(path_or_id)
    config = _load_config(source)
    check_supported(config)
    return source, config


def check_supported(config: Any) -> None:
    """Raise AutoCompressError unless ``config`` is of a supported architecture."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_CLASSES:
        archs = getattr(config, "architectures", None) or [model_type]
        raise AutoCompressError(
            f"unsupported architecture {', '.join(map(str, archs))} (model_type {model_type!r})",
            hint=_SUPPORTED_HINT,
        )


def _resolve_source(path_or_id: str | Path) -> str:
    """A named teacher, a local directory or a hub id, as a local directory."""
    return str(resolve_model_dir(path_or_id))


def _load_config(source: str) -> Any:
    config_file = Path(source) / "config.json"
    if config_file.is_file():
        try:
            raw = json.loads(config_file.read_text())
        except json.JSONDecodeError as err:
            raise AutoCompressError(
                f"{config_file} is not valid JSON ({err.msg} at line {err.lineno})",
                hint="the checkpoint is corrupt: re-save it with save_pretrained",
            ) from None
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if model_type not in MODEL_CLASSES:
            archs = (raw.get("architectures") if isinstance(raw, dict) else None) or [model_type]
            raise AutoCompressError(
                f"unsupported architecture {', '.join(map(str, archs))} "
                f"(model_type {model_type!r})",
                hint=_SUPPORTED_HINT,
            )
        check_shape_fields(raw, str(config_file))  # before transformers allocates from it
    try:
        # Our hetero type is registered locally, so no remote code is needed.
        return AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise AutoCompressError(
            f"could not read the model config of {source}: {_first_line(err)}",
            hint="pass a Hugging Face model directory made by save_pretrained",
        ) from err


def _check_loading_info(info: dict, source: str) -> None:
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    mismatched = info.get("mismatched_keys", [])
    if missing or mismatched:
        names = [str(k) for k in list(missing) + list(mismatched)][:3]
        raise AutoCompressError(
            f"the checkpoint in {source} does not match its config "
            f"({len(missing)} missing, {len(mismatched)} mis-shaped tensors, e.g. {names})",
            hint="the checkpoint is corrupt or incomplete: re-save it with save_pretrained",
        )


def _load_tokenizer(source: str) -> Any | None:
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if Path(source).is_dir() and not any((Path(source) / n).exists() for n in names):
        return None
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise AutoCompressError(
            f"could not load the tokenizer of {source}: {_first_line(err)}",
            hint="re-save the tokenizer with save_pretrained into the model directory",
        ) from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# ------------------------------------------------------- specs and configs


def arch_spec_of(model_or_config: Any) -> ArchSpec:
    """The ArchSpec of a supported model or config."""
    config = getattr(model_or_config, "config", model_or_config)
    check_supported(config)
    return ArchSpec.from_hf_config(config)


def hetero_config_from(
    spec: ArchSpec,
    base_config: Any,
    *,
    source_layers: list[int] | None = None,
) -> HeteroConfig:
    """A HeteroConfig with ``spec``'s shapes and everything else from ``base_config``.

    ``base_config``: the teacher's config (Llama family or hetero); it supplies
    RoPE, norm epsilon, activation, special tokens, sliding window, and any
    optional spec fields left unset. ``source_layers[i]``: the teacher layer that
    student layer ``i`` comes from (for per-layer attention types) — defaults to
    the identity.
    ``base_config=None`` uses Llama defaults (SiLU, eps 1e-5, RoPE theta 10000)
    and needs a spec with every optional field set.
    """
    if base_config is None:
        base_config = _default_base_config(spec)
    check_supported(base_config)
    base_spec = ArchSpec.from_hf_config(base_config)
    spec = spec.complete_from(base_spec)
    source_layers = source_layers or list(range(spec.num_layers))
    base_types = _attention_types(base_config)
    layer_types = [base_types[src] if src < len(base_types) else None for src in source_layers]
    shared = {
        name: getattr(base_config, name) for name in _SHARED_FIELDS if hasattr(base_config, name)
    }
    config = HeteroConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        block_configs=[layer.model_dump() for layer in spec.layers],
        head_dim=spec.head_dim,
        tie_word_embeddings=bool(spec.tie_word_embeddings),
        rope_parameters=dict(base_config.rope_parameters),
        attention_bias=bool(spec.attention_bias),
        attention_output_bias=bool(spec.attention_output_bias),
        mlp_bias=bool(spec.mlp_bias),
        qk_norm=bool(spec.qk_norm),
        sliding_window=getattr(base_config, "sliding_window", None),
        layer_types=layer_types,
        source_model_type=getattr(base_config, "source_model_type", None) or base_config.model_type,
        **shared,
    )
    config._attn_implementation = getattr(base_config, "_attn_implementation", None)
    return config


def _attention_types(config: Any) -> list[str]:
    """Per-layer attention type of a supported config (full or sliding)."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return list(types)
    # Mistral: one global window applies to every layer.
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [kind] * config.num_hidden_layers


def _default_base_config(spec: ArchSpec) -> Any:
    """A Llama config carrying only non-shape defaults, for specs built without a teacher."""
    missing = [name for name in ("head_dim", "vocab_size") if getattr(spec, name) is None]
    if missing:
        raise AutoCompressError(
            f"the spec does not set {', '.join(missing)} and no base config was given",
            hint="set them in the spec, or pass the teacher's config",
        )
    first = next((la.attention for la in spec.layers if la.attention), None)
    heads = first.num_heads if first else 1
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.head_dim * heads,  # only to satisfy LlamaConfig's own check
        num_attention_heads=heads,
        num_key_value_heads=first.num_kv_heads if first else 1,
        head_dim=spec.head_dim,
        num_hidden_layers=spec.num_layers,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
    )


def build_model(
    spec: ArchSpec,
    base_config: Any = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> HeteroForCausalLM:
    """A HeteroForCausalLM of shape ``spec`` with random weights (seeded), in eval mode.

    ``base_config``: the teacher's config for non-shape settings (RoPE, eps, ...);
    None uses Llama defaults.
    """
    if base_config is None:
        base_config = _default_base_config(spec)
    spec.complete_from(ArchSpec.from_hf_config(base_config)).validate_legality()
    config = hetero_config_from(spec, base_config)
    torch.manual_seed(seed)
    model = HeteroForCausalLM(config).to(dtype)
    return model.eval()


def to_hetero(model: PreTrainedModel) -> HeteroForCausalLM:
    """Convert a supported Llama-family model into an equivalent HeteroForCausalLM.

    Weight names are the same, so this is a config translation plus a strict
    state-dict copy; logits are identical.
    """
    if isinstance(model, HeteroForCausalLM):
        return model
    spec = arch_spec_of(model)
    config = hetero_config_from(spec, model.config)
    dtype = next(model.parameters()).dtype
    hetero = HeteroForCausalLM(config).to(dtype)
    hetero.load_state_dict(model.state_dict(), strict=True)
    if getattr(model, "generation_config", None) is not None:
        hetero.generation_config = model.generation_config
    return hetero.to(next(model.parameters()).device).train(model.training)
