"""CLI: ``autocompress hardware ...`` and ``autocompress costmodel ...``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

from autocompress.atomic import write_json_atomic
from autocompress.commands import format_option, print_json
from autocompress.commands.aliases import PRINT_JSON, aliased, setting
from autocompress.commands.settings import config_option, load_settings
from autocompress.defaults import DEFAULT_TARGET
from autocompress.errors import AutoCompressError

hardware_app = typer.Typer(
    help="Profile this machine (NVIDIA GPUs via NVML, the CPU with microbenchmarks) and "
    "list the GPUs of the spec registry.",
    no_args_is_help=True,
)
costmodel_app = typer.Typer(
    help="Predict latency, throughput and memory of an architecture on a target "
    "(hardware/engine/dtype) and workload; fit the cost model on the local CPU and "
    "validate it against measurements.",
    no_args_is_help=True,
)
console = Console()

STATISTIC_HELP = (
    "Timing statistic: median (what runs take now) or floor (10th percentile: the "
    "uncontended speed when other jobs share the CPU)."
)
THREADS_HELP = (
    "CPU threads while measuring (torch's, or llama.cpp's own; the fitted model is valid "
    "for this count; 1 on a shared machine)."
)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.add_typer(hardware_app, name="hardware")
    app.add_typer(costmodel_app, name="costmodel")


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# ------------------------------------------------------------------ hardware


@hardware_app.command("profile")
def hardware_profile(
    json_out: Path | None = typer.Option(
        None, "--json", help="Also write the profile JSON to this file."
    ),
    bench: bool = typer.Option(
        True, "--bench/--no-bench", help="Run the CPU microbenchmarks (GEMM FLOP/s, "
        "memory bandwidth; a few seconds). cpu-local needs them."
    ),
    threads: int = typer.Option(1, help=THREADS_HELP),
) -> None:
    """Detect GPUs and the CPU, measure the CPU, cache the profile (cpu-local uses it)."""
    from autocompress.hardware import profile_hardware, save_profile

    _set_threads(threads)
    profile = profile_hardware(benchmarks=bench, threads=threads)
    cached = save_profile(profile) if bench else None
    if json_out:
        write_json_atomic(json_out, profile.model_dump(mode="json"))
    table = Table(title="hardware profile")
    table.add_column("item")
    table.add_column("value")
    cpu = profile.cpu
    table.add_row("cpu", f"{cpu.model}, {cpu.usable_cores}/{cpu.logical_cores} cores, "
                  f"{cpu.memory_gib:.1f} GiB")
    if profile.benchmarks:
        b = profile.benchmarks
        for label, stat, scale, unit in (
            ("GEMM fp32", b.gemm_fp32_flops, 1e9, "GFLOP/s"),
            ("GEMM bf16", b.gemm_bf16_flops, 1e9, "GFLOP/s"),
            ("copy bandwidth", b.copy_bandwidth_bytes_s, 1e9, "GB/s"),
        ):
            table.add_row(label, f"{stat.median / scale:.2f} {unit} "
                          f"(IQR {stat.spread * 100:.1f}%, n={stat.n}, {threads} thread(s))")
    for gpu in profile.gpus:
        table.add_row(f"gpu {gpu.index}", f"{gpu.name}, {gpu.memory_total_gib:.1f} GiB, "
                      f"registry: {gpu.registry_name or 'none'}")
    if not profile.gpus:
        table.add_row("gpu", f"none ({profile.nvml_error})")
    console.print(table)
    if cached:
        console.print(f"cached at {cached}")


@hardware_app.command("list")
def hardware_list() -> None:
    """List the GPUs of the spec registry (memory, bandwidth, dense FLOP/s)."""
    from autocompress.hardware import load_registry

    table = Table(title="spec registry (dense, no sparsity)")
    for column in ("name", "device", "memory GiB", "GB/s", "bf16 TFLOP/s", "fp8 TFLOP/s"):
        table.add_column(column)
    for name, spec in load_registry().items():
        flops = spec.flops_tflops
        table.add_row(name, spec.display_name, f"{spec.memory_gib:g}", f"{spec.bandwidth_gb_s:g}",
                      f"{flops.get('bf16', 0):g}", f"{flops.get('fp8', 0):g}")
    console.print(table)
    console.print("cpu-local: measured by `autocompress hardware profile`")


# ----------------------------------------------------------------- costmodel


@costmodel_app.command("presets", cls=aliased(PRINT_JSON))
def presets(fmt: str = format_option("the presets")) -> None:
    """List the workload presets with their settings."""
    from autocompress.costmodel.workload import PRESETS

    if print_json(fmt):
        typer.echo(json.dumps({k: w.model_dump() for k, w in PRESETS.items()}, indent=2))
        return
    table = Table(title="workload presets")
    for column in ("name", "isl", "osl", "batch", "main metric", "default target"):
        table.add_column(column, no_wrap=True)
    for w in PRESETS.values():
        table.add_row(w.name, str(w.isl), str(w.osl), str(w.batch), w.main_metric,
                      w.default_target)
    console.print(table)
    for w in PRESETS.values():
        console.print(f"[bold]{w.name}[/bold]: {w.description}")


@costmodel_app.command("targets", cls=aliased(PRINT_JSON))
def targets(fmt: str = format_option("the targets")) -> None:
    """List every target (hardware/engine/dtype): measured here or analytic, fitted or not."""
    from autocompress.costmodel.model import default_path
    from autocompress.costmodel.target import Target, known_targets

    rows = []
    for name in known_targets():
        target = Target.parse(name)
        rows.append({"target": name, "measurable": target.measurable,
                     "engine_installed": _engine_installed(target),
                     "cost_model": "fitted" if default_path(target).exists() else "analytic"})
    if print_json(fmt):
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="targets (HARDWARE/ENGINE/DTYPE)")
    for column in ("target", "timed on this machine", "cost model"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        timed = "no (spec sheet)" if not row["measurable"] else \
            "yes" if row["engine_installed"] else "yes, once installed (make vllm)"
        table.add_row(row["target"], timed, row["cost_model"])
    console.print(table)
    console.print("`autocompress costmodel fit --target T` fits a measurable target's model.")


def _engine_installed(target) -> bool:
    """Whether the engine of a target timed here is installed (vLLM has a venv of its own)."""
    if target.engine.name != "vllm" or not target.measurable:
        return True
    from autocompress.vllm_engine import engine_available

    return engine_available()


def _cost_model(target_text: str, tp: int, cost_model: Path | None, threads: int = 1):
    from autocompress.costmodel.model import CostModel
    from autocompress.costmodel.target import Target

    target = Target.parse(target_text, tp=tp, threads=threads)
    if cost_model is not None:
        model = CostModel.load(cost_model)
        if model.target.name != target.name:
            raise AutoCompressError(
                f"cost model {cost_model} is for {model.target.name}, not {target.name}",
                hint="pass the matching --target or another cost_model (--config cost_model=FILE)",
            )
        return model.model_copy(update={"target": target})
    return CostModel.for_target(target)


class PredictSettings(BaseModel):
    """What-if settings of ``costmodel predict`` (the preset's shape, the parallelism)."""

    model_config = ConfigDict(extra="forbid")

    isl: int | None = Field(None, description="prompt length (tokens)")
    osl: int | None = Field(None, description="generated tokens")
    concurrency: int | None = Field(None, description="the batch")
    tp: int = Field(1, description="tensor-parallel degree (GPUs per replica)")
    cost_model: Path | None = Field(None, description="a saved cost model JSON")


PREDICT_CONFIG_EXAMPLE = (
    "Keys: isl=N, osl=N, concurrency=N (override the preset's prompt length, generated "
    "tokens, batch), tp=N (GPUs per replica), cost_model=FILE (default: the target's fitted "
    "model if any, else the analytic one)."
)
PREDICT_ALIASES = {**PRINT_JSON, **{f"--{key.replace('_', '-')}": setting(key) for key in
                                    PredictSettings.model_fields}}


@costmodel_app.command("predict", cls=aliased(PREDICT_ALIASES))
def predict(
    model: str = typer.Option(
        ..., "--model", "-m", help="Model directory, config.json (Llama family, nemotron-nas "
        "block_configs, autocompress_hetero), ArchSpec JSON, or `default`."
    ),
    target: str = typer.Option(
        None, "--target", help="HARDWARE/ENGINE or HARDWARE/ENGINE/DTYPE, e.g. h100-sxm/vllm/bf16 "
        "(default: the workload preset's default target)."
    ),
    workload: str = typer.Option(
        None, "--workload", "-w", help="Workload preset (see `costmodel presets`); default: "
        "the target's preset."
    ),
    fmt: str = format_option("the prediction"),
    config: list[str] = config_option(PREDICT_CONFIG_EXAMPLE),
) -> None:
    """Predict TTFT, TPOT, end-to-end latency, throughput, memory and fit of a model."""
    from autocompress.costmodel.configs import load_arch
    from autocompress.costmodel.workload import default_workload_for, get_workload

    settings = load_settings(PredictSettings, config, "costmodel predict")
    isl, osl, concurrency, tp = settings.isl, settings.osl, settings.concurrency, settings.tp
    spec, notes = load_arch(model)
    if workload is None and target is None:
        raise AutoCompressError("give --target and/or --workload",
                                hint="e.g. --target h100-sxm/vllm/bf16 --workload datacenter")
    preset = get_workload(workload) if workload else default_workload_for(target)
    target = target or preset.default_target
    chosen = preset.with_overrides(isl=isl, osl=osl, batch=concurrency)
    if tp < 1:
        raise AutoCompressError(f"tp must be at least 1 (got {tp})",
                                hint="tp is the number of GPUs per replica, e.g. --config tp=2")
    cm = _cost_model(target, tp, settings.cost_model)
    spec.validate_legality(tp=tp)
    result = cm.predict(spec, chosen)
    payload = {
        **result.metrics(),
        "max_context_tokens": result.max_context_tokens,
        "reason": result.reason,
        "target": result.target,
        "tp": result.tp,
        "workload": chosen.model_dump(),
        "params": spec.num_params(),
        "cost_model": result.cost_model,
        "notes": notes,
        "cost_model_note": _unfitted_line(cm),
    }
    if print_json(fmt):
        typer.echo(json.dumps(payload, indent=2))
        return
    table = Table(title=f"{model} on {result.target} (tp={tp}), {chosen.name}: "
                  f"isl {chosen.isl}, osl {chosen.osl}, batch {chosen.batch}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "throughput_tok_s", "memory_gb"):
        table.add_row(key, f"{payload[key]:,.3f}")
    table.add_row("max_concurrency", str(result.max_concurrency))
    table.add_row("max_context_tokens", str(result.max_context_tokens))
    table.add_row("fits", "yes" if result.fits else f"NO: {result.reason}")
    table.add_row("params", f"{spec.num_params():,}")
    console.print(table)
    if not result.fits:
        console.print(f"does not fit; at this context the most concurrent sequences that fit "
                      f"is {result.max_concurrency}, at this concurrency the longest context "
                      f"is {result.max_context_tokens} tokens")
    for note in notes:
        console.print(f"note: {note}")
    console.print(f"cost model: {result.cost_model}")
    if payload["cost_model_note"]:
        console.print(f"[yellow]{payload['cost_model_note']}[/yellow]", soft_wrap=True)


def _unfitted_line(model) -> str | None:
    """The line that says the figures are the analytic model's, where this machine could
    time the target and nothing is fitted (elsewhere the analytic model is the product)."""
    from autocompress.costmodel.model import unfitted_note

    if model.source == "fitted" or not model.target.measurable:
        return None
    return unfitted_note(model.target)


def _workloads(names: list[str] | None):
    from autocompress.costmodel.fit import CPU_FIT_WORKLOADS
    from autocompress.costmodel.workload import get_workload

    return [get_workload(n) for n in (names or CPU_FIT_WORKLOADS)]


MEASURABLE_HELP = ("A measurable target: cpu-local/hf-eager/fp32|bf16, "
                   "cpu-local/llama.cpp/f32|f16|q8_0|q4_0 or cpu-local/vllm/fp32|bf16.")


def _fit_settings():
    """FitOptions (the flow's fit settings) plus how this machine is timed."""
    from autocompress.stage_config import FitOptions

    class FitSettings(FitOptions):
        threads: int = Field(1, ge=1)
        statistic: Literal["median", "floor"] = "median"
        rows: Path | None = None

    return FitSettings


FIT_CONFIG_EXAMPLE = (
    "Keys of FitOptions, e.g. workloads=[interactive-cpu] (default: the three -cpu presets), "
    "n_probes=20, repeats=3, warmup=1, seed=0, paired=true (time "
    "each probe in lockstep with the teacher's architecture; false: alone); threads=1 (" +
    THREADS_HELP + "), statistic=median|floor (" + STATISTIC_HELP + "), rows=FILE (also "
    "save the probe data JSON)."
)
FIT_ALIASES = {
    "--workload": setting("workloads[]"), "-w": setting("workloads[]"),
    "--probes": setting("n_probes"), "--repeats": setting("repeats"),
    "--warmup": setting("warmup"), "--threads": setting("threads"), "--seed": setting("seed"),
    "--statistic": setting("statistic"), "--rows": setting("rows"),
    "--paired": setting("paired", "true"), "--absolute": setting("paired", "false"),
}


@costmodel_app.command("fit", cls=aliased(FIT_ALIASES))
def fit(
    target: str = typer.Option(DEFAULT_TARGET, "--target", help=MEASURABLE_HELP),
    out: Path | None = typer.Option(
        None, "--out", help="Where to save the model (default: AUTOCOMPRESS_HOME/costmodels/)."
    ),
    config: list[str] = config_option(FIT_CONFIG_EXAMPLE),
) -> None:
    """Measure probe architectures on the local target and fit the cost model (NNLS)."""
    from autocompress.costmodel.target import Target

    Target.parse(target)  # first: a bad target is one line; the settings' modules load torch
    settings = load_settings(_fit_settings(), config, "costmodel fit")
    threads, rows_out = settings.threads, settings.rows
    parsed = Target.parse(target, threads=threads)
    # lazy, after the checks: a bad target is one line that does not wait for torch
    from autocompress.costmodel.fit import fit_cost_model
    from autocompress.costmodel.model import default_path
    from autocompress.costmodel.probes import default_base_config

    _set_threads(threads)
    model, rows = fit_cost_model(parsed, default_base_config(),
                                 _workloads(settings.workloads),
                                 n_probes=settings.n_probes, repeats=settings.repeats,
                                 warmup=settings.warmup, seed=settings.seed,
                                 statistic=settings.statistic, paired=settings.paired)
    path = out or default_path(parsed)
    sha = model.save(path)
    if rows_out:
        write_json_atomic(rows_out, [row.model_dump(mode="json") for row in rows])
    report = model.fit
    table = Table(title=f"fitted {model.version} on {report.n_rows} measurements")
    table.add_column("metric")
    table.add_column("train MAPE %", justify="right")
    table.add_column("median spread %", justify="right")
    for key in ("ttft_ms", "tpot_ms", "memory_gb"):
        spread = report.median_spread.get(key)
        table.add_row(key, f"{report.train_mape[key]:.2f}",
                      "-" if spread is None else f"{spread * 100:.1f}")
    console.print(table)
    console.print(f"saved {path} (sha256 {sha[:16]}…) in {report.seconds:.0f} s")


class ValidateSettings(BaseModel):
    """How ``costmodel validate`` samples and times architectures."""

    model_config = ConfigDict(extra="forbid")

    workloads: list[str] | None = Field(None, description="default: the three -cpu presets")
    n: int = Field(30, ge=1, description="sampled architectures")
    repeats: int = Field(5, ge=1)
    warmup: int = Field(1, ge=0)
    threads: int = Field(1, ge=1)
    seed: int = 1000
    statistic: Literal["median", "floor"] = "median"
    cost_model: Path | None = None
    plot: Path | None = None


VALIDATE_CONFIG_EXAMPLE = (
    "Keys: workloads=[interactive-cpu] (default: the three -cpu presets), n=30 (sampled "
    "architectures), repeats=5, warmup=1, threads=1, seed=1000, "
    "statistic=median|floor, cost_model=FILE (default: the target's fitted one), "
    "plot=FILE (a predicted-vs-measured PNG)."
)
VALIDATE_ALIASES = {f"--{key.replace('_', '-')}": setting(key)
                    for key in ValidateSettings.model_fields if key != "workloads"}
VALIDATE_ALIASES.update({"--workload": setting("workloads[]"), "-w": setting("workloads[]")})


@costmodel_app.command("validate", cls=aliased(VALIDATE_ALIASES))
def validate(
    target: str = typer.Option(DEFAULT_TARGET, "--target", help=MEASURABLE_HELP),
    json_out: Path | None = typer.Option(None, "--json",
                                         help="Write the report JSON to this file."),
    config: list[str] = config_option(VALIDATE_CONFIG_EXAMPLE),
) -> None:
    """Measure sampled architectures and report MAPE, Kendall τ and spread per metric."""
    from autocompress.costmodel.target import Target

    settings = load_settings(ValidateSettings, config, "costmodel validate")
    n, statistic = settings.n, settings.statistic
    if not Target.parse(target).measurable:
        raise AutoCompressError(f"{target} cannot be measured on this machine",
                                hint="validate cpu-local/hf-eager/fp32, cpu-local/llama.cpp/q8_0 "
                                "or cpu-local/vllm/bf16")
    # lazy, after the checks: a bad target is one line that does not wait for torch
    from autocompress.costmodel.probes import default_base_config
    from autocompress.costmodel.validate import plot_validation, validate_cost_model

    _set_threads(settings.threads)
    model = _cost_model(target, 1, settings.cost_model, settings.threads)
    unfitted = _unfitted_line(model)
    if unfitted:  # said before minutes of timing, and again under the figures
        console.print(f"[yellow]{unfitted}[/yellow]", soft_wrap=True)
    report = validate_cost_model(model, default_base_config(), _workloads(settings.workloads),
                                 n=n, repeats=settings.repeats, warmup=settings.warmup,
                                 seed=settings.seed, statistic=statistic)
    if json_out:
        write_json_atomic(json_out, report.model_dump(mode="json"))
    if settings.plot:
        plot_validation(report, settings.plot)
    table = Table(title=f"{model.version}: n={n} × {len(report.workloads)} workload(s), "
                  f"{statistic} of {report.timing} timings, {report.seconds:.0f} s")
    for column in ("metric", "MAPE %", "Kendall τ", "median spread %"):
        table.add_column(column, justify="right")
    for metric, mape, tau, spread in report.table():
        table.add_row(metric, f"{mape:.2f}", f"{tau:.3f}", f"{spread * 100:.1f}")
    console.print(table)
    if unfitted:
        console.print(f"[yellow]{unfitted}[/yellow]", soft_wrap=True)
