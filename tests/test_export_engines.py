"""Exports checked against each engine's reading rules, re-implemented from its source.

The readers below are written from the engines' code, not from
``autocompress.engine_rules`` (that is what they check):

- ``_vllm``: vLLM ``nemotron_nas.py`` — attribute access through the config class,
  ``hasattr(ffn, "ffn_mult")`` picks the width rule, ``attention_bias`` is the
  o_proj bias and ``qkv_bias`` the q/k/v one, LlamaMLP accepts only SiLU, and the
  fused add-RMSNorm residual stream (an FFN before the first attention calls the
  norm with ``residual=None``: the engine crashes).
- ``_trtllm``: TensorRT-LLM, the stricter of its two paths — blocks as dicts
  (``convert.py``), ``ffn["ffn_mult"]`` only, head size hidden/heads (the older
  ``DeciConfig`` gets no head_size), ``lm_head.weight`` always read, no bias ever
  read, SiLU whatever the config says, plain residual adds.
- ``_llamacpp``: ``convert_hf_to_gguf.py`` DeciModel (raw config.json dict,
  ``n_heads_in_group is None`` = no attention, ``ffn_mult`` only, key length
  hidden // heads, rope dim = head_dim, llama3 rope factors, the tokenizer check)
  then ``llama-model.cpp`` (head size from layer 0) and ``deci.cpp``'s graph
  (``n_ff == 0`` skips the layer, an empty last layer aborts, SiLU).
- ``hf``: the export's own reader (``load_nemotron_nas``, the same code as its
  remote ``modeling_decilm.py``; the remote path itself: test_export_remote_code.py).

Each case exports a compressed model twice: in the plain form (for ``hf`` only,
which needs no stand-in) where the engines the rule concerns fail or compute
something else, and in the default form, which every engine it lists computes
exactly.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models
from transformers import AutoConfig

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.engine_rules import ENGINES, ModelFacts, plan_for
from autocompress.errors import AutoCompressError
from autocompress.export import export_nemotron_nas, load_nemotron_nas
from autocompress.importance import random_importance
from autocompress.modeling.tiny import tiny_model
from autocompress.prune import prune

torch.set_num_threads(1)
IDS = torch.tensor([[5, 17, 99, 3, 64, 120, 7, 45, 88]])


class EngineFailure(Exception):
    """The engine would refuse or crash while loading or running the export."""


# ------------------------------------------------------------ shared math


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _inv_freq(dim, theta, scaling):
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":  # the factors convert_hf_to_gguf writes as rope_freqs
        factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        factors = []
        for freq in inv.tolist():
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return inv / torch.tensor(factors)
    return inv


def _rope(x, inv_freq):
    t = x.shape[0]
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


def _linear(x, w, prefix, name, biases):
    out = x @ w[f"{prefix}{name}.weight"].T
    return out + w[f"{prefix}{name}.bias"] if biases and f"{prefix}{name}.bias" in w else out


def _attention(x, w, p, heads, kv, head_dim, inv_freq, qkv_bias, o_bias):
    t = x.shape[0]
    q = _linear(x, w, p, "self_attn.q_proj", qkv_bias).view(t, heads, head_dim)
    k = _linear(x, w, p, "self_attn.k_proj", qkv_bias).view(t, kv, head_dim)
    v = _linear(x, w, p, "self_attn.v_proj", qkv_bias).view(t, kv, head_dim)
    q, k = _rope(q, inv_freq), _rope(k, inv_freq)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    out = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(t, heads * head_dim)
    return _linear(out, w, p, "self_attn.o_proj", o_bias)


def _mlp(x, w, p, act, bias):
    gate = _linear(x, w, p, "mlp.gate_proj", bias)
    return _linear(act(gate) * _linear(x, w, p, "mlp.up_proj", bias), w, p, "mlp.down_proj", bias)


def _ffn_width(ffn_mult, hidden):
    width = int(2 * ffn_mult * hidden / 3)
    return width if width % 256 == 0 else width + 256 - width % 256


def _check_shape(w, name, shape):
    if name not in w:
        raise EngineFailure(f"missing tensor {name}")
    if tuple(w[name].shape) != tuple(shape):
        raise EngineFailure(f"{name}: checkpoint {tuple(w[name].shape)} != engine {shape}")


# ---------------------------------------------------------------- vLLM


def _vllm(export):
    config = AutoConfig.from_pretrained(export, trust_remote_code=True)
    w = load_file(export / "model.safetensors")
    hidden, heads, eps = config.hidden_size, config.num_attention_heads, config.rms_norm_eps
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention_bias = getattr(config, "attention_bias", False) or getattr(config, "bias", False)
    o_bias, qkv_bias = attention_bias, getattr(config, "qkv_bias", attention_bias)
    rope = dict(config.rope_parameters)
    inv = _inv_freq(head_dim, rope["rope_theta"], rope)
    h, residual = w["model.embed_tokens.weight"][IDS[0]], None
    for i, block in enumerate(config.block_configs):
        p = f"model.layers.{i}."
        if not block.attention.no_op:
            kv = heads // block.attention.n_heads_in_group
            _check_shape(w, p + "self_attn.k_proj.weight", (kv * head_dim, hidden))
            if residual is None:
                residual, h = h, _rms(h, w[p + "input_layernorm.weight"], eps)
            else:
                residual = h + residual
                h = _rms(residual, w[p + "input_layernorm.weight"], eps)
            h = _attention(h, w, p, heads, kv, head_dim, inv, qkv_bias, o_bias)
        if not block.ffn.no_op:
            if config.hidden_act != "silu":
                raise EngineFailure("LlamaMLP: only silu is supported")
            if hasattr(block.ffn, "ffn_mult"):
                width = _ffn_width(block.ffn.ffn_mult, hidden)
            else:
                width = block.ffn.intermediate_size
            _check_shape(w, p + "mlp.gate_proj.weight", (width, hidden))
            if residual is None:
                raise EngineFailure("post_attention_layernorm(h, residual=None): unpack fails")
            residual = h + residual
            h = _mlp(_rms(residual, w[p + "post_attention_layernorm.weight"], eps), w, p,
                     F.silu, getattr(config, "mlp_bias", False))
    h = _rms(h + residual, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if config.tie_word_embeddings else w["lm_head.weight"]
    return h @ head.T


# -------------------------------------------------------------- TensorRT-LLM


def _trtllm(export):
    config = AutoConfig.from_pretrained(export, trust_remote_code=True)
    raw = json.loads((export / "config.json").read_text())
    w = load_file(export / "model.safetensors")
    hidden, heads, eps = config.hidden_size, config.num_attention_heads, config.rms_norm_eps
    head_size = hidden // heads  # DeciConfig.from_hugging_face passes no head_size
    if (getattr(config, "head_dim", None) or head_size) != head_size:
        raise EngineFailure("the older path's head size hidden/heads != head_dim")
    scaling = raw.get("rope_scaling")
    if scaling and scaling.get("rope_type") not in ("llama3",):
        raise EngineFailure(f"rope scaling {scaling.get('rope_type')} not verified")
    inv = _inv_freq(head_size, raw.get("rope_theta", 10000.0), scaling)
    if "lm_head.weight" not in w:
        raise EngineFailure("convert.py reads lm_head.weight")
    h = w["model.embed_tokens.weight"][IDS[0]]
    for i, block in enumerate(config.block_configs):
        if not isinstance(block, dict):
            raise EngineFailure("convert.py: block is neither a dict nor a dataclass")
        attn, ffn, p = block["attention"], block["ffn"], f"model.layers.{i}."
        if not attn["no_op"]:
            kv = heads // attn["n_heads_in_group"]
            _check_shape(w, p + "self_attn.k_proj.weight", (kv * head_size, hidden))
            x = _rms(h, w[p + "input_layernorm.weight"], eps)
            h = h + _attention(x, w, p, heads, kv, head_size, inv, False, False)
        if not ffn["no_op"]:
            if "ffn_mult" not in ffn:
                raise EngineFailure("KeyError: 'ffn_mult'")
            width = _ffn_width(ffn["ffn_mult"], hidden)
            _check_shape(w, p + "mlp.gate_proj.weight", (width, hidden))
            x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
            h = h + _mlp(x, w, p, F.silu, False)  # GatedMLP: silu, bias=False
    return _rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


# ------------------------------------------------------------------ llama.cpp


def _llamacpp_tokenizer_check(export, vocab_size):
    path = export / "tokenizer.json"
    if not path.is_file():
        raise EngineFailure("no tokenizer.json")
    if vocab_size == 128256:
        return
    tok = json.loads(path.read_text())
    model = tok["model"]
    if model["type"] != "BPE" or not model.get("byte_fallback") or (
        tok["decoder"]["type"] != "Sequence"
    ):
        raise EngineFailure("Cannot find Llama BPE tokenizer")


def _llamacpp(export):
    hp = json.loads((export / "config.json").read_text())
    w = load_file(export / "model.safetensors")
    hidden, n_heads, eps = hp["hidden_size"], hp["num_attention_heads"], hp["rms_norm_eps"]
    _llamacpp_tokenizer_check(export, hp.get("vocab_size", 128256))
    n_head, n_kv, n_ff = [], [], []
    for block in hp["block_configs"]:
        group = block["attention"]["n_heads_in_group"]
        n_kv.append(0 if group is None else n_heads // group)
        n_head.append(0 if group is None else n_heads)
        if "ffn_mult" not in block["ffn"]:
            raise EngineFailure("KeyError: 'ffn_mult'")
        mult = block["ffn"]["ffn_mult"]
        n_ff.append(0 if mult is None else _ffn_width(mult, hidden))
    key_length, rope_dim = hidden // n_heads, hp.get("head_dim") or hidden // n_heads
    if n_head[0] == 0:
        head = 0  # llama-model.cpp: head size and n_rot only when n_head(0) > 0
    elif rope_dim != key_length:
        raise EngineFailure(f"invalid n_rot: {rope_dim}, expected {key_length}")
    else:
        head = key_length
    if head == 0 and any(n_head):
        raise EngineFailure("head size 0 for every attention layer")
    scaling = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    inv = _inv_freq(head or 2, hp.get("rope_theta", 10000.0),
                    scaling if scaling.get("rope_type") == "llama3" else None)
    out = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    inp = w["model.embed_tokens.weight"][IDS[0]]
    for il in range(len(n_head)):
        p, inp_sa = f"model.layers.{il}.", inp
        cur = inp if n_head[il] == 0 else _rms(inp, w[p + "input_layernorm.weight"], eps)
        if n_head[il] > 0:
            cur = _attention(cur, w, p, n_head[il], n_kv[il], head, inv, True, True)
        if il == len(n_head) - 1 and n_head[il] == 0 and n_ff[il] == 0:
            raise EngineFailure("GGML_ASSERT(buffer): empty last layer at decode")
        if n_ff[il] == 0:
            continue  # deci.cpp: the layer's output (its attention too) is dropped
        ffn_inp = cur + inp_sa if n_head[il] > 0 else cur
        x = _rms(ffn_inp, w[p + "post_attention_layernorm.weight"], eps)
        inp = _mlp(x, w, p, F.silu, True) + ffn_inp  # LLM_FFN_SILU, optional biases
    return _rms(inp, w["model.norm.weight"], eps) @ out.T


def _hf(export):
    with torch.no_grad():
        return load_nemotron_nas(export)(IDS).logits[0]


READERS = {"vllm": _vllm, "trtllm": _trtllm, "llama.cpp": _llamacpp, "hf": _hf}


# --------------------------------------------------------------- builders


def _layer(heads, kv, width):
    attention = AttentionSpec(num_heads=heads, num_kv_heads=kv) if heads else None
    return LayerSpec(attention=attention, ffn=FFNSpec(intermediate_size=width) if width else None)


def _tokenizer(path, sentencepiece_style=True):
    """A tiny tokenizer.json: SentencePiece-style (byte fallback) or GPT-2 byte-level."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {chr(97 + i): 3 + i for i in range(26)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>",
                               byte_fallback=sentencepiece_style))
    tok.decoder = (decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
                   if sentencepiece_style else decoders.ByteLevel())
    tok.save(str(path / "tokenizer.json"))


