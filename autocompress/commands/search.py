"""CLI for the search area: `autocompress search` and `autocompress baseline minitron`."""

from __future__ import annotations

from pathlib import Path

import typer

from autocompress.commands import MODEL_HELP
from autocompress.commands.aliases import aliased, as_list, renamed, setting
from autocompress.commands.limit_options import (
    LIMIT_ALIASES,
    NO_LIMITS,
    budget_fraction_option,
    limit_options,
)
from autocompress.commands.settings import config_option, load_settings
from autocompress.defaults import DEFAULT_TARGET, DEFAULT_WORKLOAD
from autocompress.limits import Limits

TARGET_HELP = (
    "Deployment target HARDWARE/ENGINE/DTYPE (dtype optional), e.g. cpu-local/hf-eager/fp32 or "
    "h100-sxm/vllm/bf16 (`autocompress costmodel targets` lists them). A fitted cost model "
    "is used when `autocompress costmodel fit` saved one, else the analytic one."
)
WORKLOAD_HELP = (
    "Workload preset: local-coding-cpu, datacenter-cpu, interactive-cpu (measurable here) or "
    "local-coding, datacenter, interactive (GPU scale)."
)
DATA_HELP = "Corpus directory (its calibration split). Default: the stdlib corpus."
SEARCH_CONFIG_EXAMPLE = (
    "Keys of SearchConfig, e.g. dnas.steps=160, dnas.seed=0, dnas.start=greedy|uniform, "
    "score=measured|probability, selection.top_k=10, minitron.distill_tokens=32768, "
    "space.granularity=16, space.head_fractions=[1,0.5], space.export_engine=vllm|target, "
    "threads=2; work_dir=DIR (checkpoints; default .<out stem>.search-work beside --out)."
)
MINITRON_CONFIG_EXAMPLE = (
    "Keys of SearchConfig, e.g. minitron.max_depth_drop=0, minitron.top_k=10, "
    "minitron.distill_tokens=32768, space.granularity=16."
)

# Old spellings (one release): the model flag, and the settings that moved to --config.
SEARCH_ALIASES = {
    **LIMIT_ALIASES,
    "--teacher": renamed("--model"), "-t": renamed("--model"),
    "--steps": setting("dnas.steps"), "--batch-size": setting("dnas.batch_size"),
    "--seq-len": setting("dnas.seq_len"), "--seed": setting("dnas.seed"),
    "--dnas-start": setting("dnas.start"), "--score": setting("score"),
    "--granularity": setting("space.granularity"),
    "--ffn-granularity": setting("space.ffn_granularity"),
    "--head-fractions": setting("space.head_fractions", convert=as_list),
    "--protect-first-last": setting("space.protect_first_last", "true"),
    "--no-protect-first-last": setting("space.protect_first_last", "false"),
    "--export-engine": setting("space.export_engine"), "--threads": setting("threads"),
    "--top-k": setting("selection.top_k"), "--distill-tokens": setting("minitron.distill_tokens"),
    "--work-dir": setting("work_dir"),
}
MINITRON_ALIASES = {
    **LIMIT_ALIASES,
    "--teacher": renamed("--model"), "-t": renamed("--model"),
    "--max-depth-drop": setting("minitron.max_depth_drop"),
    "--top-k": setting("minitron.top_k"), "--distill-tokens": setting("minitron.distill_tokens"),
    "--granularity": setting("space.granularity"),
}


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("search", cls=aliased(SEARCH_ALIASES))(limit_options(search_command))
    baseline = typer.Typer(help="Baseline architectures to compare the search against.",
                           no_args_is_help=True)
    baseline.command("minitron", cls=aliased(MINITRON_ALIASES))(limit_options(minitron_command))
    app.add_typer(baseline, name="baseline")


def _search_settings():
    """SearchConfig plus ``work_dir``, the one setting of the command itself."""
    from autocompress.arch_search.config import SearchConfig

    class SearchSettings(SearchConfig):
        work_dir: Path | None = None

    return SearchSettings


def _parse_count(text: str) -> int:
    """``7000000``, ``7M``, ``750k``, ``1.5B`` -> an integer."""
    from autocompress.errors import AutoCompressError

    raw = text.strip().lower().replace("_", "").replace(",", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}.get(raw[-1:], 1.0)
    try:
        value = float(raw[:-1] if raw[-1:] in "kmbg" else raw) * scale
    except ValueError:
        raise AutoCompressError(f"cannot read parameter count {text!r}",
                                hint="write e.g. 3500000, 3.5M or 800k") from None
    if value < 1:
        raise AutoCompressError(f"parameter count {text!r} must be positive")
    return int(value)


