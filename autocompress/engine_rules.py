"""What each serving engine computes from a ``nemotron-nas`` export, as data.

Each :class:`Rule` is one feature a compressed model may have, with, per engine,
a verdict and the engine source it comes from:

- ``exact``: the engine reads the export as written and computes the model.
- ``stand-in``: the engine would mis-read or crash on the plain form, so the
  export writes an equivalent form it computes exactly (a zero-output attention
  or FFN block, a zero-padded FFN, a copied LM head).
- ``refused``: no exact form exists; exporting for that engine stops with one
  line naming the rule.

Engines: ``vllm`` (``nemotron_nas.py``), ``trtllm`` (TensorRT-LLM's PyTorch
``modeling_nemotron_nas.py`` and its older ``models/nemotron_nas`` converter —
the export must satisfy both), ``llama.cpp`` (``convert_hf_to_gguf.py`` with the
``deci`` architecture), ``hf`` (transformers 5 with the export's own remote code).
Sources were read at the versions named in ``SOURCES``.

``python -m autocompress.engine_rules`` prints the engine x feature
table of docs/exports-and-engines.md (a test checks the guide holds exactly that table).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from autocompress.arch import ArchSpec
from autocompress.errors import AutoCompressError

ENGINES = ("vllm", "trtllm", "llama.cpp", "hf")
Verdict = Literal["exact", "stand-in", "refused"]
FFN_MULTIPLE = 256
LLAMA3_VOCAB_SIZE = 128256

# Where the rules were read (commit or release). Rule sources cite "<key>:<line>".
SOURCES = {
    "vllm": "vllm-project/vllm@00bd149 vllm/model_executor/models/nemotron_nas.py",
    "vllm-llama": "vllm-project/vllm@e06c9ba vllm/model_executor/models/llama.py",
    "trt-torch": "NVIDIA/TensorRT-LLM@0193dbd tensorrt_llm/_torch/models/modeling_nemotron_nas.py",
    "trt-convert": "NVIDIA/TensorRT-LLM@2a9abd9 tensorrt_llm/models/nemotron_nas/convert.py",
    "trt-config": "NVIDIA/TensorRT-LLM@42a7b09 tensorrt_llm/models/nemotron_nas/config.py",
    "trt-mlp": "NVIDIA/TensorRT-LLM@01503f5 tensorrt_llm/_torch/modules/gated_mlp.py",
    "lcpp-convert": "llama.cpp in llama-cpp-python 0.3.36: conversion/deci.py "
    "(convert_hf_to_gguf.py's DeciModel)",
    "lcpp-graph": "llama.cpp in llama-cpp-python 0.3.36: src/models/deci.cpp",
    "lcpp-model": "llama.cpp in llama-cpp-python 0.3.36: src/llama-model.cpp",
    "lcpp-vocab": "llama.cpp in llama-cpp-python 0.3.36: gguf-py/gguf/vocab.py",
    "hub": "nvidia/Llama-3_1-Nemotron-51B-Instruct block_config.py",
    "ours": "autocompress/modeling/modeling_decilm.py (the export's remote code)",
}


@dataclass(frozen=True)
class Rule:
    """One feature and what each engine does with it."""

    key: str
    feature: str
    verdicts: dict[str, Verdict]
    sources: dict[str, str]
    remedy: str = ""  # what a stand-in writes, or how to avoid a refusal

    def verdict(self, engine: str) -> Verdict:
        return self.verdicts[engine]

    def line(self, engine: str) -> str:
        """The one-line message naming this rule for ``engine``."""
        source = self.sources.get(engine, "")
        return f"{engine}: {self.feature} [{self.key}]" + (f" ({source})" if source else "")


def _all(verdict: Verdict, **overrides: Verdict) -> dict[str, Verdict]:
    verdicts = dict.fromkeys(ENGINES, verdict)
    verdicts.update({k.replace("_", "."): v for k, v in overrides.items()})
    return verdicts


RULES: tuple[Rule, ...] = (
    Rule(
        "per-layer-heads",
        "query heads differ between layers",
        _all("refused"),
        {
            "vllm": "vllm:155 every layer has config.num_attention_heads query heads",
            "trtllm": "trt-torch:65, trt-convert:66",
            "llama.cpp": "lcpp-convert:64-65",
            "hf": "ours: the format has one global query-head count",
        },
        "search with head fractions [1.0] (space.export_engine does this)",
    ),
    Rule(
        "kv-groups",
        "num_heads not a multiple of num_kv_heads",
        _all("refused"),
        {
            "vllm": "vllm:155 num_attention_heads // n_heads_in_group rounds silently",
            "trtllm": "trt-torch:182-184, trt-convert:66 (same floor division)",
            "llama.cpp": "lcpp-convert:64",
            "hf": "ours: KV heads = heads / n_heads_in_group",
        },
        "keep num_heads a multiple of num_kv_heads",
    ),
    Rule(
        "qk-norm",
        "q/k RMSNorm (Qwen3)",
        _all("refused"),
        {
            "vllm": "vllm:77 DeciLMAttention is LlamaAttention (vllm-llama:123-199), no q/k norm",
            "trtllm": "trt-torch:50-76 plain Attention",
            "llama.cpp": "lcpp-graph:125-131 no q/k norm",
            "hf": "ours: the format has no qk_norm field",
        },
        "use a Llama/Mistral/Qwen2-family teacher",
    ),
    Rule(
        "first-layer-no-attention",
        "layer 0 without attention",
        _all("exact", vllm="stand-in", llama_cpp="stand-in"),
        {
            "vllm": "vllm:220 an FFN before the first attention calls "
            "post_attention_layernorm(h, residual=None): the unpack fails",
            "llama.cpp": "lcpp-model:1435-1458 head size read only if n_head(layer 0) > 0, "
            "else 0 for every layer",
            "trtllm": "trt-torch:154-172 plain residual adds",
        },
        "layer 0 gets an attention block with a zero o_proj (1 KV head): output exactly 0",
    ),
    Rule(
        "attention-without-ffn",
        "attention kept, FFN removed",
        _all("exact", llama_cpp="stand-in"),
        {"llama.cpp": "lcpp-graph:147-149 `if (n_ff == 0) continue;` drops the attention output"},
        f"the layer gets a {FFN_MULTIPLE}-wide FFN with zero weights: output exactly 0",
    ),
    Rule(
        "empty-last-layer",
        "last layer empty (no attention, no FFN)",
        _all("exact", llama_cpp="stand-in"),
        {
            "llama.cpp": "lcpp-graph:142-149 rows are selected, then the layer is skipped: "
            "decode aborts (GGML_ASSERT)"
        },
        f"the layer gets a {FFN_MULTIPLE}-wide FFN with zero weights: output exactly 0",
    ),
    Rule(
        "ffn-width",
        f"FFN width not a multiple of {FFN_MULTIPLE}",
        _all("exact", trtllm="stand-in", llama_cpp="stand-in"),
        {
            "vllm": "vllm:172-177 reads ffn.intermediate_size when the block has no ffn_mult",
            "trtllm": "trt-torch:141, trt-convert:80 read only ffn_mult: "
            "width = round_up_256(int(2*ffn_mult*hidden/3))",
            "llama.cpp": "lcpp-convert:66-79 ffn_mult only, same formula",
        },
        f"widths are zero-padded to a multiple of {FFN_MULTIPLE} and written as ffn_mult "
        "(6 decimals: the hub's FFNConfig rounds it so) plus intermediate_size",
    ),
    Rule(
        "bias",
        "non-zero q/k/v, o_proj or MLP bias",
        _all("exact", trtllm="refused"),
        {
            "vllm": "vllm:145-151 attention_bias -> o_proj, qkv_bias -> q/k/v; mlp_bias",
            "trtllm": "trt-torch:68,142 bias=False; trt-convert:248 reads only .weight tensors",
            "llama.cpp": "lcpp-graph:49,70-72 and lcpp-model:3428-3430 optional bias tensors",
        },
        "all-zero biases are dropped (exact everywhere); otherwise serve with vllm or llama.cpp",
    ),
    Rule(
        "tied-embeddings",
        "tied input/output embeddings",
        _all("exact", trtllm="stand-in"),
        {
            "trtllm": "trt-convert:225 always reads lm_head.weight",
            "vllm": "vllm DeciLMForCausalLM.load_weights skips lm_head.* when tied",
            "llama.cpp": "lcpp-graph:21-26 output falls back to token_embd",
        },
        "lm_head.weight is written as a copy of the embedding (tie_word_embeddings stays true)",
    ),
    Rule(
        "head-dim",
        "head_dim != hidden_size / num_heads",
        _all("exact", trtllm="refused", llama_cpp="refused"),
        {
            "vllm": "vllm-llama:156 head_dim from the config",
            "trtllm": "trt-config:53 head_size is never passed by from_hugging_face: hidden/heads",
            "llama.cpp": "lcpp-convert:111-112 key_length = hidden // heads but lcpp-convert:123 "
            "rope dim = head_dim: lcpp-model:1452 'invalid n_rot'",
        },
        "keep hidden = num_heads x head_dim (no hidden pruning, or prune heads with it)",
    ),
    Rule(
        "rope-scaling",
        "RoPE scaling other than llama3",
        _all("exact", trtllm="refused", llama_cpp="refused"),
        {
            "vllm": "vllm:119-124 get_rope(rope_parameters)",
            "trtllm": "not verified on the older converter path (trt-config: rotary_scaling)",
            "llama.cpp": "lcpp-convert:98-113 writes no rope-scaling keys; only llama3's "
            "rope_freqs (lcpp-convert:154-182)",
        },
        "serve with vllm or hf",
    ),
    Rule(
        "sliding-window",
        "sliding window shorter than max_position_embeddings",
        _all("refused", hf="exact"),
        {
            "vllm": "vllm-llama:183-190 a window only via config.layer_types",
            "trtllm": "trt-torch:63-76 no window passed",
            "llama.cpp": "lcpp-graph:138-140 full causal attention",
            "hf": "ours: sliding_window applied to every attention layer",
        },
        "a window >= max_position_embeddings never applies and is dropped (exact)",
    ),
    Rule(
        "mixed-window",
        "sliding window in some layers only",
        _all("refused"),
        {"hf": "ours: one sliding_window for every attention layer"},
        "the format has one window per model",
    ),
    Rule(
        "tokenizer",
        "tokenizer neither Llama-3 BPE nor SentencePiece-style BPE",
        _all("exact", llama_cpp="refused"),
        {
            "llama.cpp": "lcpp-convert:84-95 vocab 128256 -> Llama-3 BPE, else "
            "lcpp-vocab:566-578 needs byte_fallback BPE ('Cannot find Llama BPE tokenizer')",
        },
        "export --format gguf writes the tokenizer directly",
    ),
    Rule(
        "activation",
        "FFN activation other than SiLU",
        _all("refused", hf="exact"),
        {
            "vllm": "vllm-llama:110 LlamaMLP: 'Only silu is supported'",
            "trtllm": "trt-torch:138-145 GatedMLP with its default (trt-mlp:35 F.silu)",
            "llama.cpp": "lcpp-graph:165 LLM_FFN_SILU",
        },
        "serve with hf",
    ),
)
RULES_BY_KEY = {rule.key: rule for rule in RULES}


# ------------------------------------------------------------------ facts


class ModelFacts(BaseModel):
    """What the rules look at, gathered once from a model and its directory."""

    spec: ArchSpec
    hidden_act: str = "silu"
    rope_type: str = "default"
    max_position_embeddings: int = 2048
    sliding_window: int | None = None  # None: no window in any layer
    mixed_window: bool = False  # some attention layers sliding, others full
    nonzero_bias: bool = False
    tokenizer: Literal["llama3", "sentencepiece-bpe", "other", "missing"] = "missing"

    @classmethod
    def of(cls, model: Any, model_dir: str | Path | None = None) -> ModelFacts:
        from autocompress.modeling import arch_spec_of

        config = model.config
        rope = dict(getattr(config, "rope_parameters", None) or {})
        types = [t for t in (getattr(config, "layer_types", None) or []) if t != "moe"]
        window = getattr(config, "sliding_window", None)
        if types and "sliding_attention" not in types:
            window = None
        biases = [p for n, p in model.named_parameters() if n.endswith(".bias")]
        return cls(
            spec=arch_spec_of(model),
            hidden_act=config.hidden_act,
            rope_type=rope.get("rope_type", "default"),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=window,
            mixed_window=bool(window) and len(set(types)) > 1,
            nonzero_bias=any(bool(p.detach().abs().max() > 0) for p in biases),
            tokenizer=tokenizer_kind(model_dir, config.vocab_size) if model_dir else "missing",
        )

    @property
    def window_applies(self) -> bool:
        return bool(self.sliding_window) and self.sliding_window < self.max_position_embeddings


def tokenizer_kind(model_dir: str | Path, vocab_size: int) -> str:
    """How llama.cpp's DeciModel converter would read this directory's tokenizer."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return "missing"
    if vocab_size == LLAMA3_VOCAB_SIZE:
        return "llama3"
    tok = json.loads(path.read_text())
    model, decoder = tok.get("model") or {}, tok.get("decoder") or {}
    if (
        model.get("type") == "BPE"
        and model.get("byte_fallback")
        and decoder.get("type") == "Sequence"
    ):
        return "sentencepiece-bpe"
    return "other"


