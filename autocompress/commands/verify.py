"""CLI: `autocompress verify` (measure a model on the target, check its limits)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from autocompress.commands import MODEL_HELP
from autocompress.commands.limit_options import NO_LIMITS, limit_options
from autocompress.limits import Limits


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("verify")(limit_options(verify_command))


def verify_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    target: str = typer.Option(
        "cpu-local/hf-eager/fp32", "--target",
        help="HARDWARE/ENGINE/DTYPE to measure on; must be this machine (the local CPU, "
        "or a local GPU with hf-eager).",
    ),
    workload: str = typer.Option(
        "interactive-cpu", "--workload", "-w",
        help="Workload preset (see `autocompress costmodel presets`).",
    ),
    isl: int | None = typer.Option(None, help="Override the preset's prompt length."),
    osl: int | None = typer.Option(None, help="Override the preset's output length."),
    batch: int | None = typer.Option(None, help="Override the preset's concurrency."),
    limits: Limits = NO_LIMITS,
    limits_file: Path | None = typer.Option(
        None, "--limits", help="JSON file of limits (the Limits fields); options override it."
    ),
    repeats: int = typer.Option(5, help="Timed repetitions (after warm-up)."),
    warmup: int = typer.Option(1, help="Untimed warm-up repetitions."),
    sessions: int = typer.Option(3, help="Timing sessions pooled (median of each metric): "
                                 "one session on a shared host can read 5-18% off."),
    threads: int | None = typer.Option(
        None, help="torch threads while measuring (default: those of the fitted cost model)."
    ),
    cost_model: Path | None = typer.Option(
        None, help="Cost model JSON to compare with (default: the target's fitted one, "
        "else the analytic model)."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report as JSON here."),
) -> None:
    """Measure a model on the target and check its limits; exit 1 if one is violated.

    TTFT, TPOT, end-to-end latency, throughput and peak memory are measured
    with the harness the cost model was fitted and validated with, and shown
    beside the cost model's prediction. A limit passes when the median meets
    it, or lies within the median's 95% confidence interval (memory: exactly).
    """
    from autocompress.atomic import write_json_atomic
    from autocompress.costmodel.model import CostModel
    from autocompress.costmodel.target import Target
    from autocompress.costmodel.workload import get_workload
    from autocompress.errors import AutoCompressError
    from autocompress.limits import limits_from_options
    from autocompress.verify import verify

    limits = limits_from_options(limits_file, **limits.model_dump(exclude_none=True))
    if json_out:  # a directory named as the JSON file is refused before measuring
        from autocompress.atomic import check_out_file

        check_out_file(json_out, "--json")
    for name, value, least in (("--repeats", repeats, 1), ("--warmup", warmup, 0),
                               ("--threads", threads, 1), ("--sessions", sessions, 1)):
        if value is not None and value < least:
            raise AutoCompressError(f"{name} must be at least {least} (got {value})",
                                    hint=f"pass {name} {least} or more")
    parsed = Target.parse(target)
    if model.startswith("models:/"):  # the registered file the engine serves, else its model
        from autocompress.tracking import registered_artifact

        model = str(registered_artifact(model, ("engine_model", "model")))
    shape = get_workload(workload).with_overrides(isl=isl, osl=osl, batch=batch)
    model_cost = CostModel.load(cost_model) if cost_model else None
    report = verify(model, parsed, shape, limits, repeats=repeats, warmup=warmup,
                    threads=threads, cost_model=model_cost, sessions=sessions)
    if json_out:
        write_json_atomic(json_out, report.model_dump(mode="json"), indent=1)
    _print_verify(report)
    if not report.ok:
        sys.exit(1)


def _print_verify(report) -> None:
    from rich.console import Console
    from rich.table import Table

    checks = {c.metric: c for c in report.checks}
    table = Table(title=f"verify {report.model} on {report.target}, "
                        f"workload {report.workload['name']}")
    for column in ("metric", "measured", "± noise", "predicted", "limit", ""):
        table.add_column(column, justify="right" if column not in ("metric", "") else "left")
    for metric, value in report.measured.items():
        predicted = (report.predicted or {}).get(metric)
        check = checks.get(metric)
        limit = "-"
        if check is not None:
            limit = f"{'≤' if check.direction == 'max' else '≥'} {check.limit:g}"
        status = "" if check is None else ("[green]ok[/]" if check.ok else "[red]VIOLATED[/]")
        table.add_row(metric, f"{value:.4g}", f"{report.noise.get(metric, 0):.2g}",
                      "-" if predicted is None else f"{predicted:.4g}", limit, status)
    console = Console()
    console.print(table)
    if report.prediction_note:
        console.print(report.prediction_note)
    if report.measurement.get("what"):
        console.print(f"timed: {report.measurement['what']}")
    sessions = report.measurement.get("sessions") or []
    if len(sessions) > 1:
        spread = report.measurement.get("session_spread", {})
        console.print(f"{len(sessions)} timing sessions pooled (median); TPOT per session "
                      + ", ".join(f"{s['tpot_ms']:.4g}" for s in sessions)
                      + f" ms (spread {spread.get('tpot_ms', 0):.1%})")
    console.print("[green]PASS[/]" if report.ok else
                  f"[red]FAIL[/]: {', '.join(report.violations)} over the limit")
