"""Export to the heterogeneous checkpoint format serving engines read: ``nemotron-nas``.

``nemotron-nas`` (``architectures: ["DeciLMForCausalLM"]``) is the format of
NVIDIA's Puzzle/Nemotron-NAS models, read by vLLM, TensorRT-LLM, llama.cpp
(``deci``) and transformers (remote code). Its config has, per layer::

    {"attention": {"no_op": bool, "replace_with_linear": false, "n_heads_in_group": int},
     "ffn": {"no_op": bool, "replace_with_linear": false, "ffn_mult": float,
             "intermediate_size": int}}

Query heads are global (``num_attention_heads``), ``num_kv_heads =
num_attention_heads / n_heads_in_group``, and the FFN width is
``round_up_256(int(2 * ffn_mult * hidden_size / 3))`` — or ``intermediate_size``
for readers that take it (vLLM, when a block has no ``ffn_mult``).

What each engine computes from such a checkpoint is written down in
``autocompress.engine_rules``. The export checks the model against the rules of
the engines asked for (``engines``; default: all of them) and, per rule, writes
a form those engines compute exactly (a zero-output attention block in layer 0,
a zero FFN where llama.cpp would drop an attention output, FFNs zero-padded to
multiples of 256, a copied LM head) or refuses with one line naming the rule.
Without an explicit engine it writes the most widely loadable form and reports
which engines will load it.

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
import shutil
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from safetensors.torch import save_file

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.atomic import check_not_input, check_out_dir, publishing_dir
from autocompress.engine_rules import FFN_MULTIPLE, EnginePlan, ModelFacts, plan_for
from autocompress.errors import AutoCompressError

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
    """What an export wrote and which engines compute it exactly."""

    out_dir: str
    format: str
    num_layers: int
    num_params: int
    engines: list[str]  # engines that load this export and compute the model exactly
    refused: dict[str, list[str]]  # engine -> the rules that keep it out
    stand_ins: dict[str, str]  # rule key -> the layers given an equivalent form
    added_params: int  # parameters the stand-ins add (all zero-valued)


# ----------------------------------------------------------------- the rule


def ffn_mult_to_intermediate_size(ffn_mult: float, hidden_size: int) -> int:
    """DeciLM's FFN width rule: round_up_256(int(2 * ffn_mult * hidden / 3))."""
    width = int(2 * ffn_mult * hidden_size / 3)
    return -(-width // FFN_MULTIPLE) * FFN_MULTIPLE


def ffn_mult_for(intermediate_size: int, hidden_size: int) -> float | None:
    """An ``ffn_mult`` of at most 6 decimals whose rule gives exactly ``intermediate_size``.

    Six decimals because the hub's ``FFNConfig`` rounds ``ffn_mult`` to 6 digits
    on load. None when no such value exists (width not a multiple of 256).
    """
    if intermediate_size % FFN_MULTIPLE or intermediate_size <= 0:
        return None
    # Any int(...) in (I - 256, I] rounds up to I: aim at the middle of that window.
    target = intermediate_size - FFN_MULTIPLE / 2
    for digits in (4, 6):
        mult = round(3 * target / (2 * hidden_size), digits)
        if ffn_mult_to_intermediate_size(mult, hidden_size) == intermediate_size:
            return mult
    return None


# ------------------------------------------------------------ stand-ins


def _zeros_like_block(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> dict:
    return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}


def _zero_attention(spec: ArchSpec, i: int, heads: int, dtype: torch.dtype) -> dict:
    """A 1-KV-head attention block whose o_proj is zero: it adds exactly 0."""
    h, d, p = spec.hidden_size, spec.head_dim, f"model.layers.{i}."
    shapes = {
        p + "self_attn.q_proj.weight": (heads * d, h),
        p + "self_attn.k_proj.weight": (d, h),
        p + "self_attn.v_proj.weight": (d, h),
        p + "self_attn.o_proj.weight": (h, heads * d),
    }
    if spec.attention_bias:
        shapes |= {p + f"self_attn.{x}_proj.bias": (n,) for x, n in
                   (("q", heads * d), ("k", d), ("v", d))}
    if spec.attention_output_bias:
        shapes[p + "self_attn.o_proj.bias"] = (h,)
    state = _zeros_like_block(shapes, dtype)
    state[p + "input_layernorm.weight"] = torch.ones(h, dtype=dtype)
    return state


def _zero_ffn(spec: ArchSpec, i: int, dtype: torch.dtype) -> dict:
    """A 256-wide FFN with zero weights: it adds exactly 0."""
    h, w, p = spec.hidden_size, FFN_MULTIPLE, f"model.layers.{i}.mlp."
    shapes = {p + "gate_proj.weight": (w, h), p + "up_proj.weight": (w, h),
              p + "down_proj.weight": (h, w)}
    if spec.mlp_bias:
        shapes |= {p + "gate_proj.bias": (w,), p + "up_proj.bias": (w,), p + "down_proj.bias": (h,)}
    state = _zeros_like_block(shapes, dtype)
    state[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
    return state


def _pad_ffn(state: dict, i: int, width: int) -> None:
    """Zero-pad layer ``i``'s FFN to ``width`` units: the new units output exactly 0."""
    p = f"model.layers.{i}.mlp."
    for name in ("gate_proj", "up_proj"):
        weight = state[p + name + ".weight"]
        state[p + name + ".weight"] = torch.cat([weight, weight.new_zeros(width - len(weight),
                                                                          weight.shape[1])])
        if p + name + ".bias" in state:
            bias = state[p + name + ".bias"]
            state[p + name + ".bias"] = torch.cat([bias, bias.new_zeros(width - len(bias))])
    down = state[p + "down_proj.weight"]
    state[p + "down_proj.weight"] = torch.cat(
        [down, down.new_zeros(down.shape[0], width - down.shape[1])], dim=1
    )


def _drop_zero_biases(state: dict, spec: ArchSpec) -> ArchSpec:
    """All-zero biases are removed (every engine then computes the same thing)."""
    for name in [n for n in state if n.endswith(".bias")]:
        del state[name]
    return spec.model_copy(
        update={"attention_bias": False, "attention_output_bias": False, "mlp_bias": False}
    )


def apply_stand_ins(
    state: dict[str, torch.Tensor], spec: ArchSpec, plan: EnginePlan, nonzero_bias: bool
) -> ArchSpec:
    """Rewrite ``state`` (in place) into the form ``plan``'s engines compute exactly.

    Returns the spec of what is written. Every change adds only zero-output
    blocks or zero-valued units, so the logits are unchanged.
    """
    dtype = state["model.embed_tokens.weight"].dtype
    if not nonzero_bias and (spec.attention_bias or spec.attention_output_bias or spec.mlp_bias):
        spec = _drop_zero_biases(state, spec)
    heads = next(la.attention.num_heads for la in spec.layers if la.attention)
    layers = [layer.model_copy() for layer in spec.layers]
    if plan.needs("first-layer-no-attention"):
        state.update(_zero_attention(spec, 0, heads, dtype))
        layers[0] = LayerSpec(attention=AttentionSpec(num_heads=heads, num_kv_heads=1),
                              ffn=layers[0].ffn)
    for i, layer in enumerate(layers):
        needs_ffn = layer.ffn is None and (
            (plan.needs("attention-without-ffn") and layer.attention is not None)
            or (plan.needs("empty-last-layer") and i == len(layers) - 1 and layer.is_empty)
        )
        if needs_ffn:
            state.update(_zero_ffn(spec, i, dtype))
            layers[i] = LayerSpec(attention=layer.attention,
                                  ffn=FFNSpec(intermediate_size=FFN_MULTIPLE))
        elif plan.needs("ffn-width") and layer.ffn and layer.ffn.intermediate_size % FFN_MULTIPLE:
            width = -(-layer.ffn.intermediate_size // FFN_MULTIPLE) * FFN_MULTIPLE
            _pad_ffn(state, i, width)
            layers[i] = LayerSpec(attention=layer.attention, ffn=FFNSpec(intermediate_size=width))
    if spec.tie_word_embeddings:
        if plan.needs("tied-embeddings"):
            state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
        else:
            state.pop("lm_head.weight", None)
    return spec.model_copy(update={"layers": layers})


# ------------------------------------------------------------------ writing


def export_refusal(model_dir: str | Path, engine: str) -> str | None:
    """Why an export of the model in ``model_dir`` for ``engine`` would be refused (the
    first rule it breaks, one line), or None where ``engine`` computes it exactly; nothing
    is written."""
    from autocompress.modeling import load_causal_lm

    model, _ = load_causal_lm(model_dir, with_tokenizer=False)
    try:
        plan_for(ModelFacts.of(model, model_dir), [engine])
    except AutoCompressError as err:
        return err.message
    return None


def nemotron_nas_config(spec: ArchSpec, base_config: Any, facts: ModelFacts) -> dict[str, Any]:
    """The config.json dict of the nemotron-nas export of ``spec`` (as written)."""
    heads = next(la.attention.num_heads for la in spec.layers if la.attention)
    widths = [la.ffn.intermediate_size for la in spec.layers if la.ffn]
    # ffn_mult where every width allows it (TensorRT-LLM, llama.cpp, the hub code
    # need it); intermediate_size always (vLLM and newer readers).
    with_mult = all(w % FFN_MULTIPLE == 0 for w in widths)
    blocks = []
    for layer in spec.layers:
        att, ffn = layer.attention, layer.ffn
        attention = {"no_op": att is None, "replace_with_linear": False,
                     "n_heads_in_group": att.num_heads // att.num_kv_heads if att else None}
        mlp: dict[str, Any] = {"no_op": ffn is None, "replace_with_linear": False}
        if with_mult:
            mlp["ffn_mult"] = ffn_mult_for(ffn.intermediate_size, spec.hidden_size) if ffn else None
        mlp["intermediate_size"] = ffn.intermediate_size if ffn else None
        blocks.append({"attention": attention, "ffn": mlp})
    rope = dict(getattr(base_config, "rope_parameters", None) or {})
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    kv = [la.attention.num_kv_heads for la in spec.layers if la.attention]
    return {
        "architectures": ["DeciLMForCausalLM"],
        "model_type": "nemotron-nas",
        "auto_map": dict(AUTO_MAP),
        "block_configs": blocks,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": heads,
        # Summaries only (the blocks decide): TensorRT-LLM's converter reads them.
        "num_key_value_heads": max(kv),
        "intermediate_size": max(widths, default=0),
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
        "rope_scaling": scaling if scaling.get("rope_type", "default") != "default" else None,
        "bos_token_id": getattr(base_config, "bos_token_id", None),
        "eos_token_id": getattr(base_config, "eos_token_id", None),
        "pad_token_id": getattr(base_config, "pad_token_id", None),
        # A window that never applies (>= max positions) is dropped: exact everywhere.
        "sliding_window": facts.sliding_window if facts.window_applies else None,
        "dtype": "float32",
    }


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
    engines: list[str] | None = None,
    overwrite: bool = False,
) -> ExportReport:
    """Write the model in ``model_dir`` as a nemotron-nas checkpoint for ``engines``.

    ``engines=None`` writes the form most engines compute exactly and reports
    which; an explicit list refuses (AutoCompressError naming the rule) when one
    of them cannot compute the model exactly.
    """
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import arch_spec_of, load_causal_lm

    model_dir = resolve_model_dir(model_dir)  # a named teacher's files (tokenizer) too
    check_not_input(out_dir, model_dir)  # --out M --overwrite would delete the model read
    out_dir = check_out_dir(out_dir, overwrite)
    model, _ = load_causal_lm(model_dir, with_tokenizer=False)
    facts = ModelFacts.of(model, model_dir)
    plan = plan_for(facts, engines)
    state = {k: v.detach().contiguous().cpu().clone() for k, v in model.state_dict().items()}
    spec = apply_stand_ins(state, arch_spec_of(model), plan, facts.nonzero_bias)
    config = nemotron_nas_config(spec, model.config, facts)
    config["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    record = per_layer_config_record(spec, model.config)
    _write(out_dir, model_dir, state, config, record, overwrite)
    return ExportReport(
        out_dir=str(out_dir),
        format="nemotron-nas",
        num_layers=spec.num_layers,
        num_params=spec.num_params(),
        engines=plan.engines,
        refused=plan.refused,
        stand_ins=plan.stand_ins,
        added_params=spec.num_params() - facts.spec.num_params(),
    )


def _write(out_dir: Path, model_dir, state, config, record, overwrite: bool) -> None:
    """Write everything into a temporary sibling, then move it into place."""
    with publishing_dir(out_dir, overwrite=overwrite) as tmp:
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "per_layer_config.json").write_text(json.dumps(record, indent=2) + "\n")
        for source in _REMOTE_CODE:
            shutil.copy(source, tmp / source.name)
        for name in _COPIED_FILES:
            source = Path(model_dir) / name
            if source.is_file():
                shutil.copy(source, tmp / name)


# ------------------------------------------------------------------ reading


def load_nemotron_nas(export_dir: str | Path):
    """Load a nemotron-nas export as a HeteroForCausalLM, reading its config as vLLM does.

    The same reader as the export's remote code (``modeling_decilm.hetero_config_of``).
    """
    from safetensors.torch import load_file

    from autocompress.modeling import HeteroForCausalLM
    from autocompress.modeling.configuration_decilm import DeciLMConfig
    from autocompress.modeling.modeling_decilm import hetero_config_of

    export_dir = Path(export_dir)
    raw = json.loads((export_dir / "config.json").read_text())
    config = DeciLMConfig.from_dict({k: v for k, v in raw.items() if k != "auto_map"})
    model = HeteroForCausalLM(hetero_config_of(config))
    state = load_file(export_dir / "model.safetensors")
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model.eval()


def spec_from_nemotron_nas(config: dict[str, Any]) -> ArchSpec:
    """The ArchSpec a nemotron-nas config.json describes (read as vLLM reads it)."""
    from autocompress.modeling import arch_spec_of
    from autocompress.modeling.configuration_decilm import DeciLMConfig
    from autocompress.modeling.modeling_decilm import hetero_config_of

    decilm = DeciLMConfig.from_dict({k: v for k, v in config.items() if k != "auto_map"})
    return arch_spec_of(hetero_config_of(decilm))