def _student(tmp_path, layers, hidden=64, tokenizer=True, **teacher_kwargs):
    teacher = tiny_model(**{"family": "llama", "gqa_ratio": 2, "intermediate_size": 512,
                            **teacher_kwargs})
    spec = ArchSpec(hidden_size=hidden, layers=layers)
    model = prune(teacher, random_importance(teacher), spec)
    return _save(tmp_path, model, tokenizer)


def _save(tmp_path, model, tokenizer=True):
    path = tmp_path / "model"
    model.save_pretrained(path)
    if tokenizer:
        _tokenizer(path, sentencepiece_style=tokenizer != "byte-level")
    with torch.no_grad():
        expected = model(IDS).logits[0]
    return expected, path


def _outcome(engine, export, expected):
    """'exact', 'differs' (runs, other logits) or 'fails' (the engine refuses/crashes)."""
    try:
        got = READERS[engine](export)
    except EngineFailure:
        return "fails"
    return "exact" if torch.allclose(got, expected, rtol=0, atol=1e-4) else "differs"


def _check(tmp_path, expected, path, served, plain_fails):
    """The default export is exact in ``served``; the plain form breaks ``plain_fails``."""
    report = export_nemotron_nas(path, tmp_path / "default")
    assert report.engines == served
    for engine in ENGINES:
        outcome = _outcome(engine, tmp_path / "default", expected)
        assert (outcome == "exact") == (engine in served), (engine, outcome)
    export_nemotron_nas(path, tmp_path / "plain", engines=["hf"])
    for engine, how in plain_fails.items():
        assert _outcome(engine, tmp_path / "plain", expected) == how, engine
    return report


