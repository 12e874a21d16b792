"""Write any model AutoCompress makes as a GGUF file that llama.cpp runs exactly.

A homogeneous model is written as llama.cpp's ``llama`` architecture; a
heterogeneous one as ``deci`` (the Nemotron-NAS family), whose per-layer arrays
``deci.attention.head_count``, ``deci.attention.head_count_kv`` and
``deci.feed_forward_length`` hold each layer's query heads, KV heads and FFN width.

What the ``deci`` graph computes (read in llama.cpp's ``src/models/deci.cpp``)
differs from our model in three places; the *layout plan* (``gguf_layout``)
represents each case so that the engine computes the same function:

- a layer whose blocks are both removed is the identity: it is left out of the
  file, except the last one, which is written as a zero FFN (``n_ff = 1``, zero
  ``ffn_down``) without attention. The engine runs its last layer's FFN on the
  output rows only, so keeping the model's last layer last keeps every other
  FFN's prefill cost where the cost model puts it (and an entirely empty last
  layer would abort the engine at decode);
- ``n_ff == 0`` skips the residual add of that layer's attention output, so an
  attention-only layer is written with ``n_ff = 1`` and a zero ``ffn_down``
  (the FFN then adds exactly zero);
- the head size is read through layer 0's head count, so a first layer without
  attention is written with one query and one KV head whose ``attn_output`` is
  zero (the attention then adds exactly zero).

Hugging Face Llama-family models rotate q/k in two halves per head; llama.cpp's
``llama``/``deci`` rope rotates adjacent pairs, so the rows of q and k (and their
biases) are reordered per head: new row ``2i`` is old row ``i``, new ``2i+1`` is
old ``i + d/2``.

Types: ``f32``; ``f16`` (2-D weights in f16, norms f32); ``q8_0`` / ``q4_0``
(2-D weights quantized by the ``gguf`` package; a weight whose rows are not a
multiple of the 32-value block is written in f16 and reported).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec
from autocompress.atomic import atomic_path, check_not_input, check_out_file
from autocompress.errors import AutoCompressError

GGUF_DTYPES = ("f32", "f16", "q8_0", "q4_0")
GGUF_NAME = "model.gguf"
# Our own metadata key: the source model's ArchSpec (JSON), which the layout plan
# cannot be inverted to (a zero FFN or a dummy head looks like a real one).
SPEC_KEY = "autocompress.arch_spec"


class GGUFLayer(BaseModel):
    """One layer as written to the file (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    source: int = Field(description="Index of the model's layer this one comes from.")
    n_head: int
    n_head_kv: int
    n_ff: int
    dummy_attention: bool = Field(
        default=False, description="1 q / 1 KV head with a zero attn_output (layer 0 trap).")
    zero_ffn: bool = Field(
        default=False, description="n_ff = 1 with a zero ffn_down (attention-only layer).")


class GGUFExportReport(BaseModel):
    """What ``export_gguf`` wrote."""

    path: str
    architecture: str
    dtype: str
    num_layers: int = Field(description="Layers in the file (empty layers are left out).")
    num_params: int = Field(description="Parameters of the source model.")
    layers: list[GGUFLayer]
    tokenizer: str
    notes: list[str]


# ------------------------------------------------------------------- layout


def gguf_architecture(spec: ArchSpec) -> str:
    """``llama`` for a homogeneous model, ``deci`` otherwise."""
    return "llama" if spec.is_homogeneous() else "deci"


def gguf_layout(spec: ArchSpec) -> list[GGUFLayer]:
    """The layers as the file holds them, with the ``deci`` traps represented exactly."""
    layers: list[GGUFLayer] = []
    last = len(spec.layers) - 1
    for index, layer in enumerate(spec.layers):
        if layer.is_empty and (index < last or not layers):
            continue
        att, ffn = layer.attention, layer.ffn
        dummy = att is None and not layers
        layers.append(GGUFLayer(
            source=index,
            n_head=att.num_heads if att else int(dummy),
            n_head_kv=att.num_kv_heads if att else int(dummy),
            n_ff=ffn.intermediate_size if ffn else 1,
            dummy_attention=dummy,
            zero_ffn=ffn is None,
        ))
    if not layers or not any(la.n_head for la in layers):
        raise AutoCompressError("a model without any attention block cannot be written as GGUF",
                                hint="keep at least one attention block")
    return layers


def gguf_problems(spec: ArchSpec, config: Any) -> list[str]:
    """Reasons the model cannot be written exactly (empty = it can)."""
    problems = []
    if spec.qk_norm:
        problems.append("q/k RMSNorm (Qwen3-style qk_norm) has no place in llama/deci")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        problems.append(f"rope_type {rope['rope_type']!r} (only the default RoPE is written)")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"activation {config.hidden_act!r} (llama/deci use SiLU)")
    return problems


