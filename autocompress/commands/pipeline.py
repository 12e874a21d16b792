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
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autocompress.commands import format_option, print_json
from autocompress.commands.aliases import (
    PRINT_JSON,
    Alias,
    aliased,
    deprecation_line,
    model_or_positional,
    old_positional,
    renamed,
    setting,
)
from autocompress.commands.limit_options import LIMIT_ALIASES, NO_LIMITS, limit_options
from autocompress.commands.settings import config_option, load_settings, read_entries
from autocompress.defaults import (
    DEFAULT_METHOD,
    DEFAULT_TARGET,
    DEFAULT_TEACHER,
    DEFAULT_WORKLOAD,
    METHODS,
)
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.lineage_view import headline, stage_lines
from autocompress.profiles import PROFILES, get_profile

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


RUN_CONFIG_EXAMPLE = (
    "Keys: the flow's stages (costmodel, validation, importance, search, distill, verify: "
    "each its config's settings, e.g. search.dnas.steps=80, distill.tokens=60000) and the "
    "run's own: eval_tasks=local, eval_limit=N (items per benchmark, for quick runs), "
    "register_as=NAME (null: do not register), experiment=NAME (MLflow), track=false (no "
    "MLflow), store=DIR|s3://bucket/prefix (default $AUTOCOMPRESS_STORE), "
    "refresh_cache=true (recompute every stage), profile=" + "|".join(PROFILES)
    + " (size every stage at once: each stage's defaults, the demo's sizes, or a tiny run "
    "that fits a test)."
)
MODEL_HELP_RUN = ("The teacher to compress: a named teacher (`default`, `smollm2-135m`), a "
                  "model directory, a hub id, or models:/NAME/VERSION from the MLflow registry.")
BUDGET_HELP = (
    "Set a limit at this fraction of the teacher's predicted cost on the workload's main "
    "metric (0.5 = half the teacher's TPOT on interactive-cpu); combines with --limit. A "
    "comma list (0.3,0.5,0.7) is a Pareto family from one search: one model per budget, "
    "each verified on the target."
)

# Old spellings (one release): the model, the stage options, and the run's own settings
# that moved into --config.
RUN_ALIASES = {
    **LIMIT_ALIASES,
    "--teacher": renamed("--model"),
    "--options": Alias("--config", convert=lambda text: text.removeprefix("@")),
    "--eval-tasks": setting("eval_tasks"), "--eval-limit": setting("eval_limit"),
    "--register-as": setting("register_as"), "--no-register": setting("register_as", "null"),
    "--store": setting("store"), "--experiment": setting("experiment"),
    "--no-track": setting("track", "false"), "--refresh-cache": setting("refresh_cache", "true"),
}


