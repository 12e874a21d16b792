"""CLI: `autocompress verify` (measure a model on the target, check its limits)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from autocompress.commands import MODEL_HELP
from autocompress.commands.aliases import aliased, renamed, setting
from autocompress.commands.limit_options import LIMIT_ALIASES, NO_LIMITS, limit_options
from autocompress.commands.settings import config_option, load_settings
from autocompress.defaults import DEFAULT_TARGET, DEFAULT_WORKLOAD
from autocompress.limits import Limits

VERIFY_CONFIG_EXAMPLE = (
    "Keys of VerifyOptions, e.g. repeats=5 (timed, after warmup=1), sessions=3 (pooled: one "
    "session on a shared host can read 5-18% off), threads=N (default: the fitted cost "
    "model's), seed=0; isl=, osl=, batch= (override the preset's prompt length, output "
    "length, concurrency); cost_model=FILE (compare with it instead of the target's own)."
)
# The command's own defaults where they differ from the flow's (VerifyOptions): a quick
# check by hand times fewer repetitions than the flow's verdict before registering.
VERIFY_DEFAULTS = {"repeats": 5}

# Old spellings (one release): the limits file and the settings that moved to --config.
VERIFY_ALIASES = {
    **LIMIT_ALIASES,
    "--limits": renamed("--limit"),
    **{f"--{key.replace('_', '-')}": setting(key) for key in (
        "isl", "osl", "batch", "repeats", "warmup", "sessions", "threads", "cost_model")},
}


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("verify", cls=aliased(VERIFY_ALIASES))(limit_options(verify_command))


def _verify_settings():
    """VerifyOptions plus the workload overrides and the cost model to compare with."""
    from autocompress.stage_config import VerifyOptions

    class VerifySettings(VerifyOptions):
        isl: int | None = None
        osl: int | None = None
        batch: int | None = None
        cost_model: Path | None = None

    return VerifySettings


def verify_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    target: str = typer.Option(
        DEFAULT_TARGET, "--target",
        help="HARDWARE/ENGINE/DTYPE to measure on; must be this machine (the local CPU, "
        "or a local GPU with hf-eager).",
    ),
    workload: str = typer.Option(
        DEFAULT_WORKLOAD, "--workload", "-w",
        help="Workload preset (see `autocompress costmodel presets`).",
    ),
    limits: Limits = NO_LIMITS,
    json_out: Path | None = typer.Option(None, "--json",
                                         help="Write the report JSON to this file."),
    config: list[str] = config_option(VERIFY_CONFIG_EXAMPLE),
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

    parsed = Target.parse(target)  # first: the settings' and verify's modules load torch
    settings = load_settings(_verify_settings(), config, "verify", base=VERIFY_DEFAULTS)
    if json_out:  # a directory named as the JSON file is refused before measuring
        from autocompress.atomic import check_out_file

        check_out_file(json_out, "--json")
    from autocompress.verify import verify  # lazy: torch, after the checks above
    if model.startswith("models:/"):  # the registered file the engine serves, else its model
        from autocompress.tracking import registered_artifact

        model = str(registered_artifact(model, ("engine_model", "model")))
    shape = get_workload(workload).with_overrides(isl=settings.isl, osl=settings.osl,
                                                  batch=settings.batch)
    model_cost = CostModel.load(settings.cost_model) if settings.cost_model else None
    report = verify(model, parsed, shape, limits, repeats=settings.repeats,
                    warmup=settings.warmup, threads=settings.threads, seed=settings.seed,
                    cost_model=model_cost, sessions=settings.sessions)
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
        console.print(report.prediction_note, soft_wrap=True)
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