# ------------------------------------------------------------------ cases


def test_layer_zero_without_attention(tmp_path):
    # A first FFN before any attention: vLLM's fused norm gets no residual;
    # llama.cpp takes the head size from layer 0.
    expected, path = _student(tmp_path, [_layer(0, 0, 256), _layer(4, 2, 256), _layer(4, 1, 512)])
    report = _check(tmp_path, expected, path, list(ENGINES),
                    {"vllm": "fails", "llama.cpp": "fails", "trtllm": "exact"})
    assert report.stand_ins == {"first-layer-no-attention": "layer 0"}
    block = json.loads((tmp_path / "default" / "config.json").read_text())["block_configs"][0]
    assert block["attention"] == {"no_op": False, "replace_with_linear": False,
                                  "n_heads_in_group": 4}
    assert report.added_params == 64 * 16 * (4 + 1 + 1 + 4) + 64


def test_attention_kept_ffn_removed(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 256), _layer(4, 2, 0), _layer(4, 2, 256)])
    report = _check(tmp_path, expected, path, list(ENGINES), {"llama.cpp": "differs"})
    assert report.stand_ins == {"attention-without-ffn": "layer 1"}


def test_empty_last_layer(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 256), _layer(4, 2, 256), _layer(0, 0, 0)])
    report = _check(tmp_path, expected, path, list(ENGINES), {"llama.cpp": "fails"})
    assert report.stand_ins == {"empty-last-layer": "layer 2"}