# ------------------------------------------------------------------ tensors


def rope_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder q/k rows per head from HF's half rotation to llama.cpp's pair rotation."""
    rows = weight.shape[0]
    d = rows // n_heads
    rest = weight.shape[1:]
    return weight.reshape(n_heads, 2, d // 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def _layer_tensors(
    state: dict[str, np.ndarray], spec: ArchSpec, layer: GGUFLayer, out_index: int
) -> dict[str, np.ndarray]:
    """GGUF tensors of one layer from the HF state dict (numpy, f32)."""
    src, blk, h = f"model.layers.{layer.source}.", f"blk.{out_index}.", spec.hidden_size
    tensors: dict[str, np.ndarray] = {}
    if layer.dummy_attention:
        d = spec.head_dim
        tensors[blk + "attn_norm.weight"] = np.ones(h, np.float32)
        for name in ("attn_q", "attn_k", "attn_v"):
            tensors[f"{blk}{name}.weight"] = np.zeros((d, h), np.float32)
        tensors[blk + "attn_output.weight"] = np.zeros((h, d), np.float32)
    elif layer.n_head:
        tensors[blk + "attn_norm.weight"] = state[src + "input_layernorm.weight"]
        names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
                 "o_proj": "attn_output"}
        heads = {"q_proj": layer.n_head, "k_proj": layer.n_head_kv}
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                value = state.get(f"{src}self_attn.{hf}.{kind}")
                if value is None:
                    continue
                tensors[f"{blk}{gg}.{kind}"] = (
                    rope_permute(value, heads[hf]) if hf in heads else value)
    if layer.zero_ffn:
        tensors[blk + "ffn_norm.weight"] = np.ones(h, np.float32)
        tensors[blk + "ffn_gate.weight"] = np.zeros((1, h), np.float32)
        tensors[blk + "ffn_up.weight"] = np.zeros((1, h), np.float32)
        tensors[blk + "ffn_down.weight"] = np.zeros((h, 1), np.float32)
    else:
        tensors[blk + "ffn_norm.weight"] = state[src + "post_attention_layernorm.weight"]
        for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
            for kind in ("weight", "bias"):
                value = state.get(f"{src}mlp.{hf}.{kind}")
                if value is not None:
                    tensors[f"{blk}{gg}.{kind}"] = value
    return tensors


def gguf_tensors(model: torch.nn.Module, spec: ArchSpec, layout: list[GGUFLayer]):
    """All GGUF tensors (f32 numpy arrays, GGUF names) in file order."""
    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"]}
    for out_index, layer in enumerate(layout):
        tensors.update(_layer_tensors(state, spec, layer, out_index))
    tensors["output_norm.weight"] = state["model.norm.weight"]
    if not spec.tie_word_embeddings:  # tied: llama.cpp reuses token_embd
        tensors["output.weight"] = state["lm_head.weight"]
    return tensors


def _encode(array: np.ndarray, dtype: str):
    """(data, raw GGML type or None) of one tensor; the type actually used, by name."""
    import gguf

    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim == 1 or dtype == "f32":
        return array, None, "f32"
    if dtype == "f16" or array.shape[-1] % 32:
        return array.astype(np.float16), None, "f16"
    qtype = gguf.GGMLQuantizationType[dtype.upper()]
    return gguf.quants.quantize(array, qtype), qtype, dtype


# ---------------------------------------------------------------- tokenizer


def _tokenizer_metadata(model_dir: Path, vocab_size: int) -> dict[str, Any]:
    """Tokens, types, merges, pre-tokenizer and special ids of a byte-level BPE tokenizer."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise AutoCompressError(f"{model_dir} has no tokenizer.json",
                                hint="GGUF needs the tokenizer: save it beside the model")
    data = json.loads(path.read_text())
    model = data.get("model", {})
    if model.get("type") != "BPE":
        raise AutoCompressError(f"the tokenizer is {model.get('type')}, not byte-level BPE",
                                hint="only GPT-2-style BPE tokenizers are written to GGUF")
    pre = _pre_tokenizer_name(data.get("pre_tokenizer"))
    vocab = dict(model["vocab"])
    special = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    vocab.update(special)
    if max(vocab.values()) >= vocab_size:
        raise AutoCompressError("the tokenizer has ids beyond the model's vocabulary",
                                hint="the tokenizer does not belong to this model")
    control = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [5] * vocab_size  # llama.cpp token types: 1 normal, 3 control, 4 user, 5 unused
    for text, index in vocab.items():
        tokens[index] = text
        types[index] = 3 if index in control else (4 if text in special else 1)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre,
            "special": special}