# --------------------------------------------------------------- detection


def _layers(indices: list[int]) -> str:
    return "layer" + ("s " if len(indices) > 1 else " ") + ", ".join(map(str, indices))


def _per_layer_heads(f: ModelFacts) -> str | None:
    heads = sorted({la.attention.num_heads for la in f.spec.layers if la.attention})
    return f"query heads {heads}" if len(heads) > 1 else None


def _kv_groups(f: ModelFacts) -> str | None:
    bad = [
        i
        for i, la in enumerate(f.spec.layers)
        if la.attention and la.attention.num_heads % la.attention.num_kv_heads
    ]
    return _layers(bad) if bad else None


def _first_layer(f: ModelFacts) -> str | None:
    return "layer 0" if f.spec.layers and f.spec.layers[0].attention is None else None


def _attention_only(f: ModelFacts) -> str | None:
    bad = [i for i, la in enumerate(f.spec.layers) if la.attention and la.ffn is None]
    return _layers(bad) if bad else None


def _empty_last(f: ModelFacts) -> str | None:
    last = f.spec.layers[-1] if f.spec.layers else None
    return f"layer {len(f.spec.layers) - 1}" if last is not None and last.is_empty else None


def _ffn_width(f: ModelFacts) -> str | None:
    bad = [
        i
        for i, la in enumerate(f.spec.layers)
        if la.ffn and la.ffn.intermediate_size % FFN_MULTIPLE
    ]
    return _layers(bad) if bad else None