def test_ffn_widths_off_the_ffn_mult_grid(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 320), _layer(4, 2, 256), _layer(4, 2, 96)])
    report = _check(tmp_path, expected, path, list(ENGINES),
                    {"trtllm": "fails", "llama.cpp": "fails", "vllm": "exact"})
    assert report.stand_ins == {"ffn-width": "layers 0, 2"}
    blocks = json.loads((tmp_path / "default" / "config.json").read_text())["block_configs"]
    assert [_ffn_width(b["ffn"]["ffn_mult"], 64) for b in blocks] == [512, 256, 256]


def test_tied_embeddings(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 256)] * 3, tied=True)
    report = _check(tmp_path, expected, path, list(ENGINES), {"trtllm": "fails"})
    assert report.stand_ins == {"tied-embeddings": "tied"}


def test_biases(tmp_path):
    teacher = tiny_model("qwen2", intermediate_size=256)  # random non-zero q/k/v biases
    expected, path = _save(tmp_path, teacher)
    _check(tmp_path, expected, path, ["vllm", "llama.cpp", "hf"], {"trtllm": "differs"})
    with pytest.raises(AutoCompressError, match=r"^trtllm: non-zero .*\[bias\]"):
        export_nemotron_nas(path, tmp_path / "trt", engines=["trtllm"])
    # All-zero biases are dropped: TensorRT-LLM then computes the model exactly.
    with torch.no_grad():
        for name, param in teacher.named_parameters():
            if name.endswith(".bias"):
                param.zero_()
    expected, path = _save(tmp_path / "zero", teacher)
    report = export_nemotron_nas(path, tmp_path / "zero" / "out", engines=["trtllm"])
    assert _outcome("trtllm", tmp_path / "zero" / "out", expected) == "exact"
    assert json.loads((tmp_path / "zero" / "out" / "config.json").read_text())["qkv_bias"] is False
    assert report.added_params < 0  # the zero biases are gone