class RunSettings(BaseModel):
    """The run's own settings in ``--config`` (beside the stages' settings)."""

    model_config = ConfigDict(extra="forbid")

    eval_tasks: str | None = None
    eval_limit: int | None = Field(None, ge=1)
    register_as: str | None = "autocompress-compressed"
    experiment: str = "autocompress"
    track: bool = True
    store: str | None = None
    refresh_cache: bool = False
    profile: str | None = None  # a name in autocompress.profiles.PROFILES


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``lineage`` to the main app."""
    app.command("run", cls=aliased(RUN_ALIASES))(limit_options(run_command))
    app.command("lineage", cls=aliased(PRINT_JSON))(lineage_command)


def run_command(
    model: str = typer.Option(DEFAULT_TEACHER, "--model", "-m", help=MODEL_HELP_RUN),
    target: list[str] = typer.Option(
        [DEFAULT_TARGET], "--target", help="Hardware/engine/dtype the model must run on; "
        "repeat it for one architecture that meets every target's limits (a joint search)."),
    workload: str = typer.Option(DEFAULT_WORKLOAD, "--workload", "-w",
                                 help="Workload preset name (`autocompress costmodel presets`)."),
    limits: Limits = NO_LIMITS,
    budget_fraction: str | None = typer.Option(None, "--budget-fraction", help=BUDGET_HELP),
    method: str = typer.Option(
        DEFAULT_METHOD, "--method", help="How the architecture is found: autocompress (the "
        "search), greedy (repair from the teacher, no DNAS), random (random search, as many "
        "scored architectures as the search), minitron (the fair homogeneous baseline), "
        "minitron-scored (its homogeneous grid through greedy's selection) or mip (block "
        "scores solved exactly as an integer program)."),
    baseline: bool = typer.Option(False, "--baseline",
                                  help="Also run the Minitron baseline for comparison."),
    seed: int | None = typer.Option(None, "--seed", help="Search and distillation seed "
                                    "(default: the stages' own, else 0)."),
    config: list[str] = config_option(RUN_CONFIG_EXAMPLE),
    budgets: str | None = typer.Option(None, "--budgets", hidden=True),
) -> None:
    """Compress a teacher to meet the limits on a target (the full Prefect flow).

    Re-running with the same settings reuses every finished stage; a failed run
    continues where it stopped. Results go to the artifact store and MLflow
    (embedded sqlite under $AUTOCOMPRESS_HOME unless MLFLOW_TRACKING_URI is set).
    """
    fraction, family = _fraction_or_family(budget_fraction, budgets)
    # The request's shape first: a usage error must not wait for the stages' configs,
    # whose modules import torch (seconds).
    check_request(target, family, fraction, limits, method, baseline)
    from autocompress.stage_config import STAGE_CONFIGS

    entries = read_entries(config)
    stages = {key: value for key, value in entries.items() if key in STAGE_CONFIGS}
    own = load_settings(RunSettings, [], "run",
                        base={k: v for k, v in entries.items() if k not in STAGE_CONFIGS},
                        takes=", ".join([*STAGE_CONFIGS, *RunSettings.model_fields]))
    run(teacher=model, target=target, workload=workload, limits=limits,
        budget_fraction=fraction, budgets=family, baseline=baseline, method=method,
        seed=seed, eval_tasks=own.eval_tasks, eval_limit=own.eval_limit,
        register_as=own.register_as or "", no_register=own.register_as is None,
        store=own.store, experiment=own.experiment, no_track=not own.track,
        refresh_cache=own.refresh_cache, options=stages, profile=own.profile)


def _fraction_or_family(text: str | None, old_budgets: str | None
                        ) -> tuple[float | None, str | None]:
    """``--budget-fraction``: one fraction, or a comma list (a family's budgets).

    ``--budgets``, the family's own option before, still gives a family for one release
    (with --budget-fraction beside it, ``run`` refuses the pair, as it always did).
    """
    if old_budgets is not None:
        typer.echo(deprecation_line("--budgets", renamed("--budget-fraction")), err=True)
        if text is not None and "," in text:
            raise AutoCompressError("two families of budgets are given",
                                    "give one: --budget-fraction 0.3,0.5,0.7")
        single, _ = _fraction_or_family(text, None)
        return single, old_budgets
    if text is None:
        return None, None
    if "," in text:
        return None, text
    try:
        return float(text), None
    except ValueError:
        raise AutoCompressError(f"--budget-fraction {text!r} is not a number",
                                "e.g. --budget-fraction 0.5, or 0.3,0.5,0.7 for a family") from None


def run(*, teacher: str = DEFAULT_TEACHER, target: list[str] | None = None,
        workload: str = DEFAULT_WORKLOAD, limits: Limits = NO_LIMITS,
        budget_fraction: float | None = None, budgets: str | None = None,
        baseline: bool = False, method: str = DEFAULT_METHOD, seed: int | None = None,
        eval_tasks: str | None = None, eval_limit: int | None = None,
        register_as: str = "autocompress-compressed", no_register: bool = False,
        store: str | None = None, experiment: str = "autocompress", no_track: bool = False,
        refresh_cache: bool = False, options: str | dict | None = None,
        profile: str | None = None) -> None:
    """The run behind ``autocompress run`` (and ``demo``), in the CLI's own words.

    ``options`` is the stages' settings: a dict, or JSON text / ``@FILE`` as the flows take;
    ``profile`` sizes every stage at once (``autocompress.profiles``; a single target only).
    """
    target = target or [DEFAULT_TARGET]
    started = time.perf_counter()
    fractions = check_request(target, budgets, budget_fraction, limits, method, baseline)
    get_profile(profile)  # an unknown name fails here, in one line
    if profile is not None and (fractions is not None or len(target) > 1):
        raise AutoCompressError("profile= sizes a single-target run",
                                "drop it, or run one --target at one budget")
    if not no_register:  # a bad name fails here, not after hours of compression
        from autocompress.tracking import check_registry_name

        check_registry_name(register_as)
    from autocompress.stage_config import check_options, parse_options

    # Every stage's settings are checked before any stage runs.
    stage_options = (check_options(options) if isinstance(options, dict)
                     else parse_options(options))
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
                      experiment=experiment, track=not no_track, options=stage_options,
                      profile=profile)
    print_report(report, time.perf_counter() - started)


def parse_budgets(text: str) -> list[float]:
    """A family's budgets ``0.3,0.5,0.7`` -> fractions (each in (0, 1], two or more)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AutoCompressError(f"budgets {text!r} are not a comma-separated list of numbers",
                                "e.g. --budget-fraction 0.3,0.4,0.5,0.6,0.7") from None
    if len(set(values)) < 2 or not all(0 < v <= 1 for v in values):
        raise AutoCompressError(f"a family of budgets {text!r} needs two or more distinct "
                                "fractions in (0, 1]", "e.g. --budget-fraction 0.3,0.5,0.7")
    return sorted(set(values), reverse=True)