def _head_dim(f: ModelFacts) -> str | None:
    heads = next((la.attention.num_heads for la in f.spec.layers if la.attention), None)
    if heads and f.spec.head_dim * heads != f.spec.hidden_size:
        return f"head_dim {f.spec.head_dim} x {heads} heads != hidden {f.spec.hidden_size}"
    return None


DETECTORS: dict[str, Callable[[ModelFacts], str | None]] = {
    "per-layer-heads": _per_layer_heads,
    "kv-groups": _kv_groups,
    "qk-norm": lambda f: "qk_norm" if f.spec.qk_norm else None,
    "first-layer-no-attention": _first_layer,
    "attention-without-ffn": _attention_only,
    "empty-last-layer": _empty_last,
    "ffn-width": _ffn_width,
    "bias": lambda f: "non-zero biases" if f.nonzero_bias else None,
    "tied-embeddings": lambda f: "tied" if f.spec.tie_word_embeddings else None,
    "head-dim": _head_dim,
    "rope-scaling": lambda f: f.rope_type if f.rope_type not in ("default", "llama3") else None,
    "sliding-window": lambda f: (
        f"window {f.sliding_window}" if f.window_applies and not f.mixed_window else None
    ),
    "mixed-window": lambda f: f"window {f.sliding_window}" if f.mixed_window else None,
    "tokenizer": lambda f: (
        f"tokenizer: {f.tokenizer}" if f.tokenizer in ("other", "missing") else None
    ),
    "activation": lambda f: f.hidden_act if f.hidden_act != "silu" else None,
}