def test_head_dim_not_hidden_over_heads(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 256)] * 3, hidden=48)
    _check(tmp_path, expected, path, ["vllm", "hf"], {"trtllm": "fails", "llama.cpp": "fails"})
    with pytest.raises(AutoCompressError) as err:
        export_nemotron_nas(path, tmp_path / "cpp", engines=["llama.cpp"])
    assert str(err.value).startswith("llama.cpp: head_dim != hidden_size / num_heads [head-dim]")
    assert "\n" not in err.value.message


LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize(
    ("rope", "served", "plain"),
    [
        (LLAMA3, list(ENGINES), {"llama.cpp": "exact", "trtllm": "exact"}),
        ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, ["vllm", "hf"],
         {"llama.cpp": "differs", "trtllm": "fails"}),
    ],
)
def test_rope_scaling(tmp_path, rope, served, plain):
    expected, path = _student(tmp_path, [_layer(4, 2, 256)] * 3, rope_parameters=rope)
    _check(tmp_path, expected, path, served, plain)


def test_sliding_window(tmp_path):
    # A window of 4 over 9 tokens applies: only the hf remote code honours it.
    teacher = tiny_model("mistral", intermediate_size=256, sliding_window=4)
    expected, path = _save(tmp_path, teacher)
    _check(tmp_path, expected, path, ["hf"], {"vllm": "differs", "llama.cpp": "differs"})
    # A window as long as the context never applies: dropped, exact everywhere.
    teacher = tiny_model("mistral", intermediate_size=256, sliding_window=256)
    expected, path = _save(tmp_path / "inert", teacher)
    report = export_nemotron_nas(path, tmp_path / "inert" / "out")
    assert report.engines == list(ENGINES)
    assert json.loads((tmp_path / "inert" / "out" / "config.json").read_text())[
        "sliding_window"] is None


def test_tokenizers_llama_cpp_reads(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 256)] * 3, tokenizer="byte-level")
    report = _check(tmp_path, expected, path, ["vllm", "trtllm", "hf"], {"llama.cpp": "fails"})
    assert "[tokenizer]" in report.refused["llama.cpp"][0]


def test_activation_other_than_silu(tmp_path):
    expected, path = _student(tmp_path, [_layer(4, 2, 256)] * 3, hidden_act="gelu")
    _check(tmp_path, expected, path, ["hf"],
           {"vllm": "fails", "trtllm": "differs", "llama.cpp": "differs"})


