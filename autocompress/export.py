"""Export to heterogeneous checkpoint formats that serving engines already read.

``nemotron-nas`` (``architectures: ["DeciLMForCausalLM"]``) is the format of
NVIDIA's Puzzle/Nemotron-NAS models, read by vLLM (``nemotron_nas.py``),
TensorRT-LLM and llama.cpp (``deci``). Its config has, per layer::

    {"attention": {"no_op": bool, "replace_with_linear": false, "n_heads_in_group": int},
     "ffn": {"no_op": bool, "replace_with_linear": false, "ffn_mult": float}}

Rules (as vLLM applies them): query heads are *global* (``num_attention_heads``),
``num_kv_heads = num_attention_heads / n_heads_in_group``, and the FFN width is
``round_up_256(int(2 * ffn_mult * hidden_size / 3))``. Newer checkpoints write
``ffn.intermediate_size`` instead of ``ffn_mult`` (``ffn_format="intermediate_size"``).
Weight names are the Llama ones, which our model already uses.

The export refuses (AutoCompressError naming the layer) what the format cannot
express: per-layer query-head counts, FFN widths the ``ffn_mult`` rule cannot
reproduce, Qwen3's q/k norms. Softer mismatches (Qwen2-style q/k/v-only bias,
head_dim not equal to hidden/heads, sliding windows) are written and reported
as warnings, because some engines read them and others do not.

The export carries its own remote code (``configuration_decilm.py``,
``modeling_decilm.py`` and the heterogeneous decoder they build on, siblings with
relative imports) and lists both in ``auto_map``, so
``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` loads it
where AutoCompress is not installed; the config class reads ``block_configs``
with attribute access under transformers 4.x (vLLM, TensorRT-LLM) and 5.x.

Next to it we write ``per_layer_config.json``: the same shapes as a transformers
v5 ``LlamaConfig`` with ``per_layer_config`` overrides (``skip`` lists
``self_attn`` / ``mlp`` for removed blocks), a record for tools that use that field.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel
from safetensors.torch import save_file

from autocompress.arch import ArchSpec
from autocompress.errors import AutoCompressError

FFN_MULTIPLE = 256
FfnFormat = Literal["ffn_mult", "intermediate_size"]
_COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
)
# The remote code written next to the weights: siblings with relative imports only.
_REMOTE_CODE = tuple(
    Path(__file__).parent / "modeling" / name
    for name in (
        "configuration_decilm.py",
        "modeling_decilm.py",
        "configuration_autocompress_hetero.py",
        "modeling_autocompress_hetero.py",
    )
)
AUTO_MAP = {
    "AutoConfig": "configuration_decilm.DeciLMConfig",
    "AutoModelForCausalLM": "modeling_decilm.DeciLMForCausalLM",
}


class ExportReport(BaseModel):
    """What an export wrote, and what an engine may read differently."""

    out_dir: str
    format: str
    num_layers: int
    num_params: int
    warnings: list[str]


# ----------------------------------------------------------------- the rule


def ffn_mult_to_intermediate_size(ffn_mult: float, hidden_size: int) -> int:
    """DeciLM's FFN width rule: round_up_256(int(2 * ffn_mult * hidden / 3))."""
    width = int(2 * ffn_mult * hidden_size / 3)
    return -(-width // FFN_MULTIPLE) * FFN_MULTIPLE


def ffn_mult_for(intermediate_size: int, hidden_size: int) -> float | None:
    """An ``ffn_mult`` whose rule gives exactly ``intermediate_size``, or None if none does."""
    if intermediate_size % FFN_MULTIPLE:
        return None
    # Any int(...) in (I - 256, I] rounds up to I: aim at the middle of that window.
    target = intermediate_size - FFN_MULTIPLE / 2
    for digits in (4, 6, 8, 12):
        mult = round(3 * target / (2 * hidden_size), digits)
        if ffn_mult_to_intermediate_size(mult, hidden_size) == intermediate_size:
            return mult
    return None


# ---------------------------------------------------------------- checking


def nemotron_nas_problems(spec: ArchSpec, ffn_format: FfnFormat = "ffn_mult") -> list[str]:
    """Reasons ``spec`` cannot be written as nemotron-nas (empty = it can)."""
    problems = []
    heads = {la.attention.num_heads for la in spec.layers if la.attention}
    if len(heads) > 1:
        per_layer = ", ".join(
            f"layer {i}: {la.attention.num_heads}"
            for i, la in enumerate(spec.layers)
            if la.attention
        )
        problems.append(
            "nemotron-nas has one global query-head count, but the query heads differ "
            f"per layer ({per_layer})"
        )
    if spec.qk_norm:
        problems.append("nemotron-nas has no q/k RMSNorm (Qwen3-style qk_norm)")
    if ffn_format == "ffn_mult":
        for i, layer in enumerate(spec.layers):
            if layer.ffn and ffn_mult_for(layer.ffn.intermediate_size, spec.hidden_size) is None:
                problems.append(
                    f"layer {i}: intermediate_size {layer.ffn.intermediate_size} is not "
                    f"round_up_256(int(2*ffn_mult*{spec.hidden_size}/3)) for any ffn_mult "
                    f"(it must be a multiple of {FFN_MULTIPLE})"
                )
    return problems


def _warnings(spec: ArchSpec, config: Any) -> list[str]:
    notes = []
    heads = next(la.attention.num_heads for la in spec.layers if la.attention)
    if spec.head_dim * heads != spec.hidden_size:
        notes.append(
            f"head_dim {spec.head_dim} != hidden_size/num_attention_heads "
            f"({spec.hidden_size}/{heads}); engines that ignore the head_dim field misread it"
        )
    if spec.attention_bias and not spec.attention_output_bias:
        notes.append("q/k/v bias without o_proj bias is written as qkv_bias=true (vLLM reads it)")
    if spec.attention_output_bias and not spec.attention_bias:
        notes.append("o_proj bias without q/k/v bias is not representable by flags")
    if getattr(config, "sliding_window", None):
        notes.append(f"sliding_window {config.sliding_window} is written but DeciLM ignores it")
    if spec.ffn_layers() and any(
        la.ffn.intermediate_size % FFN_MULTIPLE for la in spec.layers if la.ffn
    ):
        notes.append(f"some FFN widths are not multiples of {FFN_MULTIPLE}")
    return notes


# ------------------------------------------------------------------ writing


def nemotron_nas_config(
    spec: ArchSpec, base_config: Any, ffn_format: FfnFormat = "ffn_mult"
) -> dict[str, Any]:
    """The config.json dict of the nemotron-nas export of ``spec``."""
    problems = nemotron_nas_problems(spec, ffn_format)
    if problems:
        ffn_only = all("intermediate_size" in p for p in problems)
        raise AutoCompressError(
            "this model cannot be written as nemotron-nas: " + "; ".join(problems[:4]),
            hint="use --ffn-format intermediate_size (exact widths)"
            if ffn_only
            else "search with uniform query heads (and FFN granularity 256), no qk_norm teacher",
        )
    heads = next(la.attention.num_heads for la in spec.layers if la.attention)
    blocks = []
    for layer in spec.layers:
        attention: dict[str, Any] = {"no_op": layer.attention is None, "replace_with_linear": False}
        attention["n_heads_in_group"] = (
            layer.attention.num_heads // layer.attention.num_kv_heads if layer.attention else None
        )
        ffn: dict[str, Any] = {"no_op": layer.ffn is None, "replace_with_linear": False}
        if ffn_format == "ffn_mult":
            ffn["ffn_mult"] = (
                ffn_mult_for(layer.ffn.intermediate_size, spec.hidden_size) if layer.ffn else None
            )
        else:
            ffn["intermediate_size"] = layer.ffn.intermediate_size if layer.ffn else None
        blocks.append({"attention": attention, "ffn": ffn})
    rope = dict(getattr(base_config, "rope_parameters", None) or {})
    config = {
        "architectures": ["DeciLMForCausalLM"],
        "model_type": "nemotron-nas",
        "auto_map": dict(AUTO_MAP),
        "block_configs": blocks,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": bool(spec.tie_word_embeddings),
        "attention_bias": bool(spec.attention_output_bias),
        "qkv_bias": bool(spec.attention_bias),
        "mlp_bias": bool(spec.mlp_bias),
        "hidden_act": base_config.hidden_act,
        "rms_norm_eps": base_config.rms_norm_eps,
        "max_position_embeddings": base_config.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": rope if rope.get("rope_type", "default") != "default" else None,
        "bos_token_id": getattr(base_config, "bos_token_id", None),
        "eos_token_id": getattr(base_config, "eos_token_id", None),
        "pad_token_id": getattr(base_config, "pad_token_id", None),
        "sliding_window": getattr(base_config, "sliding_window", None),
        "dtype": "float32",
    }
    return config


def per_layer_config_record(spec: ArchSpec, base_config: Any) -> dict[str, Any]:
    """A transformers v5 LlamaConfig dict whose ``per_layer_config`` carries the shapes."""
    first = next(la.attention for la in spec.layers if la.attention)
    widths = [la.ffn.intermediate_size for la in spec.layers if la.ffn]
    overrides: dict[str, dict[str, Any]] = {}
    digits = len(str(max(spec.num_layers - 1, 0)))
    for i, layer in enumerate(spec.layers):
        entry: dict[str, Any] = {}
        skip = []
        if layer.attention is None:
            skip.append("self_attn")
        else:
            entry["num_attention_heads"] = layer.attention.num_heads
            entry["num_key_value_heads"] = layer.attention.num_kv_heads
        if layer.ffn is None:
            skip.append("mlp")
        else:
            entry["intermediate_size"] = layer.ffn.intermediate_size
        if skip:
            entry["skip"] = skip
        overrides[str(i).zfill(digits)] = entry
    rope = dict(getattr(base_config, "rope_parameters", None) or {})
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": first.num_heads,
        "num_key_value_heads": first.num_kv_heads,
        "intermediate_size": max(widths, default=0),
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": bool(spec.tie_word_embeddings),
        "attention_bias": bool(spec.attention_bias),
        "mlp_bias": bool(spec.mlp_bias),
        "hidden_act": base_config.hidden_act,
        "rms_norm_eps": base_config.rms_norm_eps,
        "max_position_embeddings": base_config.max_position_embeddings,
        "rope_parameters": rope,
        "per_layer_config": overrides,
    }