def findings(facts: ModelFacts) -> dict[str, str]:
    """Rule key -> where it applies, for every rule this model triggers."""
    found = {key: DETECTORS[key](facts) for key in RULES_BY_KEY}
    return {key: where for key, where in found.items() if where}


# ------------------------------------------------------------------- plans


@dataclass
class EnginePlan:
    """Which engines an export serves exactly and which stand-ins it writes for them."""

    engines: list[str]
    refused: dict[str, list[str]] = field(default_factory=dict)  # engine -> rule lines
    stand_ins: dict[str, str] = field(default_factory=dict)  # rule key -> where

    def needs(self, key: str) -> bool:
        return key in self.stand_ins


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise AutoCompressError(
            f"unknown engine {engine!r}", hint=f"use one of {', '.join(ENGINES)}"
        )


def _refusal(engine: str, key: str, where: str, prefix: str = "") -> AutoCompressError:
    rule = RULES_BY_KEY[key]
    return AutoCompressError(f"{prefix}{rule.line(engine)}: {where}", hint=rule.remedy or None)


def plan_for(facts: ModelFacts, engines: list[str] | None = None) -> EnginePlan:
    """The plan for ``engines`` (None: every engine that can load the model).

    A refused rule stops an explicit engine list (AutoCompressError naming the
    rule); with ``engines=None`` the engines it concerns are left out instead.
    """
    found = findings(facts)
    wanted = list(ENGINES) if engines is None else list(engines)
    for engine in wanted:
        _check_engine(engine)
    refused: dict[str, list[tuple[str, str]]] = {}
    for engine in wanted:
        hits = [(k, w) for k, w in found.items() if RULES_BY_KEY[k].verdict(engine) == "refused"]
        if hits and engines is not None:
            raise _refusal(engine, *hits[0])
        if hits:
            refused[engine] = hits
    served = [e for e in wanted if e not in refused]
    if not served:
        engine, hits = next(iter(refused.items()))
        raise _refusal(engine, *hits[0], prefix="no engine can load this model: ")
    stand_ins = {
        k: w
        for k, w in found.items()
        if any(RULES_BY_KEY[k].verdict(e) == "stand-in" for e in served)
    }
    lines = {e: [f"{RULES_BY_KEY[k].line(e)}: {w}" for k, w in hits] for e, hits in refused.items()}
    return EnginePlan(engines=served, refused=lines, stand_ins=stand_ins)