def test_heads_not_a_multiple_of_kv_heads_is_refused_not_rounded():
    spec = ArchSpec(hidden_size=96, head_dim=16, vocab_size=128, layers=[_layer(6, 4, 256)] * 2)
    # What every engine would build: 6 // (6 // 4) = 6 KV heads, not 4.
    assert 6 // (6 // 4) != 4
    with pytest.raises(AutoCompressError, match=r"num_heads not a multiple .*\[kv-groups\]"):
        plan_for(ModelFacts(spec=spec, tokenizer="sentencepiece-bpe"))


def test_mixed_windows_are_refused_everywhere():
    spec = ArchSpec(hidden_size=64, head_dim=16, vocab_size=128, layers=[_layer(4, 2, 256)] * 2)
    facts = ModelFacts(spec=spec, sliding_window=4, mixed_window=True, tokenizer="missing")
    with pytest.raises(AutoCompressError, match=r"some layers only \[mixed-window\]"):
        plan_for(facts)


# ------------------------------------------------------------ search and README


@pytest.mark.parametrize("engine", ENGINES)
def test_search_space_told_an_engine_proposes_only_what_it_runs(engine):
    from autocompress.arch_search.space import Choice, SearchSpace, SpaceConfig
    from autocompress.importance import random_importance as importance_of
    from autocompress.modeling import arch_spec_of

    teacher = tiny_model("llama", gqa_ratio=2, num_heads=8, head_dim=8, num_layers=4,
                         intermediate_size=768)
    spec = arch_spec_of(teacher)
    config = SpaceConfig(granularity=8, protect_first_last=False, export_engine=engine)
    space = SearchSpace.build(spec, importance_of(teacher), config)
    assert {o.num_heads for o in space.attention_options if o} == {8}  # global query heads
    assert len(space.attention_options) > 2 and len(space.ffn_options) > 2  # still a search
    rng = torch.Generator().manual_seed(0)
    facts = dict(tokenizer="sentencepiece-bpe")
    for _ in range(300):
        pick = [int(torch.randint(n, (1,), generator=rng)) for n in
                (len(space.hidden_options), *[len(space.attention_options)] * 4,
                 *[len(space.ffn_options)] * 4)]
        choice = Choice(pick[0], tuple(pick[1:5]), tuple(pick[5:]))
        if not space.is_legal(choice):
            continue
        plan = plan_for(ModelFacts(spec=space.spec_of(choice), **facts), [engine])
        # No zero-attention stand-in: that would cost what the search did not count.
        assert "first-layer-no-attention" not in plan.stand_ins
    # Without rules the same space offers what some engines refuse (per-layer heads).
    free = SearchSpace.build(spec, importance_of(teacher), SpaceConfig(granularity=8))
    assert len({o.num_heads for o in free.attention_options if o}) > 1


def test_a_vllm_targets_search_obeys_vllms_rules_unless_told_otherwise():
    from autocompress.arch_search.config import SearchConfig
    from autocompress.arch_search.context import obeying_the_engine
    from autocompress.costmodel import CostModel, Target

    def engine_of(target, config=None):
        model = CostModel.analytic(Target.parse(target))
        return obeying_the_engine(config or SearchConfig(), model).space.export_engine

    assert engine_of("cpu-local/vllm/bf16") == engine_of("h100-sxm/vllm/bf16") == "vllm"
    assert engine_of("cpu-local/hf-eager/fp32") is None
    told = SearchConfig.model_validate({"space": {"export_engine": "hf"}})
    assert engine_of("cpu-local/vllm/fp32", told) == "hf"


def test_readme_table_is_the_generated_one():
    from pathlib import Path

    from autocompress.engine_rules import table_markdown
    from bench.report import between_markers

    guide = Path(__file__).parent.parent / "docs" / "exports-and-engines.md"
    table = between_markers(guide.read_text(), "engine-rules")
    assert table is not None, f"{guide.name} lacks the engine-rules table"
    assert table == table_markdown(), "regenerate: python -m autocompress.engine_rules"
