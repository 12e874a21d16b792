"""The cost model: latency, throughput and memory of an ArchSpec on a target.

``CostModel`` = a target + a timing law (analytic roofline or fitted linear) +
an activation law. Every latency is a sum over blocks plus a constant part
(see ``blocks`` and ``laws``); memory is additive weights plus an activation
*peak*, the largest of per-block candidates (``peak_bytes``). The same
per-block functions feed ``predict`` (one architecture) and ``additive_costs``
(tables over choices, for the search), so the two agree.

Memory, per device (per tensor-parallel rank), in decimal GB:

- hf-eager: weights + the peak of KV cache and activations + engine overhead.
  The cache grows during the forward pass, so a block's peak candidate holds
  the cache of the layers before it (prefill) or the whole final cache of
  ``batch × (isl + osl − 1)`` tokens plus one layer's copy (last decode step).
  It fits when the total is at most ``memory_utilization_hf × device memory``.
- vllm: the KV pool is ``gpu_memory_utilization × memory − weights − activation
  peak of a max_num_batched_tokens forward − overhead``, in pages of
  ``block_size`` tokens; ``memory_gb`` reports what the workload needs (weights
  + pages of its sequences + activations + overhead), not the whole reservation.
- trtllm: the pool is ``fraction × (memory − weights − activations − overhead)``.
- llama.cpp: weights + the KV cache of ``batch`` sequences × ``isl + osl`` cells
  (rounded up to 256 per sequence) + the compute buffer, which the engine sizes
  for one micro-batch of ``min(batch × isl, 512)`` tokens: the largest block's
  temporaries at that many tokens (fitted to the buffer sizes the engine reports).

A cost model is saved as JSON with a content hash (``save``/``load``); its
``version`` string names the target and the first 12 hex digits of the hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from autocompress import paths
from autocompress.arch import ArchSpec
from autocompress.atomic import write_json_atomic
from autocompress.costmodel.blocks import (
    BlockShape,
    Env,
    Phase,
    block_shape,
    embedding_params,
    kv_bytes,
)
from autocompress.costmodel.laws import ActivationLaw, LinearLaw, RooflineLaw
from autocompress.costmodel.target import Target
from autocompress.costmodel.workload import Workload
from autocompress.errors import AutoCompressError

FORMAT_VERSION = 1
GB = 1e9
GIB = 2**30
PAGED_ENGINES = ("vllm", "trtllm")
# Engines that allocate the whole KV cache up front (no cache growing inside a forward).
STATIC_CACHE_ENGINES = (*PAGED_ENGINES, "llama.cpp")
BLOCK_MEMORY_KEYS = ("weights", "kv_prefill", "kv_final", "prefill_act", "decode_act")


# ------------------------------------------------------------------ results


class MemoryBreakdown(BaseModel):
    """Peak memory per device, in bytes, and what the engine can hold."""

    weights: float
    kv_cache: float
    activations: float
    overhead: float
    capacity: float = Field(description="Bytes the engine may use on the device.")
    kv_pool: float | None = Field(default=None, description="Paged engines: bytes for KV pages.")

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.overhead


class CostPrediction(BaseModel):
    """What ``CostModel.predict`` returns (times in ms, memory in GB = 1e9 bytes)."""

    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    throughput_tok_s: float
    memory_gb: float
    max_concurrency: int = Field(description="Most sequences of this shape that fit at once.")
    fits: bool
    max_context_tokens: int = Field(
        description="Largest isl + osl that fits at this batch (osl fixed)."
    )
    reason: str | None = Field(default=None, description="Why it does not fit.")
    memory: MemoryBreakdown
    target: str
    tp: int
    workload: Workload
    cost_model: str = Field(description="Version of the cost model that predicted this.")

    def metrics(self) -> dict[str, Any]:
        """The headline numbers (the JSON of ``costmodel predict``)."""
        keys = ("ttft_ms", "tpot_ms", "e2e_ms", "throughput_tok_s", "memory_gb",
                "max_concurrency", "fits")
        return {key: getattr(self, key) for key in keys}


class FitReport(BaseModel):
    """How a fitted model was obtained and how well it matches its own probes."""

    created: str
    seconds: float
    threads: int
    statistic: str = Field(default="median", description="Timing statistic fitted to.")
    timing: str = Field(default="absolute", description="absolute, or paired: each run "
                        "timed in lockstep with reference_spec (costmodel.measure).")
    reference_spec: dict[str, Any] | None = Field(
        default=None, description="The paired-timing reference (random weights).")
    reference_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Per workload: the reference's uncontended "
        "(10th-percentile) ttft_ms and tpot_ms over the fit, which verify scales paired "
        "ratios by, and the workload's batch, isl and osl.")
    n_probes: int
    n_rows: int
    workloads: list[str]
    train_mape: dict[str, float]
    median_spread: dict[str, float] = Field(description="Median relative IQR of the probes.")

    def reference_scale(self, workload: Workload) -> dict[str, float] | None:
        """The fitted reference times for a workload of ``workload``'s shape, if any."""
        for entry in self.reference_ms.values():
            if (entry.get("batch"), entry.get("isl"), entry.get("osl")) == (
                    workload.batch, workload.isl, workload.osl):
                return {"ttft_ms": entry["ttft_ms"], "tpot_ms": entry["tpot_ms"]}
        return None


