"""The quantities a cost model reads from one block (and from the constant part).

Everything the cost model predicts is a sum over *blocks* — each layer's
attention block and FFN block, chosen independently — plus a constant part
(embeddings, final norm, LM head, per-step engine overhead), all at one global
hidden size. This module turns a block choice into plain numbers:

- weight bytes, FLOPs, KV bytes of one step (``BlockShape``);
- named *features*, the inputs of the fitted linear laws (``decode_features``,
  ``prefill_features``, ``activation_features``).

With h hidden, d head dim, n_q / n_kv heads, I FFN width, B batch, S prompt
tokens, N = B·S, c the decode context, b_w / b_kv / b_a bytes per weight / KV /
activation element:

- attention GEMM weights: P = h·d·(2·n_q + 2·n_kv); KV per token: 2·n_kv·d;
- FFN GEMM weights: P = 3·h·I;
- decode step: 2·B·P FLOPs, P·b_w weight bytes, B·c·KV·b_kv cache bytes;
- prefill: 2·N·P FLOPs, plus B·n_q·d·S² for QKᵀ and AV under a causal mask.

llama.cpp adds what its CPU kernels do (``Env.kv_cells``; see
``measure_llamacpp.AttentionWork``): attention reads a KV view padded to 256
cells, computes 64 × 64 tiles in the prefill (one by one below 64 queries per
sequence), its compute buffer holds a mask over the cells, and the last layer's
FFN runs on the output rows only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.costmodel.target import Target
from autocompress.costmodel.workload import Workload

BlockOption = AttentionSpec | FFNSpec | None
Phase = Literal["prefill", "decode"]


@dataclass(frozen=True)
class Env:
    """Everything fixed for one prediction except the block choices and hidden size."""

    spec: ArchSpec  # reference for head_dim, vocabulary, biases, qk-norm
    batch: int
    isl: int
    decode_context: float
    final_context: int
    bytes_weight: float
    bytes_kv: float
    bytes_act: float
    tp: int
    # llama.cpp only (0 / False for other engines): KV cells per sequence, whose
    # mask its compute buffer holds and whose padded view its attention reads
    # (``prefill_attention``, ``decode_view_cells``); its last layer's FFN runs on
    # the output rows only (``get_rows`` of the last tokens before it), so that
    # FFN's prefill is as cheap as a decode step.
    kv_cells: int = 0
    last_ffn_on_outputs: bool = False

    @classmethod
    def of(cls, spec: ArchSpec, workload: Workload, target: Target) -> Env:
        engine = {}
        if target.engine.name == "llama.cpp":
            from autocompress.costmodel.measure_llamacpp import context_per_sequence

            engine = {"kv_cells": context_per_sequence(workload), "last_ffn_on_outputs": True}
        return cls(
            **engine,
            spec=spec,
            batch=workload.batch,
            isl=workload.isl,
            decode_context=workload.decode_context,
            final_context=workload.final_context,
            bytes_weight=target.weight_bytes,
            bytes_kv=target.kv_bytes,
            bytes_act=target.activation_bytes,
            tp=target.tp,
        )

    @property
    def tokens(self) -> int:
        """Prefill tokens N = B·S."""
        return self.batch * self.isl

    @property
    def prefill_attention(self) -> tuple[float, ...]:
        """llama.cpp's flash-attention work in the prefill (``AttentionWork``), or zeros."""
        if not self.kv_cells:
            return (0.0, 0.0, 0.0)
        from autocompress.costmodel.measure_llamacpp import prefill_work

        return tuple(prefill_work(self.batch, self.isl, self.kv_cells))

    @property
    def decode_view_cells(self) -> float:
        """KV-view cells llama.cpp's attention reads per decode step, or 0."""
        if not self.kv_cells:
            return 0.0
        from autocompress.costmodel.measure_llamacpp import decode_view

        steps = self.final_context - self.isl  # osl − 1
        return decode_view(self.batch, self.isl, steps, self.kv_cells)

    @property
    def head_dim(self) -> int:
        return self.spec.head_dim

    @property
    def vocab(self) -> int:
        return self.spec.vocab_size


