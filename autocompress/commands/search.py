"""CLI for the search area: `autocompress search` and `autocompress baseline minitron`."""

from __future__ import annotations

from pathlib import Path

import typer

from autocompress.commands.limit_options import NO_LIMITS, budget_fraction_option, limit_options
from autocompress.limits import Limits

TEACHER_HELP = "Teacher model directory (Llama, Mistral, Qwen2, Qwen3), or `default`."
TARGET_HELP = (
    "Deployment target HARDWARE/ENGINE/DTYPE (dtype optional), e.g. cpu-local/hf-eager/fp32 or "
    "h100-sxm/vllm/bf16 (`autocompress costmodel targets` lists them). A fitted cost model "
    "is used when `autocompress costmodel fit` saved one, else the analytic one."
)
WORKLOAD_HELP = (
    "Workload preset: local-coding-cpu, datacenter-cpu, interactive-cpu (measurable here) or "
    "local-coding, datacenter, interactive (GPU scale)."
)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("search")(limit_options(search_command))
    baseline = typer.Typer(help="Baseline architectures to compare the search against.",
                           no_args_is_help=True)
    baseline.command("minitron")(limit_options(minitron_command))
    app.add_typer(baseline, name="baseline")


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


def _fractions(text: str) -> list[float]:
    from autocompress.errors import AutoCompressError

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 < v <= 1 for v in values):
        raise AutoCompressError(f"cannot read fractions {text!r}",
                                hint="write a comma list of numbers in (0, 1], e.g. 1,0.5")
    return values


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
    teacher: str = typer.Option(..., "--teacher", "-t", help=TEACHER_HELP),
    target: str = typer.Option("cpu-local/hf-eager/fp32", "--target", help=TARGET_HELP),
    workload: str = typer.Option("interactive-cpu", "--workload", "-w", help=WORKLOAD_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="ArchSpec JSON to write."),
    limits: Limits = NO_LIMITS,
    budget_fraction: float | None = budget_fraction_option(),
    importance: Path | None = typer.Option(
        None, "--importance", "-i",
        help="Importance file (`autocompress importance`); computed on calibration data if "
        "omitted."),
    data: Path | None = typer.Option(
        None, "--data", help="Corpus directory (calibration split). Default: the stdlib corpus."),
    steps: int = typer.Option(160, help="Search steps (one calibration batch each)."),
    batch_size: int = typer.Option(4, help="Sequences per search step."),
    seq_len: int = typer.Option(128, help="Tokens per sequence in the search."),
    score: str = typer.Option(
        "measured", help="Repair scores: `measured` (KL change of each single option around "
        "the search's argmax) or `probability` (the search's log-probabilities)."),
    granularity: int = typer.Option(16, help="Hidden sizes and FFN widths are multiples of this."),
    ffn_granularity: int | None = typer.Option(
        None, help="FFN widths are multiples of this instead (256 for the nemotron-nas "
        "ffn_mult export)."),
    head_fractions: str = typer.Option(
        "1,0.75,0.5,0.25",
        help="Query heads kept per KV head, as fractions of its cluster (comma list). `1` keeps "
        "every query head and only varies KV groups (exportable to nemotron-nas)."),
    protect_first_last: bool = typer.Option(
        True, "--protect-first-last/--no-protect-first-last",
        help="Keep both blocks of the first and last layers."),
    export_engine: str | None = typer.Option(
        None, help="Propose only what this engine computes exactly from `export --format "
        "nemotron-nas`: vllm, trtllm, llama.cpp, hf, or `target` (the --target's engine)."),
    work_dir: Path | None = typer.Option(
        None, help="Checkpoint directory; an interrupted search resumes from it. "
        "Default: .<out stem>.search-work beside --out."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    seed: int = typer.Option(0, help="Seed of the Gumbel noise and the batch order."),
    dnas_start: str = typer.Option(
        "greedy", help="Where DNAS starts: `greedy` (repair from the teacher with every "
        "option scored there; needs --score measured) or `uniform`."),
    top_k: int = typer.Option(
        10, "--top-k", help="Final pick: this many distinct candidates (every depth's best "
        "first) each get the baseline's short distillation; the lowest KL wins. 1 = repair's "
        "answer, ranked right after pruning."),
    distill_tokens: int = typer.Option(
        32_768, help="Tokens of that short distillation (the baseline's default; 0 = rank by "
        "KL right after pruning)."),
) -> None:
    """Search the architecture that keeps the most quality within the limits on a target.

    Differentiable search (Gumbel-softmax over nested-importance masks of the teacher, KL to
    the teacher + augmented Lagrangian on the cost model's expected costs), then an exact
    repair: the written ArchSpec meets every limit under the cost model. Also writes
    <stem>.search.json (predicted costs, margins), <stem>.trajectory.json and .png.
    Prune it with `autocompress prune --arch`.
    """
    from autocompress.arch_search.dnas import DNASConfig
    from autocompress.arch_search.minitron import MinitronConfig
    from autocompress.arch_search.run import SearchConfig, SearchContext, search_to_file
    from autocompress.arch_search.selection import SelectionConfig
    from autocompress.arch_search.space import SpaceConfig
    from autocompress.atomic import check_out_file
    from autocompress.errors import AutoCompressError

    if score not in ("measured", "probability"):
        raise AutoCompressError(f"unknown --score {score!r}", hint="use measured or probability")
    if dnas_start not in ("greedy", "uniform"):
        raise AutoCompressError(f"unknown --dnas-start {dnas_start!r}",
                                hint="use greedy or uniform")
    if export_engine == "target":
        from autocompress.engine_rules import engine_for_target

        export_engine = engine_for_target(target.split("/")[1] if "/" in target else "")
    config = SearchConfig(
        space=SpaceConfig(granularity=granularity, ffn_granularity=ffn_granularity,
                          head_fractions=_fractions(head_fractions),
                          protect_first_last=protect_first_last, export_engine=export_engine),
        dnas=DNASConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, seed=seed,
                        start=dnas_start),
        score=score, threads=threads, selection=SelectionConfig(top_k=top_k),
        minitron=MinitronConfig(distill_tokens=distill_tokens),
    )
    check_out_file(out)
    ctx = SearchContext.build(teacher, target, workload, config, importance=importance,
                              corpus_dir=data)
    limits = ctx.resolve_limits(limits, budget_fraction)
    report = search_to_file(ctx, limits, out, config, work_dir=work_dir)
    _print_result(report, out, "searched architecture")


