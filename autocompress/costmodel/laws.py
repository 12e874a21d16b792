"""Timing and activation laws: how one block's numbers become milliseconds or bytes.

Two timing laws, both additive over blocks:

- ``RooflineLaw`` (analytic, spec-sheet): a block costs
  ``max(FLOPs / (η_c·F), weight bytes / (η_m·BW)) + KV bytes / (η_kv·BW) + τ``,
  plus an all-reduce per block under tensor parallelism. Used for GPUs that
  cannot be measured here, and as the starting point on the CPU.
- ``LinearLaw`` (fitted): a block costs ``Σ_k θ_k · feature_k`` with θ ≥ 0 fitted
  by non-negative least squares on measured probe models (``costmodel.fit``). On
  small CPU models the per-call terms (``attn.call``, ``ffn.call``) dominate:
  eager PyTorch pays a fixed cost per op.

``ActivationLaw`` gives the temporary bytes of one block (in prefill and in the
last decode step) and of the constant part; ``CostModel.peak_bytes`` combines
them with the live KV cache into the activation peak.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from autocompress.costmodel.blocks import (
    BlockShape,
    Env,
    Phase,
    activation_const_features,
    activation_features,
    decode_activation_features,
    decode_const_features,
    decode_features,
    prefill_const_features,
    prefill_features,
)
from autocompress.costmodel.target import Target


def _dot(coefficients: dict[str, float], features: dict[str, float]) -> float:
    return sum(coefficients.get(name, 0.0) * value for name, value in features.items())


class LinearLaw(BaseModel):
    """Fitted: milliseconds = Σ θ_k · feature_k, one θ vector per phase."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["linear"] = "linear"
    prefill: dict[str, float]
    decode: dict[str, float]

    def block_ms(self, phase: Phase, shape: BlockShape | None, hidden: int, env: Env) -> float:
        if phase == "prefill":
            return _dot(self.prefill, prefill_features(shape, hidden, env))
        return _dot(self.decode, decode_features(shape, hidden, env))

    def const_ms(self, phase: Phase, hidden: int, env: Env) -> float:
        if phase == "prefill":
            return _dot(self.prefill, prefill_const_features(hidden, env))
        return _dot(self.decode, decode_const_features(hidden, env))


class RooflineLaw(BaseModel):
    """Analytic: spec-sheet peaks × engine efficiencies + per-block overheads."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["roofline"] = "roofline"
    peak_flops: float
    bandwidth: float  # bytes/s
    eta_gemm: float
    eta_decode_compute: float
    eta_weight_bw: float
    eta_kv_bw: float
    eta_attention: float
    step_overhead_ms: float
    attention_overhead_us: float
    ffn_overhead_us: float
    interconnect_bytes_s: float = 0.0
    allreduce_latency_us: float = 0.0

    @classmethod
    def for_target(cls, target: Target) -> RooflineLaw:
        engine, hw = target.engine, target.hardware
        return cls(
            peak_flops=hw.peak_flops(target.compute_dtype),
            bandwidth=hw.bandwidth_bytes_s,
            eta_gemm=engine.eta_gemm,
            eta_decode_compute=engine.eta_decode_compute,
            eta_weight_bw=engine.eta_weight_bw,
            eta_kv_bw=engine.eta_kv_bw,
            eta_attention=engine.eta_attention,
            step_overhead_ms=engine.step_overhead_ms,
            attention_overhead_us=engine.attention_overhead_us,
            ffn_overhead_us=engine.ffn_overhead_us,
            interconnect_bytes_s=hw.interconnect_gb_s * 1e9,
            allreduce_latency_us=hw.allreduce_latency_us,
        )

    # ----------------------------------------------------------------- blocks
    def block_ms(self, phase: Phase, shape: BlockShape | None, hidden: int, env: Env) -> float:
        if shape is None:
            return 0.0
        weight_s = shape.gemm_params * env.bytes_weight / (self.eta_weight_bw * self.bandwidth)
        overhead_us = (
            self.attention_overhead_us if shape.kind == "attention" else self.ffn_overhead_us
        )
        if phase == "decode":
            feats = decode_features(shape, hidden, env)
            compute_s = feats[f"{_prefix(shape)}.flops"] / (
                self.eta_decode_compute * self.peak_flops
            )
            kv_s = feats.get("attn.kv_bytes", 0.0) / (self.eta_kv_bw * self.bandwidth)
            rows = env.batch
        else:
            feats = prefill_features(shape, hidden, env)
            compute_s = feats[f"{_prefix(shape)}.flops"] / (self.eta_gemm * self.peak_flops)
            # QKᵀ and AV under a causal mask: 2·B·n_q·d·S² FLOPs.
            kv_s = 2.0 * feats.get("attn.scores", 0.0) / (self.eta_attention * self.peak_flops)
            rows = env.tokens
        seconds = max(compute_s, weight_s) + kv_s + self._allreduce_s(rows, hidden, env)
        return seconds * 1e3 + overhead_us * 1e-3

    def const_ms(self, phase: Phase, hidden: int, env: Env) -> float:
        head = env.vocab * hidden / env.tp
        compute_s = 2.0 * env.batch * head / (self.eta_decode_compute * self.peak_flops)
        weight_s = head * env.bytes_weight / (self.eta_weight_bw * self.bandwidth)
        return self.step_overhead_ms + max(compute_s, weight_s) * 1e3

    def _allreduce_s(self, rows: int, hidden: int, env: Env) -> float:
        """Ring all-reduce of the block output across ``tp`` GPUs (0 when tp = 1)."""
        if env.tp == 1 or self.interconnect_bytes_s <= 0:
            return 0.0
        payload = rows * hidden * env.bytes_act
        ring = 2.0 * (env.tp - 1) / env.tp * payload / self.interconnect_bytes_s
        return self.allreduce_latency_us * 1e-6 + ring


def _prefix(shape: BlockShape) -> str:
    return "attn" if shape.kind == "attention" else "ffn"


TimingLaw = LinearLaw | RooflineLaw


class ActivationLaw(BaseModel):
    """Temporary bytes = Σ α_k · activation feature_k (α ≥ 0, dimensionless)."""

    model_config = ConfigDict(extra="forbid")
    coefficients: dict[str, float]

    @classmethod
    def default(cls) -> ActivationLaw:
        """Eager-PyTorch counts: act(gate), up and their product alive in an FFN; q/k/v
        with their rotated copies in attention; residual + normed input + output."""
        return cls(
            coefficients={
                "attn.qkv_bytes": 2.0,
                "attn.score_bytes": 0.0,  # fused SDPA kernels keep no S×S matrix
                "attn.cache_copy_bytes": 1.0,
                "ffn.width_bytes": 3.0,
                "const.one": 0.0,
                "const.hidden_bytes": 3.0,
                "const.logit_bytes": 1.0,
            }
        )

    def prefill_block_bytes(self, shape: BlockShape | None, hidden: int, env: Env) -> float:
        return _dot(self.coefficients, activation_features(shape, hidden, env))

    def decode_block_bytes(self, shape: BlockShape | None, env: Env) -> float:
        return _dot(self.coefficients, decode_activation_features(shape, env))

    def const_bytes(self, hidden: int, env: Env, phase: Phase) -> float:
        tokens = env.tokens if phase == "prefill" else env.batch
        return _dot(self.coefficients, activation_const_features(hidden, env, tokens))