def _pre_tokenizer_name(pre: dict | None) -> str:
    """The llama.cpp pre-tokenizer whose splitting regex is the tokenizer's.

    GPT-2's ByteLevel regex alone is ``gpt-2``; digits split one by one before it is
    ``smollm`` (llama.cpp's regex lists: ``\\p{N}`` then the GPT-2 one).
    """
    def byte_level(p: dict) -> bool:
        return p.get("type") == "ByteLevel" and p.get("use_regex", True)

    if pre and byte_level(pre):
        return "gpt-2"
    parts = (pre or {}).get("pretokenizers") or []
    if (len(parts) == 2 and parts[0].get("type") == "Digits"
            and parts[0].get("individual_digits") and byte_level(parts[1])):
        return "smollm"
    raise AutoCompressError(
        f"the tokenizer's pre-tokenizer {json.dumps(pre)[:120]} has no llama.cpp equivalent "
        "known to AutoCompress", hint="GGUF export supports GPT-2 and SmolLM byte-level BPE")


def _chat_template(model_dir: Path) -> str | None:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
    return None


def _special_id(value: Any, special: dict[str, int]) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return special.get(value)
    if isinstance(value, dict):
        return special.get(value.get("content"))
    return None


def _placeholder_tokenizer(vocab_size: int) -> dict[str, Any]:
    """A vocabulary of ``[TOKi]`` entries: enough for the engine to run token ids."""
    return {"tokens": [f"[TOK{i}]" for i in range(vocab_size)], "types": [1] * vocab_size,
            "merges": ["[TOK0] [TOK1]"], "pre": "gpt-2", "special": {}}  # needs one merge


def _add_tokenizer(writer, model_dir: Path | None, config: Any, vocab_size: int) -> str:
    if model_dir is None:
        meta = _placeholder_tokenizer(vocab_size)
    else:
        meta = _tokenizer_metadata(model_dir, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(meta["pre"])
    writer.add_token_list(meta["tokens"])
    writer.add_token_types(meta["types"])
    writer.add_token_merges(meta["merges"])
    if model_dir is None:
        return "placeholder vocabulary (timing only)"
    tok_config_path = model_dir / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.is_file() else {}
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("pad", writer.add_pad_token_id)):
        token = _special_id(getattr(config, f"{key}_token_id", None), meta["special"])
        if token is None:
            token = _special_id(tok_config.get(f"{key}_token"), meta["special"])
        if token is not None:
            add(token)
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    template = _chat_template(model_dir)
    if template:
        writer.add_chat_template(template)
    return f"gpt2 BPE, pre-tokenizer {meta['pre']}, {len(meta['merges'])} merges" + (
        ", chat template" if template else "")


# ------------------------------------------------------------------- writer


def _add_hparams(writer, arch: str, spec: ArchSpec, config: Any, layout: list[GGUFLayer]):
    rope = dict(getattr(config, "rope_parameters", None) or {})
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(spec.hidden_size)
    writer.add_block_count(len(layout))
    per_layer = arch == "deci"
    first = layout[0]
    writer.add_feed_forward_length([la.n_ff for la in layout] if per_layer else first.n_ff)
    writer.add_head_count([la.n_head for la in layout] if per_layer else first.n_head)
    writer.add_head_count_kv([la.n_head_kv for la in layout] if per_layer else first.n_head_kv)
    # Required: llama.cpp otherwise derives the head size as hidden / n_head[0].
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(spec.vocab_size)