def check_request(targets: list[str], budgets: str | None, budget_fraction: float | None,
                  limits: Limits, method: str, baseline: bool) -> list[float] | None:
    """Check the method, the limits, the targets and how --target (repeated), a family of
    budgets and the single-run options combine, before Prefect starts (one line, exit 2);
    the family's fractions (None: not a family)."""
    from autocompress.costmodel import Target

    if method not in METHODS:
        raise AutoCompressError(f"unknown --method {method!r}", f"use one of {', '.join(METHODS)}")
    if len(set(targets)) != len(targets):
        raise AutoCompressError(f"a --target is given twice: {targets}", "give each target once")
    fractions = _budgets_of(targets, budgets, budget_fraction, limits, method, baseline)
    # Last: on a fresh machine the first parse of cpu-local measures the CPU (seconds),
    # which no other mistake should wait for.
    for name in targets:
        Target.parse(name)
    return fractions


def _budgets_of(targets: list[str], budgets: str | None, budget_fraction: float | None,
                limits: Limits, method: str, baseline: bool) -> list[float] | None:
    many = len(targets) > 1 or budgets is not None
    if many and (method != "autocompress" or baseline):
        raise AutoCompressError("--method and --baseline apply to a single-target run",
                                "drop them, or run one --target at one budget")
    if budgets is None:
        if limits.is_empty() and budget_fraction is None:
            raise AutoCompressError("no limit to compress for", (
                "give --budget-fraction 0.5 (of the teacher's cost on each target) or a limit "
                "every target must meet" if len(targets) > 1 else
                "give a limit (e.g. --limit tpot=3) or --budget-fraction 0.6"))
        return None
    if len(targets) > 1:
        raise AutoCompressError("a family of budgets takes one --target",
                                "run the family once per target")
    if budget_fraction is not None:
        raise AutoCompressError("give a family of budgets or one --budget-fraction, not both",
                                "the family (0.3,0.5,0.7) already sets each member's limit")
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