# ------------------------------------------------------------ search space


def space_overrides(engine: str, teacher: ArchSpec) -> dict[str, Any]:
    """SpaceConfig overrides so a search offers only shapes ``engine`` computes exactly.

    Query heads stay global (every option keeps all query heads of its KV
    clusters: the format has one count); no hidden pruning where head_dim must
    be hidden / heads; FFN widths on the 256 grid where ffn_mult is read (no
    zero padding). A teacher the engine cannot serve at all is refused here.
    """
    _check_engine(engine)
    facts = ModelFacts(spec=teacher)
    for key in ("qk-norm", "head-dim", "kv-groups"):
        where = DETECTORS[key](facts)
        if where and RULES_BY_KEY[key].verdict(engine) == "refused":
            raise _refusal(engine, key, where, prefix="the teacher cannot be served by ")
    overrides: dict[str, Any] = {"head_fractions": [1.0]}
    if RULES_BY_KEY["head-dim"].verdict(engine) == "refused":
        overrides["hidden_fractions"] = [1.0]  # hidden = heads x head_dim stays true
    if RULES_BY_KEY["ffn-width"].verdict(engine) != "exact":
        overrides["ffn_granularity"] = FFN_MULTIPLE
    return overrides


def banned_no_ops(engine: str, teacher: ArchSpec) -> list[tuple[str, int]]:
    """Blocks whose no-op a search for ``engine`` must not offer: ``("attention", 0)`` etc.

    Those the engine would need a stand-in for that costs what the cost model
    does not see (a zero attention in layer 0); the tiny zero-FFN stand-ins for
    attention-only layers are left to the export.
    """
    bans: list[tuple[str, int]] = []
    if RULES_BY_KEY["first-layer-no-attention"].verdict(engine) != "exact":
        bans.append(("attention", 0))
    if RULES_BY_KEY["empty-last-layer"].verdict(engine) != "exact":
        bans.append(("ffn", teacher.num_layers - 1))
    return bans


# Cost-model target engines whose served checkpoint is a nemotron-nas export.
TARGET_ENGINES = {"vllm": "vllm", "trtllm": "trtllm", "llama.cpp": "llama.cpp",
                  "llamacpp": "llama.cpp"}


def engine_for_target(target_engine: str) -> str | None:
    """The export engine a cost-model target's engine serves (None: no export rules)."""
    return TARGET_ENGINES.get(target_engine)


# ------------------------------------------------------------------ the guide's table


_CELL = {"exact": "exact", "stand-in": "exact (stand-in)", "refused": "refused"}


def table_markdown() -> str:
    """The engine x feature table of docs/exports-and-engines.md."""
    header = "| feature | " + " | ".join(ENGINES) + " |"
    rows = [header, "|---|" + "---|" * len(ENGINES)]
    for rule in RULES:
        cells = [_CELL[rule.verdicts[e]] for e in ENGINES]
        rows.append(f"| {rule.feature} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table_markdown(), end="")
