"""Hardware: what a target machine can do.

Two sources of truth:

- the **spec registry** (``hardware_specs.json``, data not code): spec-sheet
  memory, bandwidth and dense FLOP/s of the GPUs AutoCompress targets
  analytically (RTX 5070/5080, H100 SXM, H200, B200);
- the **profile** of the machine we run on (``profile_hardware``): NVIDIA GPUs
  through NVML (nvidia-ml-py), and the CPU with *measured* GEMM FLOP/s and memory
  bandwidth. The CPU becomes the hardware ``cpu-local``; its profile is cached as
  JSON under ``AUTOCOMPRESS_HOME/hardware/profile.json``.

``resolve_hardware(name)`` turns either kind of name into a ``HardwareSpec``,
the one type the cost models read.

Measurements on a shared machine are noisy, so every microbenchmark is repeated
and summarised by ``RobustStat`` (median and inter-quartile range); the cost
model's measuring harness (``costmodel.measure``) uses the same statistic.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from autocompress import paths
from autocompress.atomic import write_text_atomic
from autocompress.errors import AutoCompressError

if TYPE_CHECKING:
    import torch

PROFILE_VERSION = 1
LOCAL_CPU = "cpu-local"
GIB = 2**30


# ------------------------------------------------------------------ statistics


class RobustStat(BaseModel):
    """Median and quartiles of repeated measurements (robust to a few outliers)."""

    median: float
    q1: float
    q3: float
    p10: float | None = Field(
        default=None, description="10th percentile (a floor robust to interference)."
    )
    minimum: float | None = None
    n: int
    unit: str = ""

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def spread(self) -> float:
        """Relative spread: IQR / median (0 when the median is 0)."""
        return self.iqr / self.median if self.median else 0.0

    def scaled(self, factor: float, unit: str | None = None) -> RobustStat:
        """The same statistics of the samples multiplied by ``factor`` (> 0)."""
        def times(value: float | None) -> float | None:
            return None if value is None else value * factor

        return self.model_copy(update={
            "median": self.median * factor, "q1": self.q1 * factor, "q3": self.q3 * factor,
            "p10": times(self.p10), "minimum": times(self.minimum),
            "unit": self.unit if unit is None else unit,
        })

    @classmethod
    def of(cls, samples: Sequence[float], unit: str = "") -> RobustStat:
        """Summarise ``samples`` (at least one)."""
        if not samples:
            raise ValueError("RobustStat needs at least one sample")
        values = sorted(float(s) for s in samples)
        if len(values) == 1:
            q1 = q3 = p10 = values[0]
        else:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
            p10 = statistics.quantiles(values, n=10, method="inclusive")[0]
        return cls(median=statistics.median(values), q1=q1, q3=q3, p10=p10,
                   minimum=values[0], n=len(values), unit=unit)


# --------------------------------------------------------------- spec registry


class HardwareSpec(BaseModel):
    """Peak figures of one device, as the cost models read them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Registry key, e.g. 'h100-sxm' or 'cpu-local'.")
    display_name: str
    kind: Literal["gpu", "cpu"]
    memory_gib: float = Field(gt=0, description="Device memory (RAM for a CPU), GiB.")
    bandwidth_gb_s: float = Field(gt=0, description="Memory bandwidth, GB/s (1e9 B/s).")
    flops_tflops: dict[str, float] = Field(description="Dense FLOP/s per dtype, in TFLOP/s.")
    interconnect_gb_s: float = Field(default=0.0, description="GPU-GPU bandwidth, one way.")
    allreduce_latency_us: float = Field(default=0.0, description="Fixed cost of an all-reduce.")
    source: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gb_s * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s for ``dtype`` (fp32/fp16/bf16/fp8)."""
        if dtype not in self.flops_tflops:
            known = ", ".join(sorted(self.flops_tflops))
            raise AutoCompressError(
                f"no {dtype} FLOP/s figure for hardware {self.name}",
                hint=f"use one of the dtypes it has figures for: {known}",
            )
        return self.flops_tflops[dtype] * 1e12


def load_registry() -> dict[str, HardwareSpec]:
    """The GPUs of ``hardware_specs.json`` keyed by name (``cpu-local`` excluded)."""
    text = resources.files("autocompress").joinpath("hardware_specs.json").read_text()
    raw = json.loads(text)
    return {
        name: HardwareSpec(name=name, **entry)
        for name, entry in raw.items()
        if not name.startswith("_")
    }


def known_hardware() -> list[str]:
    """Every hardware name a target may use."""
    return [LOCAL_CPU, *load_registry()]


def resolve_hardware(name: str, profile: HardwareProfile | None = None) -> HardwareSpec:
    """The spec of ``name``: a registry GPU, or ``cpu-local`` from the (cached) profile."""
    if name == LOCAL_CPU:
        return (profile or load_profile()).cpu_spec()
    registry = load_registry()
    if name not in registry:
        raise AutoCompressError(
            f"unknown hardware {name!r}",
            hint=f"known hardware: {', '.join(known_hardware())}",
        )
    return registry[name]


# ---------------------------------------------------------------- the profile


class GPUInfo(BaseModel):
    """One NVIDIA GPU as NVML reports it (fields NVML cannot read stay None)."""

    index: int
    name: str
    memory_total_gib: float
    sm_clock_max_mhz: int | None = None
    memory_clock_max_mhz: int | None = None
    power_limit_w: float | None = None
    registry_name: str | None = Field(
        default=None, description="The matching entry of the spec registry, if any."
    )


class CPUInfo(BaseModel):
    model: str
    logical_cores: int
    usable_cores: int = Field(description="Cores this process may run on (affinity).")
    memory_gib: float
    torch_threads: int = Field(description="torch intra-op threads during the benchmarks.")


class CPUBenchmarks(BaseModel):
    """Microbenchmarks of the CPU with torch (the engine hf-eager uses)."""

    gemm_fp32_flops: RobustStat
    gemm_bf16_flops: RobustStat
    copy_bandwidth_bytes_s: RobustStat = Field(
        description="Large tensor copy: (read + write bytes) / time."
    )
    seconds: float = Field(description="Wall time of all benchmarks.")


class HardwareProfile(BaseModel):
    """What ``autocompress hardware profile`` writes."""

    version: int = PROFILE_VERSION
    created: str
    hostname: str
    torch_version: str
    cpu: CPUInfo
    benchmarks: CPUBenchmarks | None = None
    gpus: list[GPUInfo] = []
    driver_version: str | None = None
    nvml_error: str | None = Field(
        default=None, description="Why no GPU was detected (no driver, no library...)."
    )

    def cpu_spec(self) -> HardwareSpec:
        """The local CPU as a ``HardwareSpec`` named ``cpu-local`` (needs benchmarks)."""
        bench = self.benchmarks
        if bench is None:
            raise AutoCompressError(
                "the hardware profile has no CPU benchmarks",
                hint="run `autocompress hardware profile` (without --no-bench)",
            )
        return HardwareSpec(
            name=LOCAL_CPU,
            display_name=f"{self.cpu.model} ({self.cpu.torch_threads} torch threads)",
            kind="cpu",
            memory_gib=self.cpu.memory_gib,
            bandwidth_gb_s=bench.copy_bandwidth_bytes_s.median / 1e9,
            flops_tflops={
                "fp32": bench.gemm_fp32_flops.median / 1e12,
                "bf16": bench.gemm_bf16_flops.median / 1e12,
            },
            source=f"measured on {self.hostname} at {self.created}",
        )


def detect_cpu(threads: int | None = None) -> CPUInfo:
    """Model name, cores and RAM of this machine (and torch's thread count)."""
    # lazy: Target.parse reads this module, and a usage error must not wait for torch
    import torch

    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    logical = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return CPUInfo(
        model=model,
        logical_cores=logical,
        usable_cores=usable,
        memory_gib=round(memory, 2),
        torch_threads=threads or torch.get_num_threads(),
    )


# The vector and matrix extensions that decide which kernels torch and llama.cpp run.
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw",
              "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo is absent)."""
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def simd_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Which of ``SIMD_FLAGS`` the CPU reports, in that order."""
    present = cpu_flags(cpuinfo)
    return [f for f in SIMD_FLAGS if f in present]


def engine_kernels(engine: str, flags: set[str] | None = None) -> str:
    """The CPU kernels ``engine`` runs on this machine, as the engine itself picks them:
    torch's CPU capability (hf-eager); the features the loaded llama.cpp reports (its
    build decides them, not the CPU); which of vLLM's three x86 kernel builds it imports
    for these ``flags`` (its ``CpuPlatform.import_kernels`` rule: AVX-512 with bf16,
    AVX-512, else AVX2)."""
    if engine == "llama.cpp":
        try:
            import llama_cpp
        except ImportError as err:
            return f"unknown (llama_cpp does not import: {err})"
        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        cpu = info.split("CPU :", 1)[-1].split("|")
        return " ".join(f.split("=")[0].strip() for f in cpu if f.strip().endswith("= 1"))
    if engine == "vllm":
        if platform.machine() not in ("x86_64", "AMD64"):
            return f"vllm._C ({platform.machine()})"
        flags = cpu_flags() if flags is None else flags
        if "avx512f" in flags:
            return ("vllm._C (AVX-512, bf16)" if "avx512_bf16" in flags
                    else "vllm._C_AVX512 (AVX-512)")
        return "vllm._C_AVX2 (AVX2)"
    import torch  # lazy: as in detect_cpu

    return f"torch {torch.backends.cpu.get_cpu_capability()}"


def machine_summary() -> dict[str, object]:
    """What a benchmark or a per-machine decision records: CPU model, its vector
    extensions, the kernels torch picks on it, cores, torch threads and the load average
    (machines here differ: one had AVX2 only, another AVX-512 and AMX)."""
    import torch  # lazy: as in detect_cpu

    cpu = detect_cpu()
    return {"cpu": cpu.model, "cpu_flags": simd_flags(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": cpu.usable_cores, "torch_threads": cpu.torch_threads,
            "torch": torch.__version__, "loadavg_1_5_15": list(os.getloadavg())}


def detect_gpus() -> tuple[list[GPUInfo], str | None, str | None]:
    """NVIDIA GPUs via NVML: ``(gpus, driver_version, error)``; no driver is not a failure."""
    try:
        import pynvml
    except ImportError as err:  # nvidia-ml-py not installed
        return [], None, f"nvidia-ml-py is not installed ({err})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:  # typical on CPU-only machines: no driver library
        return [], None, f"NVML unavailable: {err}"
    try:
        driver = _nvml_text(pynvml.nvmlSystemGetDriverVersion())
        gpus = [_gpu_info(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        return gpus, driver, None
    finally:
        pynvml.nvmlShutdown()


def _gpu_info(pynvml, index: int) -> GPUInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = _nvml_text(pynvml.nvmlDeviceGetName(handle))

    def optional(read: Callable[[], float]) -> float | None:
        try:
            return read()
        except pynvml.NVMLError:  # e.g. "Not Supported" on some boards
            return None

    power_mw = optional(lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle))
    return GPUInfo(
        index=index,
        name=name,
        memory_total_gib=pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB,
        sm_clock_max_mhz=optional(
            lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        ),
        memory_clock_max_mhz=optional(
            lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        ),
        power_limit_w=power_mw / 1000 if power_mw is not None else None,
        registry_name=match_registry_name(name),
    )


def _nvml_text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def match_registry_name(gpu_name: str) -> str | None:
    """Registry key for an NVML device name (``NVIDIA H100 80GB HBM3`` -> ``h100-sxm``)."""
    name = gpu_name.upper()
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return "h100-sxm"
    for key, token in (("h200", "H200"), ("b200", "B200")):
        if token in name:
            return key
    for key, token in (("rtx-5070", "5070"), ("rtx-5080", "5080")):
        if token in name and "TI" not in name.replace("RTX", ""):
            return key
    return None


# ------------------------------------------------------------- benchmarks


def _time_repeats(run: Callable[[], None], repeats: int, budget_s: float) -> list[float]:
    """Seconds per call: one warm-up, then up to ``repeats`` calls within ``budget_s``."""
    run()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def gemm_flops(
    dtype: torch.dtype, size: int, repeats: int = 7, budget_s: float = 1.0
) -> RobustStat:
    """FLOP/s of a square ``size`` matmul in ``dtype`` (2·n³ FLOPs per call)."""
    import torch  # lazy: as in detect_cpu

    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    times = _time_repeats(lambda: torch.matmul(a, b, out=out), repeats, budget_s)
    return RobustStat.of([2 * size**3 / t for t in times], unit="FLOP/s")


def copy_bandwidth(mib: int = 64, repeats: int = 7, budget_s: float = 1.0) -> RobustStat:
    """Bytes/s of copying a ``mib`` MiB fp32 tensor (counts read + write)."""
    import torch  # lazy: as in detect_cpu

    src = torch.randn(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    times = _time_repeats(lambda: dst.copy_(src), repeats, budget_s)
    return RobustStat.of([2 * src.nbytes / t for t in times], unit="B/s")


def run_cpu_benchmarks(threads: int | None = None) -> CPUBenchmarks:
    """GEMM (fp32, bf16) and copy bandwidth, a few seconds in all."""
    import torch  # lazy: as in detect_cpu

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        fp32 = gemm_flops(torch.float32, 1024)
        bf16 = gemm_flops(torch.bfloat16, 512)
        bandwidth = copy_bandwidth()
        return CPUBenchmarks(
            gemm_fp32_flops=fp32,
            gemm_bf16_flops=bf16,
            copy_bandwidth_bytes_s=bandwidth,
            seconds=time.perf_counter() - start,
        )
    finally:
        torch.set_num_threads(previous)


def profile_hardware(benchmarks: bool = True, threads: int | None = None) -> HardwareProfile:
    """Detect GPUs and the CPU; measure the CPU unless ``benchmarks`` is False."""
    import torch  # lazy: as in detect_cpu

    gpus, driver, error = detect_gpus()
    return HardwareProfile(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        torch_version=torch.__version__,
        cpu=detect_cpu(threads),
        benchmarks=run_cpu_benchmarks(threads) if benchmarks else None,
        gpus=gpus,
        driver_version=driver,
        nvml_error=error,
    )


# ------------------------------------------------------------------- caching


def profile_path() -> Path:
    return paths.home() / "hardware" / "profile.json"


def save_profile(profile: HardwareProfile, path: Path | None = None) -> Path:
    """Write the profile as JSON atomically (temp file + rename)."""
    return write_text_atomic(path or profile_path(), profile.model_dump_json(indent=2) + "\n")


def load_profile(refresh: bool = False, path: Path | None = None) -> HardwareProfile:
    """The cached profile of this machine, measuring (and caching) it when absent."""
    path = path or profile_path()
    if not refresh and path.exists():
        try:
            profile = HardwareProfile.model_validate_json(path.read_text())
            if profile.version == PROFILE_VERSION and profile.hostname == socket.gethostname():
                return profile
        except ValueError:
            pass  # unreadable or stale: measure again below
    profile = profile_hardware()
    save_profile(profile, path)
    return profile


# ------------------------------------------------------------- a busy machine's cores


def cores_taken_by_others(window_s: float = 0.5, stat: Path = Path("/proc/stat"),
                          niced: bool = True) -> float | None:
    """How many cores other processes kept busy over ``window_s`` seconds (this process
    sleeps through it, and its own CPU time is taken off). None where that cannot be read:
    no ``/proc/stat`` (not Linux), or this process may use only some of the CPUs that
    ``/proc/stat`` counts (a container's share of a bigger host). ``niced=False`` leaves
    out the user time of processes at a lower priority (a positive nice value): they give
    their core way to a normal one, so they do not disturb a timing."""
    def sample() -> tuple[float, float]:
        lines = stat.read_text().splitlines()
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        if cpus != len(os.sched_getaffinity(0)):
            raise ValueError("this process sees only some of the host's CPUs")
        # user, nice, system, idle, iowait, irq, softirq, steal (proc(5))
        ticks = [int(x) for x in lines[0].split()[1:9]]
        busy = sum(ticks) - ticks[3] - ticks[4] - (0 if niced else ticks[1])
        return busy / os.sysconf("SC_CLK_TCK"), time.process_time()

    try:
        busy0, own0 = sample()
        started = time.perf_counter()
        time.sleep(window_s)
        busy1, own1 = sample()
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return max(0.0, (busy1 - busy0 - (own1 - own0)) / (time.perf_counter() - started))


def cores_in_the_way(threads: int, cores: int | None = None) -> float | None:
    """Cores that other processes at normal priority keep busy beyond those a timing on
    ``threads`` threads leaves them (``cores − threads``): 0 where they fit beside it,
    None where unknown (``cores_taken_by_others``)."""
    taken = cores_taken_by_others(niced=False)
    if taken is None:
        return None
    cores = cores or len(os.sched_getaffinity(0))
    return max(0.0, taken - max(0, cores - threads))


def compute_threads(current: int, taken: float | None, cores: int | None = None) -> int:
    """Torch threads for compute (not for timing) beside other busy processes: ``current``
    at most, and no more than the cores they leave free (at least one).

    Why: a thread team waits for its slowest member at every parallel region, and a member
    sharing its core with another job is slow. On 2 cores beside one spinning process, the
    search's DNAS ran 3.5x slower on 2 threads than on a quiet machine, where losing one
    core of two should cost 2x (lab/results/busy_machine/two-threads_run2.json).
    """
    if taken is None or current <= 1:
        return current
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(current, cores - int(taken + 0.5)))
