"""CLI commands of the pipeline: ``autocompress run`` and ``autocompress lineage``.

``run`` starts the ``compress`` Prefect flow in this process (no server needed:
Prefect starts a temporary local one; set ``PREFECT_API_URL`` to use a server).
Prefect is imported only inside the command, so the library stays Prefect-free.
"""

from __future__ import annotations

import os
import time
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autocompress.commands.limit_options import NO_LIMITS, budget_fraction_option, limit_options
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits

console = Console()

# Columns of the final table, in this order, when some row has them. Latency and
# memory appear twice: as the cost model predicted them and as measured.
_COLUMNS = ["params", "predicted_ttft_ms", "ttft_ms", "predicted_tpot_ms", "tpot_ms",
            "predicted_memory_gb", "memory_gb", "throughput_tok_s", "ok", "mc_mean",
            "bits_per_byte", "next_token_acc", "heldout_loss"]
# Report outputs that describe each row of the table (later ones win on a clash).
_ROWS = {
    "teacher": ("teacher", "teacher_eval", "teacher_verification"),
    "compressed": ("arch", "model", "evaluation", "verification"),
    "minitron baseline": ("baseline_arch", "baseline_model", "baseline_evaluation",
                          "baseline_verification"),
}


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``lineage`` to the main app."""
    app.command("run")(limit_options(run))
    app.command("lineage")(lineage_command)


def run(
    teacher: str = typer.Option("default", help="A named teacher (`default`, `smollm2-135m`), a "
                                "model directory, a hub id, or models:/NAME/VERSION from the "
                                "MLflow registry."),
    target: list[str] = typer.Option(
        ["cpu-local/hf-eager/fp32"], help="Hardware/engine/dtype the model must run on; "
        "repeat it for one architecture that meets every target's limits (a joint search)."),
    workload: str = typer.Option("local-coding-cpu", help="Workload preset name."),
    limits: Limits = NO_LIMITS,
    budget_fraction: float | None = budget_fraction_option(),
    budgets: str | None = typer.Option(
        None, help="A Pareto family from one search: budget fractions, comma-separated "
        "(e.g. 0.3,0.4,0.5,0.6,0.7); one model per budget, each verified on the target."),
    baseline: bool = typer.Option(False, help="Also run the Minitron baseline for comparison."),
    method: str = typer.Option(
        "autocompress", help="How the architecture is found: autocompress (the search), greedy "
        "(repair from the teacher, no DNAS), random (random search, as many scored "
        "architectures as the search) or minitron (the fair homogeneous baseline)."),
    seed: int | None = typer.Option(None, help="Search and distillation seed (default: the "
                                    "options' own, else 0)."),
    eval_tasks: str | None = typer.Option(None, help="Benchmarks (comma list; default: the "
                                          "local code suite)."),
    eval_limit: int | None = typer.Option(None, help="Cap items per benchmark (quick runs)."),
    register_as: str = typer.Option("autocompress-compressed",
                                    help="MLflow registry name of the compressed model."),
    no_register: bool = typer.Option(False, "--no-register", help="Do not register the model."),
    store: str | None = typer.Option(None, help="Artifact store: a directory or "
                                     "s3://bucket/prefix (default $AUTOCOMPRESS_STORE or "
                                     "$AUTOCOMPRESS_HOME/artifacts)."),
    experiment: str = typer.Option("autocompress", help="MLflow experiment name."),
    no_track: bool = typer.Option(False, "--no-track", help="Do not log to MLflow."),
    refresh_cache: bool = typer.Option(False, help="Recompute every stage instead of reusing "
                                       "cached results."),
    options: str | None = typer.Option(
        None, help='Per-stage settings as JSON or @FILE, e.g. \'{"costmodel": {"n_probes": 8}, '
        '"validation": {"n": 6, "max_mape": 40}}\'.'),
) -> None:
    """Compress a teacher to meet the limits on a target (the full Prefect flow).

    Re-running with the same options reuses every finished stage; a failed run
    continues where it stopped. Results go to the artifact store and MLflow
    (embedded sqlite under $AUTOCOMPRESS_HOME unless MLFLOW_TRACKING_URI is set).
    """
    started = time.perf_counter()
    from autocompress.arch_search.run import METHODS

    if method not in METHODS:  # before Prefect starts: one line, exit 2
        raise AutoCompressError(f"unknown --method {method!r}", f"use one of {', '.join(METHODS)}")
    if not no_register:  # a bad name fails here, not after hours of compression
        from autocompress.tracking import check_registry_name

        check_registry_name(register_as)
    fractions = many_targets_mode(target, budgets, budget_fraction, limits, method, baseline)
    from autocompress.stage_options import parse_options

    stage_options = parse_options(options)  # every stage's settings, before any stage runs
    _prepare_environment()
    if refresh_cache:
        os.environ["PREFECT_TASKS_REFRESH_CACHE"] = "true"
    common = dict(teacher=teacher, workload=workload, seed=seed, eval_tasks=eval_tasks,
                  eval_limit=eval_limit, store=store, experiment=experiment,
                  track=not no_track, options=stage_options)
    if fractions is not None or len(target) > 1:
        from flows.targets import compress_joint, pareto

        report = (pareto(target=target[0], budgets=fractions, **common) if fractions
                  else compress_joint(targets=target, budget_fraction=budget_fraction,
                                      limits=limits.model_dump(exclude_none=True), **common))
        print_report(report, time.perf_counter() - started)
        return
    from flows.compress import compress

    report = compress(teacher=teacher, target=target[0], workload=workload,
                      limits=limits.model_dump(exclude_none=True),
                      budget_fraction=budget_fraction, baseline=baseline, method=method,
                      seed=seed, eval_tasks=eval_tasks, eval_limit=eval_limit,
                      register_as=None if no_register else register_as, store=store,
                      experiment=experiment, track=not no_track, options=stage_options)
    print_report(report, time.perf_counter() - started)


def parse_budgets(text: str) -> list[float]:
    """``--budgets 0.3,0.5,0.7`` -> fractions (each in (0, 1], at least two distinct)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AutoCompressError(f"--budgets {text!r} is not a comma-separated list of numbers",
                                "e.g. --budgets 0.3,0.4,0.5,0.6,0.7") from None
    if len(set(values)) < 2 or not all(0 < v <= 1 for v in values):
        raise AutoCompressError(f"--budgets {text!r} needs two or more distinct fractions in "
                                "(0, 1]", "e.g. --budgets 0.3,0.4,0.5,0.6,0.7")
    return sorted(set(values), reverse=True)