def _print_result(report: dict, out: Path, what: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from autocompress.limits import LIMIT_OF_METRIC

    console = Console()
    arch = report["arch"]
    table = Table(title=f"{what}: hidden {arch['hidden_size']}, {len(arch['layers'])} layers, "
                  f"{report['params']:,} parameters (teacher {report['teacher_params']:,})")
    for column in ("layer", "attention (q/kv heads)", "FFN width"):
        table.add_column(column, justify="right")
    for i, layer in enumerate(arch["layers"]):
        att, ffn = layer["attention"], layer["ffn"]
        table.add_row(str(i), f"{att['num_heads']}/{att['num_kv_heads']}" if att else "—",
                      str(ffn["intermediate_size"]) if ffn else "—")
    console.print(table)
    predicted = report.get("predicted")
    if predicted:
        limits = Table(title=f"predicted on {report['target']} ({report['workload']['name']})")
        for column in ("metric", "predicted", "teacher", "limit", "margin"):
            limits.add_column(column, justify="right")
        margins = report.get("margins", {})
        teacher = report.get("teacher_predicted") or {}
        for metric, name in LIMIT_OF_METRIC.items():
            limit = report.get("limits", {}).get(name)
            margin = margins.get(metric)
            limits.add_row(metric, f"{predicted[metric]:.4g}",
                           f"{teacher[metric]:.4g}" if metric in teacher else "",
                           f"{limit:.4g}" if limit is not None else "",
                           f"{100 * margin:+.2f}%" if margin is not None else "")
        console.print(limits)
    console.print(f"wrote {out} and {out.with_name(out.stem + '.search.json')}")


def search_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    target: str = typer.Option(DEFAULT_TARGET, "--target", help=TARGET_HELP),
    workload: str = typer.Option(DEFAULT_WORKLOAD, "--workload", "-w", help=WORKLOAD_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="ArchSpec JSON to write."),
    limits: Limits = NO_LIMITS,
    budget_fraction: float | None = budget_fraction_option(),
    importance: Path | None = typer.Option(
        None, "--importance", "-i",
        help="Importance file (`autocompress importance`); computed on calibration data if "
        "omitted."),
    data: Path | None = typer.Option(None, "--data", help=DATA_HELP),
    config: list[str] = config_option(SEARCH_CONFIG_EXAMPLE),
) -> None:
    """Search the architecture that keeps the most quality within the limits on a target.

    Differentiable search (Gumbel-softmax over nested-importance masks of the teacher, KL to
    the teacher + augmented Lagrangian on the cost model's expected costs), then an exact
    repair: the written ArchSpec meets every limit under the cost model. Also writes
    <stem>.search.json (predicted costs, margins), <stem>.trajectory.json and .png.
    Prune it with `autocompress prune --arch`. An interrupted search resumes from its
    work_dir.
    """
    from autocompress.arch_search.config import SearchConfig
    from autocompress.arch_search.context import SearchContext
    from autocompress.arch_search.run import search_to_file
    from autocompress.atomic import check_out_file

    settings = load_settings(_search_settings(), config, "search")
    search_config = SearchConfig.model_validate(settings.model_dump(exclude={"work_dir"}))
    if search_config.space.export_engine == "target":  # the --target's own engine
        from autocompress.engine_rules import engine_for_target

        engine = engine_for_target(target.split("/")[1] if "/" in target else "")
        search_config.space.export_engine = engine
    check_out_file(out)
    ctx = SearchContext.build(model, target, workload, search_config, importance=importance,
                              corpus_dir=data, limits=limits, budget_fraction=budget_fraction)
    limits = ctx.resolve_limits(limits, budget_fraction)
    report = search_to_file(ctx, limits, out, search_config, work_dir=settings.work_dir)
    _print_result(report, out, "searched architecture")


def minitron_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="ArchSpec JSON to write."),
    params: str | None = typer.Option(
        None, "--params", help="Parameter target, e.g. 3.5M (ModelOpt-style Minitron)."),
    match_target: str | None = typer.Option(
        None, "--match-target",
        help="Matched mode: the largest homogeneous model meeting the limits on this target "
        "(" + TARGET_HELP + ")"),
    workload: str | None = typer.Option(None, "--workload", "-w", help=WORKLOAD_HELP),
    limits: Limits = NO_LIMITS,
    budget_fraction: float | None = budget_fraction_option(),
    importance: Path | None = typer.Option(
        None, "--importance", "-i", help="Importance file; computed if omitted."),
    data: Path | None = typer.Option(None, "--data", help=DATA_HELP),
    config: list[str] = config_option(MINITRON_CONFIG_EXAMPLE),
) -> None:
    """Minitron baseline: homogeneous pruning (same width/heads in every layer, optional depth).

    --params N picks, among the homogeneous candidates with at most N parameters, the top-k
    closest to N and keeps the one with the lowest KL to the teacher on calibration data after
    a short distillation of each. --match-target T --workload W with limits does the same among
    the candidates that meet the limits, each timed on the target where this machine can time
    it: the fair hardware-matched comparison for `autocompress search`.
    """
    from autocompress.arch_search.config import SearchConfig
    from autocompress.arch_search.context import SearchContext
    from autocompress.arch_search.run import minitron_to_file
    from autocompress.atomic import check_out_file
    from autocompress.errors import AutoCompressError

    if (params is None) == (match_target is None):
        raise AutoCompressError("give exactly one of --params and --match-target",
                                hint="--params 3.5M, or --match-target T --workload W --limit ...")
    if match_target is not None and workload is None:
        raise AutoCompressError("--match-target needs --workload", hint=WORKLOAD_HELP)
    search_config = load_settings(SearchConfig, config, "baseline minitron")
    check_out_file(out)
    ctx = SearchContext.build(model, match_target, workload if match_target else None,
                              search_config, importance=importance, corpus_dir=data)
    if params is not None:
        report = minitron_to_file(ctx, out, params=_parse_count(params), config=search_config,
                                  progress=True)
    else:
        limits = ctx.resolve_limits(limits, budget_fraction)
        report = minitron_to_file(ctx, out, limits=limits, config=search_config, progress=True)
    _print_result(report, out, f"Minitron ({report['mode']})")