def write_gguf(
    model: torch.nn.Module, tokenizer_dir: str | Path | None, out_path: str | Path,
    dtype: str = "f32", name: str = "autocompress",
) -> GGUFExportReport:
    """Write ``model`` (a loaded supported model) to ``out_path`` atomically.

    ``tokenizer_dir``: where tokenizer.json lives; None writes a placeholder
    vocabulary (models timed with token ids only)."""
    import gguf

    from autocompress.modeling import arch_spec_of

    if dtype not in GGUF_DTYPES:
        raise AutoCompressError(f"unknown GGUF dtype {dtype!r}",
                                hint=f"use one of {', '.join(GGUF_DTYPES)}")
    spec = arch_spec_of(model)
    problems = gguf_problems(spec, model.config)
    if problems:
        raise AutoCompressError("this model cannot be written exactly as GGUF: "
                                + "; ".join(problems), hint="llama.cpp's llama/deci "
                                "architectures do not compute it; export another format")
    arch = gguf_architecture(spec)
    layout = gguf_layout(spec)
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_name(name)
        writer.add_string(SPEC_KEY, spec.to_json(indent=None))
        _add_hparams(writer, arch, spec, model.config, layout)
        writer.add_file_type(_FILE_TYPES[dtype])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        tokenizer = _add_tokenizer(writer, Path(tokenizer_dir) if tokenizer_dir else None,
                                   model.config, spec.vocab_size)
        fallback = []
        for tensor_name, array in gguf_tensors(model, spec, layout).items():
            data, raw, used = _encode(array, dtype)
            if used != dtype and array.ndim > 1:
                fallback.append(tensor_name)
            writer.add_tensor(tensor_name, data, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return GGUFExportReport(
        path=str(out_path), architecture=arch, dtype=dtype, num_layers=len(layout),
        num_params=spec.num_params(), layers=layout, tokenizer=tokenizer,
        notes=_notes(spec, layout, fallback, dtype))


def _notes(spec: ArchSpec, layout: list[GGUFLayer], fallback: list[str], dtype: str) -> list[str]:
    notes = []
    dropped = spec.num_layers - len(layout)
    if dropped:
        notes.append(f"{dropped} empty layer(s) left out (identity)")
    if any(la.dummy_attention for la in layout):
        notes.append("first layer has no attention: written with 1 q / 1 KV head and a zero "
                     "attn_output (llama.cpp reads the head size through layer 0)")
    zero = sum(la.zero_ffn and la.n_head > 0 for la in layout)
    if zero:
        notes.append(f"{zero} attention-only layer(s) written with n_ff=1 and a zero ffn_down "
                     "(llama.cpp's deci skips the residual add when n_ff=0)")
    if layout[-1].n_head == 0 and layout[-1].zero_ffn:
        notes.append("the empty last layer is kept as a zero FFN (the engine runs its last "
                     "layer's FFN on the output rows only)")
    if fallback and dtype not in ("f32", "f16"):
        notes.append(f"{len(fallback)} weight(s) with rows not a multiple of 32 written in f16")
    return notes


_FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}  # llama_ftype values


def read_gguf_spec(path: str | Path) -> tuple[ArchSpec, str]:
    """(ArchSpec, dtype) of a GGUF this module wrote.

    The file may come from anywhere: whatever is wrong with it (truncated,
    not a GGUF, fields of the wrong type, an invalid spec) is one usage error,
    never a KeyError or IndexError from deep inside the reader.
    """
    import gguf

    hint = "pass a file written by `autocompress export --format gguf` (re-export it)"
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001 - the reader raises anything on bad bytes
        raise AutoCompressError(f"cannot read GGUF {path}: {type(err).__name__}: {err}",
                                hint=hint) from None
    field = reader.fields.get(SPEC_KEY)
    if field is None:
        raise AutoCompressError(f"{path} has no {SPEC_KEY} metadata",
                                hint="export it with `autocompress export --format gguf`")
    try:
        spec = ArchSpec.model_validate_json(bytes(field.parts[field.data[0]]).decode())
        file_type = int(reader.fields["general.file_type"].parts[-1][0])
    except Exception as err:  # noqa: BLE001 - malformed metadata, whatever its kind
        detail = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise AutoCompressError(f"GGUF {path} has malformed metadata ({detail})",
                                hint=hint) from None
    dtype = {v: k for k, v in _FILE_TYPES.items()}.get(file_type, "unknown")
    return spec, dtype


def export_gguf(
    model_dir: str | Path, out: str | Path, dtype: str = "f32", *, overwrite: bool = False
) -> GGUFExportReport:
    """Load the model in ``model_dir`` and write it as GGUF to ``out``.

    ``out``: a ``.gguf`` file, or a directory that receives ``model.gguf``.
    """
    from autocompress.modeling import load_causal_lm
    from autocompress.modeling.loading import load_config

    out = Path(out)
    path = out if out.suffix == ".gguf" else out / GGUF_NAME
    path = check_out_file(path)  # links followed; a directory named as the file is refused
    if path.exists() and not overwrite:
        raise AutoCompressError(f"{path} exists", hint="pass another --out, or --overwrite")
    source, _ = load_config(model_dir)
    check_not_input(path, source)  # never written over (or into) the model it reads
    model, _ = load_causal_lm(source, with_tokenizer=False)
    return write_gguf(model, source, path, dtype, name=Path(source).name or "autocompress")