def many_targets_mode(targets: list[str], budgets: str | None, budget_fraction: float | None,
                      limits: Limits, method: str, baseline: bool) -> list[float] | None:
    """Check the combination of --target (repeated), --budgets and the single-run options;
    the family's fractions (None: not a family)."""
    from autocompress.costmodel import Target

    for name in targets:
        Target.parse(name)  # an unknown target: one line before Prefect starts
    if len(set(targets)) != len(targets):
        raise AutoCompressError(f"a --target is given twice: {targets}", "give each target once")
    many = len(targets) > 1 or budgets is not None
    if many and (method != "autocompress" or baseline):
        raise AutoCompressError("--method and --baseline apply to a single-target run",
                                "drop them, or run one --target without --budgets")
    if budgets is None:
        if len(targets) > 1 and limits.is_empty() and budget_fraction is None:
            raise AutoCompressError("no limit to compress for",
                                    "give --budget-fraction 0.5 (of the teacher's cost on each "
                                    "target) or a limit every target must meet")
        return None
    if len(targets) > 1:
        raise AutoCompressError("--budgets takes one --target",
                                "run the family once per target")
    if budget_fraction is not None:
        raise AutoCompressError("give --budgets or --budget-fraction, not both",
                                "--budgets 0.3,0.5,0.7 already sets each member's limit")
    return parse_budgets(budgets)