_PAIRED_FIT_FIELDS = ("timing", "reference_spec", "reference_ms")

Timing = Annotated[LinearLaw | RooflineLaw, Field(discriminator="kind")]


# -------------------------------------------------------------------- model


class CostModel(BaseModel):
    """Predicts TTFT, TPOT, end-to-end latency, throughput and memory on one target."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    target: Target
    timing: Timing
    activation: ActivationLaw
    fit: FitReport | None = None

    # ------------------------------------------------------------ builders
    @classmethod
    def analytic(cls, target: Target) -> CostModel:
        """Spec-sheet roofline + engine defaults (no measurement)."""
        activation = ActivationLaw.default()
        if target.engine.name in PAGED_ENGINES:
            # Paged engines: no cache copies, fused attention, no S×S matrix.
            coefficients = dict(activation.coefficients, **{"attn.cache_copy_bytes": 0.0})
            activation = ActivationLaw(coefficients=coefficients)
        return cls(target=target, timing=RooflineLaw.for_target(target), activation=activation)

    @classmethod
    def for_target(cls, target: Target, path: Path | None = None) -> CostModel:
        """The fitted model of ``target`` if one was saved, else the analytic one."""
        path = path or default_path(target)
        if path.exists():
            model = cls.load(path)
            return model.model_copy(update={"target": model.target.model_copy(
                update={"tp": target.tp})})
        return cls.analytic(target)

    @property
    def source(self) -> str:
        return "fitted" if isinstance(self.timing, LinearLaw) else "analytic"

    # ---------------------------------------------------------------- I/O
    def content_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        fit = data.get("fit")
        if fit and fit.get("timing") == "absolute":
            # Fields added with paired timing; left out at their defaults so that
            # models saved before it keep their content hash.
            for key in _PAIRED_FIT_FIELDS:
                fit.pop(key, None)
        return data

    @property
    def sha256(self) -> str:
        text = json.dumps(self.content_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def version(self) -> str:
        return f"{self.target.name}:{self.source}:{self.sha256[:12]}"

    def save(self, path: str | Path) -> str:
        """Write ``{"sha256", "version", "model"}`` atomically; returns the hash."""
        payload = {"sha256": self.sha256, "version": self.version, "model": self.content_dict()}
        write_json_atomic(path, payload, sort_keys=True)
        return self.sha256

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a saved model and check its content hash."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text())
            if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
                raise ValueError("it is not a JSON object with a 'model' object "
                                 "(the schema of `costmodel fit`)")
            model = cls.model_validate(payload["model"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise AutoCompressError(
                f"cannot read cost model {path}: {str(err).splitlines()[0]}",
                hint="re-create it with `autocompress costmodel fit`",
            ) from None
        if payload.get("sha256") != model.sha256:
            raise AutoCompressError(
                f"cost model {path} does not match its sha256 (edited or corrupted)",
                hint="re-create it with `autocompress costmodel fit`",
            )
        return model

    # ------------------------------------------------------- block costs
    def env(self, spec: ArchSpec, workload: Workload) -> Env:
        _require_complete(spec)
        return Env.of(spec, workload, self.target)

    def block_ms(self, phase: Phase, shape: BlockShape | None, hidden: int, env: Env) -> float:
        return self.timing.block_ms(phase, shape, hidden, env)

    def const_ms(self, phase: Phase, hidden: int, env: Env) -> float:
        return self.timing.const_ms(phase, hidden, env)

    def _activation_env(self, env: Env) -> Env:
        """Paged engines size activations by their profiling forward, not the workload;
        llama.cpp by one micro-batch."""
        engine = self.target.engine
        if engine.name == "llama.cpp":
            from autocompress.costmodel.measure_llamacpp import ENGINE_UBATCH

            return dataclasses.replace(env, batch=1, isl=min(env.tokens, ENGINE_UBATCH))
        if engine.name not in PAGED_ENGINES or not engine.max_num_batched_tokens:
            return env
        seqs = engine.max_num_seqs or 1
        tokens = engine.max_num_batched_tokens
        return dataclasses.replace(env, batch=seqs, isl=max(1, tokens // seqs))

    @property
    def dynamic_cache(self) -> bool:
        """hf-eager grows a DynamicCache inside the forward pass, so the cache of the
        layers already run is alive at every block's activation peak. Paged engines
        allocate the KV pool up front, apart from activations."""
        return self.target.engine.name not in STATIC_CACHE_ENGINES

    def block_memory(self, shape: BlockShape | None, hidden: int, env: Env) -> dict[str, float]:
        """Bytes of one block (all 0 for a removed block).

        ``weights``; ``kv_prefill`` (cache after the prompt) and ``kv_final`` (cache
        held at the end; whole pages on paged engines); ``prefill_act`` and
        ``decode_act``: its temporaries while it runs (peak candidates).
        """
        if shape is None:
            return dict.fromkeys(BLOCK_MEMORY_KEYS, 0.0)
        act_env = self._activation_env(env)
        return {
            "weights": shape.params * env.bytes_weight,
            "kv_prefill": kv_bytes(shape, env, env.isl),
            "kv_final": kv_bytes(shape, env, self._kv_tokens_per_sequence(env)),
            "prefill_act": self.activation.prefill_block_bytes(shape, hidden, act_env),
            "decode_act": self.activation.decode_block_bytes(shape, env)
            if self.dynamic_cache else 0.0,
        }

    def const_memory(self, hidden: int, env: Env) -> dict[str, float]:
        """Bytes outside the blocks: embeddings/LM head, engine overhead, and the
        activations alive during every block in prefill / decode."""
        act_env = self._activation_env(env)
        return {
            "weights": embedding_params(hidden, env) * env.bytes_weight,
            "overhead": self.target.engine.overhead_gib * GIB,
            "prefill_act": self.activation.const_bytes(hidden, act_env, "prefill"),
            "decode_act": self.activation.const_bytes(hidden, env, "decode"),
        }

    def _kv_tokens_per_sequence(self, env: Env) -> float:
        """Cache slots a sequence holds: whole pages on paged engines."""
        block = self.target.engine.block_size
        if self.target.engine.name == "llama.cpp":
            from autocompress.costmodel.measure_llamacpp import CONTEXT_ROUNDING

            cells = env.final_context + 1  # isl + osl
            return float(math.ceil(cells / CONTEXT_ROUNDING) * CONTEXT_ROUNDING)
        if self.target.engine.name in PAGED_ENGINES and block:
            return math.ceil(env.final_context / block) * block
        return float(env.final_context)

    def peak_bytes(self, layers: list[tuple[dict, dict]], const: dict[str, float]) -> float:
        """The activation peak (including the live cache under a dynamic cache).

        ``layers``: ``(attention, ffn)`` block memories per layer. Dynamic cache:
        the largest of, for each attention block, ``prefill const + cache of the
        layers so far (itself included) + its temporaries`` and ``decode const +
        the final cache + its copy``, and for each FFN block ``prefill const +
        cache so far + its temporaries``. Paged engines: ``prefill const + the
        largest block temporary`` of the profiling run.
        """
        best = 0.0
        if not self.dynamic_cache:
            for attention, ffn in layers:
                for block in (attention, ffn):
                    if block["weights"]:
                        best = max(best, const["prefill_act"] + block["prefill_act"])
            return best
        final = sum(attention["kv_final"] for attention, _ in layers)
        prefix = 0.0
        for attention, ffn in layers:
            if attention["weights"]:
                prefix += attention["kv_prefill"]
                best = max(best, const["prefill_act"] + prefix + attention["prefill_act"],
                           const["decode_act"] + final + attention["decode_act"])
            if ffn["weights"]:
                best = max(best, const["prefill_act"] + prefix + ffn["prefill_act"])
        return best

    # -------------------------------------------------- named predictions
    def _blocks(self, spec: ArchSpec, env: Env) -> list[BlockShape | None]:
        shapes = []
        last = len(spec.layers) - 1
        for index, layer in enumerate(spec.layers):
            shapes.append(block_shape(layer.attention, spec.hidden_size, env))
            shapes.append(block_shape(layer.ffn, spec.hidden_size, env, index == last))
        return shapes

    def _latency(self, phase: Phase, spec: ArchSpec, workload: Workload) -> float:
        env = self.env(spec, workload)
        h = spec.hidden_size
        return self.const_ms(phase, h, env) + sum(
            self.block_ms(phase, shape, h, env) for shape in self._blocks(spec, env)
        )

    def prefill_latency(self, spec: ArchSpec, workload: Workload) -> float:
        """TTFT in ms: prefill of ``batch × isl`` tokens."""
        return self._latency("prefill", spec, workload)

    def decode_latency(self, spec: ArchSpec, workload: Workload) -> float:
        """TPOT in ms: one decode step of the whole batch at the average context."""
        return self._latency("decode", spec, workload)

    def memory_bytes(self, spec: ArchSpec, workload: Workload) -> MemoryBreakdown:
        """Peak memory per device (see the module docstring for each engine)."""
        env = self.env(spec, workload)
        h = spec.hidden_size
        const = self.const_memory(h, env)
        last = len(spec.layers) - 1
        layers = [
            (self.block_memory(block_shape(layer.attention, h, env), h, env),
             self.block_memory(block_shape(layer.ffn, h, env, index == last), h, env))
            for index, layer in enumerate(spec.layers)
        ]
        weights = const["weights"] + sum(a["weights"] + f["weights"] for a, f in layers)
        kv = sum(a["kv_final"] for a, _ in layers)
        peak = self.peak_bytes(layers, const)
        # Under a dynamic cache the peak already holds the cache.
        activations = peak - kv if self.dynamic_cache else peak
        capacity, pool = self._capacity(weights, activations, const["overhead"])
        return MemoryBreakdown(
            weights=weights,
            kv_cache=kv,
            activations=activations,
            overhead=const["overhead"],
            capacity=capacity,
            kv_pool=pool,
        )

    def _capacity(self, weights: float, activations: float, overhead: float):
        engine, device = self.target.engine, self.target.hardware.memory_bytes
        if engine.name == "vllm":
            usable = engine.gpu_memory_utilization * device
            return usable, max(0.0, usable - weights - activations - overhead)
        if engine.name == "trtllm":
            free = max(0.0, device - weights - activations - overhead)
            pool = engine.gpu_memory_utilization * free
            return weights + activations + overhead + pool, pool
        return engine.memory_utilization_hf * device, None

    def _fits(self, spec: ArchSpec, workload: Workload) -> tuple[bool, str | None]:
        memory = self.memory_bytes(spec, workload)
        engine = self.target.engine
        if engine.max_num_seqs and workload.batch > engine.max_num_seqs:
            return False, f"batch {workload.batch} exceeds max_num_seqs {engine.max_num_seqs}"
        if memory.kv_pool is not None and memory.kv_cache > memory.kv_pool:
            return False, (
                f"KV cache needs {memory.kv_cache / GB:.2f} GB but the pool holds "
                f"{memory.kv_pool / GB:.2f} GB"
            )
        if memory.total > memory.capacity:
            return False, (
                f"needs {memory.total / GB:.2f} GB but {memory.capacity / GB:.2f} GB are usable"
            )
        return True, None

    def max_concurrency(self, spec: ArchSpec, workload: Workload) -> int:
        """Most concurrent sequences of this workload's shape that fit (0 if none)."""
        cap = self.target.engine.max_num_seqs or 2**24
        return _largest(lambda b: self._fits(spec, workload.with_overrides(batch=b))[0], 1, cap)

    def max_context(self, spec: ArchSpec, workload: Workload) -> int:
        """Largest isl + osl that fits at this batch, keeping osl (0 if none)."""
        isl = _largest(
            lambda n: self._fits(spec, workload.with_overrides(isl=n))[0], 1, 2**24
        )
        return isl + workload.osl if isl else 0

    def predict(self, spec: ArchSpec, workload: Workload) -> CostPrediction:
        """Every metric of ``spec`` serving ``workload`` on this target.

        An illegal shape (no layers, heads not in whole GQA groups) is refused
        rather than given a number. (Whether ``tp`` GPUs can share the heads is
        checked where a user's model comes in: the search space does not yet
        follow that rule, see ``ArchSpec.legality_errors(tp=...)``.)
        """
        spec.validate_legality()
        ttft = self.prefill_latency(spec, workload)
        tpot = self.decode_latency(spec, workload)
        memory = self.memory_bytes(spec, workload)
        fits, reason = self._fits(spec, workload)
        return CostPrediction(
            ttft_ms=ttft,
            tpot_ms=tpot,
            e2e_ms=ttft + workload.decode_steps * tpot,
            throughput_tok_s=1000.0 * workload.batch / tpot if tpot > 0 else math.inf,
            memory_gb=memory.total / GB,
            max_concurrency=self.max_concurrency(spec, workload),
            fits=fits,
            max_context_tokens=self.max_context(spec, workload),
            reason=reason,
            memory=memory,
            target=self.target.name,
            tp=self.target.tp,
            workload=workload,
            cost_model=self.version,
        )

    def additive_costs(
        self,
        reference: ArchSpec,
        workload: Workload,
        hidden_options: list[int],
        attention_options: list,
        ffn_options: list,
    ):
        """Per-choice cost tables for the search; see ``costmodel.additive``."""
        from autocompress.costmodel.additive import build_additive_costs

        return build_additive_costs(
            self, reference, workload, hidden_options, attention_options, ffn_options
        )