def stages_line(steps) -> str:
    """The stages in one line (each had its own line as it ended): how many ran, how many
    came from the cache, the slowest three."""
    ran = [step for step in steps if step.state != "Cached"]
    slowest = sorted(ran, key=lambda step: -step.seconds)[:3]
    return (f"stages: {len(ran)} ran, {len(steps) - len(ran)} cached"
            + ("; slowest " + ", ".join(f"{s.name} {s.seconds:.1f} s" for s in slowest)
               if slowest else ""))


def print_report(report, wall_s: float) -> None:
    """The final table, the stages (cached or run), timings and where to look."""
    console.print(results_table(report.outputs))
    keyed = keyed_table(report.outputs)
    if keyed is not None:
        console.print(keyed)
    console.print(stages_line(report.steps), soft_wrap=True)
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}", soft_wrap=True)
    overhead = max(0.0, wall_s - report.stage_work_s)
    startup = max(0.0, wall_s - report.wall_s)
    console.print(  # one line each, however narrow the log (soft_wrap)
        f"wall {wall_s:.1f}s: stage work {report.stage_work_s:.1f}s; Prefect+MLflow "
        f"{overhead:.1f}s ({100 * overhead / wall_s:.1f}%) = start-up and imports "
        f"{startup:.1f}s + inside the flow {report.overhead_s:.1f}s (MLflow calls "
        f"{report.tracking_s:.1f}s)", soft_wrap=True)
    registered = report.outputs.get("registered")
    if registered is not None:
        console.print(f"registered [bold]{registered.name}@{registered.version}[/bold] — "
                      f"`autocompress lineage --model {registered.name}@{registered.version}`",
                      soft_wrap=True)
    if report.tracking_uri:
        console.print(f"MLflow: run {report.mlflow_run_id} in {report.tracking_uri} — "
                      f"`mlflow ui --backend-store-uri {report.tracking_uri}`", soft_wrap=True)
    console.print(f"artifacts: {report.store_uri}", soft_wrap=True)


def lineage_command(
    model: str = typer.Option(None, "--model", "-m", help="NAME, NAME@VERSION or NAME@ALIAS "
                              "of a registered model (latest version when no version is "
                              "given). Required."),
    no_check: bool = typer.Option(False, "--no-check", help="Do not re-hash the artifacts."),
    fmt: str = format_option("the lineage"),
    old_model: str = old_positional(),
) -> None:
    """Show where a registered model came from and re-check every artifact's hash.

    Exits with code 1 when an artifact is missing or its content changed.
    """
    from autocompress.tracking import lineage, parse_model_ref

    name, version = parse_model_ref(model_or_positional(model, old_model))
    report = lineage(name, version, check=not no_check)
    if print_json(fmt):
        typer.echo(report.model_dump_json(indent=1))
    else:
        _print_lineage(report)
    if not no_check and not report.ok:
        raise typer.Exit(1)


def lineage_tree(report) -> list[str]:
    """The lineage as the model version's description says it: the headline, then a
    branch per stage (teacher → ... → verify, its key figures) and under it the artifact
    and its check. Plain lines, not a rich Tree: rich crops a tree at 80 columns in a
    log, and a log should keep every URI whole."""
    status = {link.stage: link.status for link in report.chain}
    colors = {"ok": "green", "unchecked": "bright_black"}
    stages = stage_lines(report.lineage)
    lines = [headline(report.lineage)]
    for index, line in enumerate(stages):
        last = index == len(stages) - 1
        figures = f": {line.figures}" if line.figures else ""
        check = status.get(line.stage, "unknown")
        lines.append(f"{'└─' if last else '├─'} {typer.style(line.title, bold=True)}{figures}")
        lines.append(f"{'  ' if last else '│ '}   {typer.style(check, fg=colors.get(check, 'red'))}"
                     f" {line.stage} {line.sha256[:12]} {line.uri}")
    return lines


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
    for line in lineage_tree(report):
        typer.echo(line)
    for problem in report.problems:
        console.print(f"[red]unreachable:[/red] {escape(problem)}")
    if not report.chain:
        raise AutoCompressError("this model version has no artifact chain in its tags")