def _prepare_environment() -> None:
    # Prefect creates its home without parents and then fails to open its database:
    # on a fresh clone $PREFECT_HOME (.autocompress/prefect) has no parent yet.
    prefect_home = os.environ.get("PREFECT_HOME")
    if prefect_home:
        os.makedirs(os.path.expanduser(prefect_home), exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _metrics_of(outputs: dict[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for name in names:
        ref = outputs.get(name)
        if ref is not None and hasattr(ref, "metrics"):
            merged.update(ref.metrics)
    return merged


def results_table(outputs: dict[str, Any]) -> Table:
    """Teacher vs compressed (vs baseline): one row per metric, one column per model."""
    models = {label: _metrics_of(outputs, names) for label, names in _ROWS.items()}
    models = {label: m for label, m in models.items() if m}
    table = Table(title="AutoCompress results (predicted_* = cost model, others measured)")
    table.add_column("metric")
    for label in models:
        table.add_column(label, justify="right")
    for metric in _COLUMNS:
        if any(metric in m for m in models.values()):
            name = "meets limits" if metric == "ok" else metric
            table.add_row(name, *(_fmt(m.get(metric), metric) for m in models.values()))
    return table


def keyed_table(outputs: dict[str, Any]) -> Table | None:
    """One row per target (joint run) or budget (family): each ``verification.KEY`` with
    the architecture and scores of ``arch.KEY`` / ``evaluation.KEY`` (else the shared ones)."""
    keys = [name.removeprefix("verification.") for name in outputs
            if name.startswith("verification.")]
    if not keys:
        return None
    table = Table(title="per target / budget (predicted_* = cost model, others measured)")
    columns = ["params", "mc_mean", "predicted_tpot_ms", "tpot_ms", "predicted_ttft_ms",
               "ttft_ms", "ok"]
    for column in ["", *columns]:
        table.add_column("meets limits" if column == "ok" else column, justify="right")
    for key in keys:
        names = tuple(f"{n}.{key}" if f"{n}.{key}" in outputs else n
                      for n in ("arch", "evaluation")) + (f"verification.{key}",)
        metrics = _metrics_of(outputs, names)
        table.add_row(key, *(_fmt(metrics.get(c), c) for c in columns))
    return table


def _fmt(value: float | None, column: str = "") -> str:
    if value is None:
        return "–"
    if column == "ok":
        return "yes" if value else "NO"
    if column == "params":
        return f"{value / 1e6:.2f}M"
    return f"{value:.4g}"


def print_report(report, wall_s: float) -> None:
    """The final table, the stages (cached or run), timings and where to look."""
    console.print(results_table(report.outputs))
    keyed = keyed_table(report.outputs)
    if keyed is not None:
        console.print(keyed)
    steps = Table(title="stages")
    for column in ("stage", "state", "seconds"):
        steps.add_column(column)
    for step in report.steps:
        steps.add_row(step.name, step.state, f"{step.seconds:.1f}")
    console.print(steps)
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    overhead = max(0.0, wall_s - report.stage_work_s)
    startup = max(0.0, wall_s - report.wall_s)
    console.print(
        f"wall {wall_s:.1f}s: stage work {report.stage_work_s:.1f}s; Prefect+MLflow "
        f"{overhead:.1f}s ({100 * overhead / wall_s:.1f}%) = start-up and imports "
        f"{startup:.1f}s + inside the flow {report.overhead_s:.1f}s (MLflow calls "
        f"{report.tracking_s:.1f}s)")
    registered = report.outputs.get("registered")
    if registered is not None:
        console.print(f"registered [bold]{registered.name}@{registered.version}[/bold] — "
                      f"`autocompress lineage {registered.name}@{registered.version}`")
    if report.tracking_uri:
        console.print(f"MLflow: run {report.mlflow_run_id} in {report.tracking_uri} — "
                      f"`mlflow ui --backend-store-uri {report.tracking_uri}`")
    console.print(f"artifacts: {report.store_uri}")


def lineage_command(
    model: str = typer.Argument(..., help="NAME, NAME@VERSION or NAME@ALIAS of a registered "
                                "model (latest version when no version is given)."),
    no_check: bool = typer.Option(False, "--no-check", help="Do not re-hash the artifacts."),
    json_out: bool = typer.Option(False, "--json", help="Print the lineage as JSON."),
) -> None:
    """Show where a registered model came from and re-check every artifact's hash.

    Exits with code 1 when an artifact is missing or its content changed.
    """
    from autocompress.tracking import lineage, parse_model_ref

    name, version = parse_model_ref(model)
    report = lineage(name, version, check=not no_check)
    if json_out:
        typer.echo(report.model_dump_json(indent=1))
    else:
        _print_lineage(report)
    if not no_check and not report.ok:
        raise typer.Exit(1)


def _print_lineage(report) -> None:
    info = report.lineage
    console.print(f"[bold]{report.name}@{report.version}[/bold]  (MLflow {report.tracking_uri}, "
                  f"run {report.run_id}, model {report.model_id})")
    facts = Table(show_header=False, box=None)
    facts.add_column(style="dim")
    facts.add_column()
    for key in ("teacher", "teacher_sha256", "data_fingerprint", "costmodel_version", "target",
                "workload", "flow_run_id", "trigger_event", "code_version"):
        value = getattr(info, key)
        if value is not None:
            facts.add_row(key, str(value))
    for group in ("limits", "costmodel_error", "scores", "measured"):
        values = getattr(info, group)
        if values:
            facts.add_row(group, ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}"
                                           for k, v in values.items()))
    console.print(facts)
    chain = Table(title="chain (teacher → registered model)")
    for column in ("stage", "kind", "sha256", "status", "uri"):
        chain.add_column(column)
    colors = {"ok": "green", "unchecked": "dim"}
    for link in report.chain:
        color = colors.get(link.status, "red")
        chain.add_row(link.stage, link.kind, link.sha256[:12],
                      f"[{color}]{link.status}[/{color}]", link.uri)
    console.print(chain)
    for problem in report.problems:
        console.print(f"[red]unreachable:[/red] {escape(problem)}")
    if not report.chain:
        raise AutoCompressError("this model version has no artifact chain in its tags")