def minitron_command(
    teacher: str = typer.Option(..., "--teacher", "-t", help=TEACHER_HELP),
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
    data: Path | None = typer.Option(
        None, "--data", help="Corpus directory (calibration split). Default: the stdlib corpus."),
    max_depth_drop: int | None = typer.Option(
        None, help="Most layers Minitron may drop (0 = width only; default: every layer the "
        "search may empty, i.e. all but the first and last)."),
    top_k: int = typer.Option(
        10, help="Largest candidates within the target that are ranked after a short "
        "distillation (ModelOpt's top_k)."),
    distill_tokens: int = typer.Option(
        32_768, help="Short distillation of each of the top-k before ranking (0 = rank by "
        "calibration KL right after pruning)."),
    granularity: int = typer.Option(16, help="Hidden sizes and FFN widths are multiples of this."),
) -> None:
    """Minitron baseline: homogeneous pruning (same width/heads in every layer, optional depth).

    --params N picks, among the homogeneous candidates with at most N parameters, the top-k
    closest to N and keeps the one with the lowest KL to the teacher on calibration data after
    a short distillation of each. --match-target T --workload W with limits does the same among
    the candidates that meet the limits, each timed on the target where this machine can time
    it: the fair hardware-matched comparison for `autocompress search`.
    """
    from autocompress.arch_search.minitron import MinitronConfig
    from autocompress.arch_search.run import SearchConfig, SearchContext, minitron_to_file
    from autocompress.arch_search.space import SpaceConfig
    from autocompress.atomic import check_out_file
    from autocompress.errors import AutoCompressError

    if (params is None) == (match_target is None):
        raise AutoCompressError("give exactly one of --params and --match-target",
                                hint="--params 3.5M, or --match-target T --workload W --max-...")
    if match_target is not None and workload is None:
        raise AutoCompressError("--match-target needs --workload", hint=WORKLOAD_HELP)
    config = SearchConfig(space=SpaceConfig(granularity=granularity),
                          minitron=MinitronConfig(max_depth_drop=max_depth_drop, top_k=top_k,
                                                  distill_tokens=distill_tokens))
    check_out_file(out)
    ctx = SearchContext.build(teacher, match_target, workload if match_target else None, config,
                              importance=importance, corpus_dir=data)
    if params is not None:
        report = minitron_to_file(ctx, out, params=_parse_count(params), config=config,
                                  progress=True)
    else:
        limits = ctx.resolve_limits(limits, budget_fraction)
        report = minitron_to_file(ctx, out, limits=limits, config=config, progress=True)
    _print_result(report, out, f"Minitron ({report['mode']})")