# ------------------------------------------------------------------ helpers


def _require_complete(spec: ArchSpec) -> None:
    missing = [name for name in ("head_dim", "vocab_size") if getattr(spec, name) is None]
    if missing:
        raise AutoCompressError(
            f"the architecture spec does not set {', '.join(missing)}",
            hint="complete it from the teacher (ArchSpec.complete_from) or add the fields",
        )


def _largest(ok, low: int, high: int) -> int:
    """Largest n in [low, high] with ok(n), assuming ok is monotone decreasing; 0 if none."""
    if not ok(low):
        return 0
    if ok(high):
        return high
    while high - low > 1:
        mid = (low + high) // 2
        if ok(mid):
            low = mid
        else:
            high = mid
    return low


def default_path(target: Target) -> Path:
    """Where ``costmodel fit`` saves the fitted model of ``target``."""
    name = target.name if target.threads == 1 else f"{target.name}-{target.threads}t"
    slug = re.sub(r"[^a-z0-9.-]+", "_", name.lower())
    return paths.home() / "costmodels" / f"{slug}.json"


def unfitted_note(target: Target) -> str:
    """One line for figures of the analytic model, so that nobody reads them as a fitted
    model's: on a target this machine can time, that nothing is fitted and how to fit."""
    if not target.measurable:
        return (f"{target.name} is priced by the analytic cost model (spec sheet and engine "
                "defaults): this machine cannot time it, so nothing is fitted for it")
    threads = f" --config threads={target.threads}" if target.threads > 1 else ""
    return (f"nothing is fitted for {target.name} on this machine: these figures are the "
            "analytic cost model's (spec sheet and engine defaults; expect errors of 2x or "
            f"more on a CPU); `autocompress costmodel fit --target {target.name}{threads}` "
            "fits one")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