@dataclass(frozen=True)
class BlockShape:
    """Sizes of one block at one hidden size, per tensor-parallel rank."""

    kind: Literal["attention", "ffn"]
    params: float  # all weights incl. the block's RMSNorm (per rank)
    gemm_params: float  # weights inside matmuls (per rank)
    q_heads: int  # per rank
    kv_heads: int  # per rank (replicated when n_kv < tp)
    width: int  # FFN width per rank (0 for attention)
    outputs_only: bool = False  # prefill runs on the output rows only (Env.last_ffn_on_outputs)


def block_shape(option: BlockOption, hidden: int, env: Env,
                last_layer: bool = False) -> BlockShape | None:
    """The block's sizes, or None for a no-op (removed) block; ``last_layer``: the
    block belongs to the model's last layer."""
    if option is None:
        return None
    tp = env.tp
    if isinstance(option, AttentionSpec):
        params = env.spec.attention_params(LayerSpec(attention=option), hidden_size=hidden)
        q = -(-option.num_heads // tp)
        kv = -(-option.num_kv_heads // tp)
        gemm = hidden * env.head_dim * (2 * q + 2 * kv)
        # Non-GEMM parameters (norm, biases) are replicated on every rank.
        full_gemm = hidden * env.head_dim * (2 * option.num_heads + 2 * option.num_kv_heads)
        return BlockShape("attention", gemm + params - full_gemm, gemm, q, kv, 0)
    if isinstance(option, FFNSpec):
        params = env.spec.ffn_params(LayerSpec(ffn=option), hidden_size=hidden)
        width = -(-option.intermediate_size // tp)
        gemm = 3 * hidden * width
        full_gemm = 3 * hidden * option.intermediate_size
        return BlockShape("ffn", gemm + params - full_gemm, gemm, 0, 0, width,
                          outputs_only=last_layer and env.last_ffn_on_outputs)
    raise TypeError(f"not a block option: {option!r}")


def kv_elements_per_token(shape: BlockShape | None, env: Env) -> float:
    """K and V elements one token adds to this block's cache (per rank)."""
    if shape is None or shape.kind != "attention":
        return 0.0
    return 2.0 * shape.kv_heads * env.head_dim


def embedding_params(hidden: int, env: Env) -> float:
    """Embeddings + LM head (once when tied) + final norm, per rank (vocab-parallel)."""
    tied = bool(env.spec.tie_word_embeddings)
    return env.vocab * hidden * (1 if tied else 2) / env.tp + hidden


# ------------------------------------------------------------------ features
# Features are the regressors of the fitted laws: time = Σ θ_k · feature_k.
# Names are prefixed by the part they belong to so that one coefficient vector
# covers attention blocks, FFN blocks and the constant part.


def decode_features(shape: BlockShape | None, hidden: int, env: Env) -> dict[str, float]:
    """One decode step of one block (empty for a no-op block)."""
    if shape is None:
        return {}
    b = env.batch
    if shape.kind == "attention":
        return {
            "attn.call": 1.0,
            "attn.weight_bytes": shape.gemm_params * env.bytes_weight,
            "attn.flops": 2.0 * b * shape.gemm_params,
            "attn.kv_bytes": b * env.decode_context * kv_elements_per_token(shape, env)
            * env.bytes_kv,
            "attn.context": b * env.decode_context * shape.q_heads * env.head_dim,
            **_engine_attention(shape, {"view_cells": env.decode_view_cells}),
        }
    return {
        "ffn.call": 1.0,
        "ffn.weight_bytes": shape.gemm_params * env.bytes_weight,
        "ffn.flops": 2.0 * b * shape.gemm_params,
    }


def _engine_attention(shape: BlockShape, cells: dict[str, float]) -> dict[str, float]:
    """llama.cpp's flash-attention work (``Env.prefill_attention``) × this block's
    query heads; nothing for engines that do not report it."""
    return {f"attn.{name}": value * shape.q_heads for name, value in cells.items() if value}


def decode_const_features(hidden: int, env: Env) -> dict[str, float]:
    """One decode step outside the blocks: embedding lookup, final norm, LM head."""
    head = env.vocab * hidden / env.tp
    return {
        "const.call": 1.0,
        "const.head_bytes": head * env.bytes_weight,
        "const.head_flops": 2.0 * env.batch * head,
    }


def prefill_features(shape: BlockShape | None, hidden: int, env: Env) -> dict[str, float]:
    """The prefill of the whole batch through one block."""
    if shape is None:
        return {}
    n = env.tokens
    if shape.kind == "attention":
        return {
            "attn.call": 1.0,
            "attn.flops": 2.0 * n * shape.gemm_params,
            "attn.tokens": n * (shape.q_heads + 2 * shape.kv_heads) * env.head_dim,
            "attn.scores": env.batch * shape.q_heads * env.head_dim * env.isl**2,
            "attn.hidden": n * hidden,
            **_engine_attention(shape, dict(zip(("view_cells", "tile_cells", "vector_cells"),
                                                env.prefill_attention, strict=True))),
        }
    n = env.batch if shape.outputs_only else n
    return {
        "ffn.call": 1.0,
        "ffn.flops": 2.0 * n * shape.gemm_params,
        "ffn.tokens": n * shape.width,
        "ffn.hidden": n * hidden,
    }


def prefill_const_features(hidden: int, env: Env) -> dict[str, float]:
    """Prefill outside the blocks: embeddings, RoPE tables, mask, LM head on the last token."""
    return {
        "const.call": 1.0,
        "const.hidden": env.tokens * hidden,
        "const.head_flops": 2.0 * env.batch * env.vocab * hidden / env.tp,
    }


def kv_bytes(shape: BlockShape | None, env: Env, tokens_per_sequence: float) -> float:
    """KV-cache bytes of one block for the whole batch at this many tokens per sequence."""
    return env.batch * tokens_per_sequence * kv_elements_per_token(shape, env) * env.bytes_kv


def activation_features(shape: BlockShape | None, hidden: int, env: Env) -> dict[str, float]:
    """Temporary bytes while one block runs in prefill (peak-activation candidates)."""
    if shape is None:
        return {}
    n, a = env.tokens, env.bytes_act
    if shape.kind == "attention":
        return {
            "attn.qkv_bytes": n * (shape.q_heads + 2 * shape.kv_heads) * env.head_dim * a,
            "attn.score_bytes": env.batch * shape.q_heads * env.isl**2 * a,
        }
    rows = env.batch if shape.outputs_only else n
    return {"ffn.width_bytes": rows * shape.width * a}


def decode_activation_features(shape: BlockShape | None, env: Env) -> dict[str, float]:
    """Temporary bytes of one block in the last decode step (dynamic cache only).

    ``DynamicCache`` grows by ``torch.cat``: while one layer's cache is copied,
    its old and new tensors coexist.
    """
    if shape is None or shape.kind != "attention":
        return {}
    return {"attn.cache_copy_bytes": kv_bytes(shape, env, env.final_context)}


def activation_const_features(hidden: int, env: Env, tokens: int) -> dict[str, float]:
    """Bytes alive during every block: residual stream and normed copies, last logits."""
    features = {
        "const.one": 1.0,
        "const.hidden_bytes": tokens * hidden * env.bytes_act,
        "const.logit_bytes": env.batch * env.vocab * 4.0,  # last-token logits, fp32
    }
    if env.kv_cells:  # llama.cpp: the attention mask, f16, one row of KV cells per token
        features["const.mask_bytes"] = tokens * env.kv_cells * 2.0
    return features