def export_nemotron_nas(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    ffn_format: FfnFormat = "ffn_mult",
    overwrite: bool = False,
) -> ExportReport:
    """Write the model in ``model_dir`` (any supported model) as a nemotron-nas checkpoint."""
    from autocompress.modeling import arch_spec_of, load_causal_lm

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise AutoCompressError(
            f"{out_dir} exists and is not empty", hint="pass another --out, or --overwrite"
        )
    model, _ = load_causal_lm(model_dir, with_tokenizer=False)
    spec = arch_spec_of(model)
    config = nemotron_nas_config(spec, model.config, ffn_format)
    config["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    state = _export_state(model, spec)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        record = per_layer_config_record(spec, model.config)
        (tmp / "per_layer_config.json").write_text(json.dumps(record, indent=2) + "\n")
        for source in _REMOTE_CODE:
            shutil.copy(source, tmp / source.name)
        for name in _COPIED_FILES:
            source = Path(model_dir) / name
            if source.is_file():
                shutil.copy(source, tmp / name)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(
        out_dir=str(out_dir),
        format=f"nemotron-nas ({ffn_format})",
        num_layers=spec.num_layers,
        num_params=spec.num_params(),
        warnings=_warnings(spec, model.config),
    )


def _export_state(model: torch.nn.Module, spec: ArchSpec) -> dict[str, torch.Tensor]:
    """Llama-named tensors; a tied LM head is stored once (as the embedding)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


# ------------------------------------------------------------------ reading


def spec_from_nemotron_nas(config: dict[str, Any]) -> ArchSpec:
    """The ArchSpec a nemotron-nas config.json describes, read the way vLLM reads it."""
    from autocompress.arch import AttentionSpec, FFNSpec, LayerSpec

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    layers = []
    for block in config["block_configs"]:
        att, ffn = block["attention"], block["ffn"]
        attention = None
        if not att.get("no_op"):
            attention = AttentionSpec(
                num_heads=heads, num_kv_heads=heads // att["n_heads_in_group"]
            )
        mlp = None
        if not ffn.get("no_op"):
            if ffn.get("ffn_mult") is not None:
                width = ffn_mult_to_intermediate_size(ffn["ffn_mult"], hidden)
            else:
                width = ffn["intermediate_size"]
            mlp = FFNSpec(intermediate_size=width)
        layers.append(LayerSpec(attention=attention, ffn=mlp))
    qkv_bias = config.get("qkv_bias", config.get("attention_bias", False))
    return ArchSpec(
        hidden_size=hidden,
        layers=layers,
        head_dim=config.get("head_dim") or hidden // heads,
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(qkv_bias),
        attention_output_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=False,
    )


def load_nemotron_nas(export_dir: str | Path):
    """Load a nemotron-nas export back as a HeteroForCausalLM (checks the export round trip)."""
    from safetensors.torch import load_file

    from autocompress.modeling import HeteroConfig, HeteroForCausalLM

    export_dir = Path(export_dir)
    config = json.loads((export_dir / "config.json").read_text())
    spec = spec_from_nemotron_nas(config)
    rope = config.get("rope_scaling") or {
        "rope_type": "default",
        "rope_theta": config.get("rope_theta", 10000.0),
    }
    hetero_config = HeteroConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        block_configs=[layer.model_dump() for layer in spec.layers],
        head_dim=spec.head_dim,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters=dict(rope),
        attention_bias=spec.attention_bias,
        attention_output_bias=spec.attention_output_bias,
        mlp_bias=spec.mlp_bias,
        hidden_act=config["hidden_act"],
        rms_norm_eps=config["rms_norm_eps"],
        max_position_embeddings=config["max_position_embeddings"],
        sliding_window=config.get("sliding_window"),
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
    )
    model = HeteroForCausalLM(hetero_config)
    state = load_file(export_dir / "model.safetensors")
    if spec.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()
