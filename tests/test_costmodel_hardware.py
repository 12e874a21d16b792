"""Hardware profile, spec registry, targets and workloads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autocompress.costmodel import PRESETS, Target, Workload, get_workload
from autocompress.errors import AutoCompressError
from autocompress.hardware import (
    RobustStat,
    detect_gpus,
    load_profile,
    load_registry,
    match_registry_name,
    profile_hardware,
    resolve_hardware,
)


def test_registry_holds_the_reference_gpus():
    registry = load_registry()
    assert set(registry) == {"rtx-5070", "rtx-5080", "h100-sxm", "h200", "b200"}
    h100 = registry["h100-sxm"]
    assert h100.memory_gib == 80 and h100.bandwidth_gb_s == 3350
    assert h100.peak_flops("bf16") == 989e12 and h100.peak_flops("fp8") == 1979e12
    for spec in registry.values():
        assert spec.flops_tflops["fp8"] >= 2 * spec.flops_tflops["bf16"] > 0
        assert spec.memory_gib > 0 and spec.bandwidth_gb_s > 0
    with pytest.raises(AutoCompressError, match="fp4"):
        h100.peak_flops("fp4")


def test_nvml_names_map_to_the_registry():
    assert match_registry_name("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert match_registry_name("NVIDIA H100 PCIe") is None
    assert match_registry_name("NVIDIA H200") == "h200"
    assert match_registry_name("NVIDIA GeForce RTX 5070") == "rtx-5070"
    assert match_registry_name("NVIDIA GeForce RTX 5070 Ti") is None


def test_no_driver_is_reported_not_raised():
    gpus, driver, error = detect_gpus()
    if gpus:
        assert error is None and driver
    else:  # CPU-only machine (or no driver): a reason, no exception
        assert isinstance(error, str) and error or driver is not None


def test_simd_flags_are_read_from_cpuinfo(tmp_path):
    from autocompress.hardware import simd_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\n"
                       "flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile amx_bf16\n")
    assert simd_flags(cpuinfo) == ["sse4_2", "avx", "avx2", "fma", "avx512f",
                                   "amx_tile", "amx_bf16"]
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma f16c\n")
    assert "avx512f" not in simd_flags(cpuinfo)  # an AVX2-only EPYC
    assert simd_flags(tmp_path / "missing") == []


def test_each_engine_says_which_kernels_it_runs(monkeypatch):
    """vLLM's three x86 builds by its own rule on the CPU's flags; llama.cpp as the loaded
    library reports its build (this one is built with AVX2: the Makefile's flags); torch
    as it reports its capability."""
    import platform

    import torch

    from autocompress.hardware import engine_kernels

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert engine_kernels("vllm", {"avx2", "fma"}) == "vllm._C_AVX2 (AVX2)"
    assert engine_kernels("vllm", {"avx2", "avx512f"}) == "vllm._C_AVX512 (AVX-512)"
    assert engine_kernels("vllm", {"avx512f", "avx512_bf16"}) == "vllm._C (AVX-512, bf16)"
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert engine_kernels("vllm", set()) == "vllm._C (aarch64)"
    assert "AVX2" in engine_kernels("llama.cpp").split()
    assert engine_kernels("hf-eager") == f"torch {torch.backends.cpu.get_cpu_capability()}"


def test_robust_stat():
    stat = RobustStat.of([10, 11, 9, 10, 100], unit="ms")
    assert stat.median == 10 and stat.n == 5 and stat.q1 <= 10 <= stat.q3
    assert stat.minimum == 9 <= stat.p10 <= stat.q1
    assert stat.spread == pytest.approx((stat.q3 - stat.q1) / 10)
    assert RobustStat.of([4.0]).spread == 0


def test_profile_is_measured_cached_and_becomes_cpu_local(autocompress_home):
    profile = profile_hardware(threads=1)
    bench = profile.benchmarks
    assert bench.gemm_fp32_flops.median > 0 and bench.copy_bandwidth_bytes_s.median > 0
    assert profile.cpu.logical_cores >= 1 and profile.cpu.memory_gib > 0
    # load_profile measures once and then reads the cache.
    first = load_profile()
    assert (autocompress_home / "hardware" / "profile.json").exists()
    assert load_profile().created == first.created
    spec = resolve_hardware("cpu-local")
    assert spec.kind == "cpu" and spec.flops_tflops["fp32"] > 0
    target = Target.parse("cpu-local/hf-eager/fp32")
    assert target.measurable and target.name == "cpu-local/hf-eager/fp32"
    assert not Target.parse("h100-sxm/vllm").measurable


def test_workload_presets_and_overrides():
    assert set(PRESETS) == {"local-coding", "datacenter", "interactive", "local-coding-cpu",
                            "datacenter-cpu", "interactive-cpu"}
    for name in ("local-coding", "datacenter", "interactive"):
        cpu = get_workload(f"{name}-cpu")
        assert cpu.isl <= 512 and cpu.osl <= 64 and cpu.batch <= 8
        assert get_workload(name).isl >= cpu.isl
    assert PRESETS["datacenter"].default_target.startswith("h100-sxm")
    assert PRESETS["local-coding"].default_target.startswith("rtx-5070")
    assert PRESETS["interactive"].default_target.startswith("rtx-5080")
    custom = get_workload("datacenter").with_overrides(batch=8)
    assert custom.batch == 8 and custom.name == "datacenter+custom"
    w = Workload(isl=100, osl=10, batch=4)
    assert w.throughput_constraint_as_tpot_ms(200.0) == pytest.approx(20.0)
    with pytest.raises(AutoCompressError, match="presets"):
        get_workload("gaming")


def test_cli_hardware_commands(autocompress_home, tmp_path):
    from autocompress.cli import app

    runner = CliRunner()
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["hardware", "profile", "--no-bench", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["benchmarks"] is None and data["cpu"]["logical_cores"] >= 1
    result = runner.invoke(app, ["hardware", "list"])
    assert result.exit_code == 0 and "h100-sxm" in result.output
