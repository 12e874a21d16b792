"""CLI for the results area: `autocompress bench compare | retime | report | readme-table`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_JSON = REPO / "results" / "compare.json"


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    bench = typer.Typer(help="AutoCompress vs Minitron comparison, report and README table.",
                        no_args_is_help=True)
    # bench/compare.py parses its own options, --help included.
    bench.command("compare", add_help_option=False,
                  context_settings={"allow_extra_args": True,
                                    "ignore_unknown_options": True})(compare_command)
    bench.command("retime", add_help_option=False,
                  context_settings={"allow_extra_args": True,
                                    "ignore_unknown_options": True})(retime_command)
    bench.command("report")(report_command)
    bench.command("readme-table")(readme_table_command)
    app.add_typer(bench, name="bench")


def _compare_module():
    return _bench_module("compare")


def _bench_module(name: str):
    """``bench/NAME.py`` of this source checkout (the benchmarks are not packaged)."""
    from autocompress.errors import AutoCompressError

    path = REPO / "bench" / f"{name}.py"
    if not path.exists():
        raise AutoCompressError(f"{path} not found: `bench {name}` runs from a source checkout",
                                hint="clone the repository and install it editable")
    spec = importlib.util.spec_from_file_location(f"autocompress_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare_command(ctx: typer.Context) -> None:
    """Run AutoCompress and the matched Minitron baseline on the CPU presets.

    Each preset x budget x method x seed is one run of the `compress` Prefect flow
    (through the `sweep` flow), so a re-run reuses every finished stage. The options
    are bench/compare.py's (`autocompress bench compare --help` lists them). Writes
    results/compare.json.
    """
    _compare_module().main(list(ctx.args), prog="autocompress bench compare")


def retime_command(ctx: typer.Context) -> None:
    """Re-time an earlier comparison's models on this machine, under the limits of a
    comparison run here, so that methods run on two machines pair in one table.

    The options are bench/retime.py's (`autocompress bench retime --help` lists them).
    """
    _bench_module("retime").main(list(ctx.args), prog="autocompress bench retime")


def _load(json_paths: list[Path]) -> dict:
    from autocompress.report import load_compare, merge_compares

    return merge_compares([load_compare(p) for p in json_paths])


def report_command(
    json_paths: list[Path] = typer.Option([DEFAULT_JSON], "--json", help="compare.json to "
                                          "read; repeat it for cells written by several runs "
                                          "(e.g. one preset each). FILE:METHOD[,METHOD] takes "
                                          "only those methods, to pair one run's method with "
                                          "another run's in the same cell (same limits); "
                                          "FILE:METHOD=NAME shows it as NAME (a variant's "
                                          "run beside the default's: --baseline autocompress)."),
    out_dir: Path = typer.Option(None, "--out", help="Folder for report.md + PNGs "
                                 "(default: beside the JSON)."),
    also: list[Path] = typer.Option([], "--also", help="Another compare.json (e.g. a reduced "
                                    "run) to append as its own section; repeatable."),
    baseline: str = typer.Option(None, "--baseline", help="Compare every method with this "
                                 "one instead of the file's baseline (minitron), e.g. `greedy` "
                                 "to see what the differentiable search adds over greedy "
                                 "repair."),
) -> None:
    """Write report.md and the plots from a compare.json."""
    from autocompress.report import load_compare, with_baseline, write_report

    extra = []
    for path in also:
        data = load_compare(path)
        kind = "Reduced comparison" if data.get("reduced") else "Comparison"
        extra.append((f"{kind}: `{path.name}` ({data.get('created', '?')})", data))
    data = _load(json_paths)
    if baseline:
        data = with_baseline(data, baseline)
    path = write_report(data, out_dir or json_paths[0].parent, also=extra)
    typer.echo(f"wrote {path}")


def readme_table_command(
    json_paths: list[Path] = typer.Option([DEFAULT_JSON], "--json", help="compare.json to "
                                          "read; repeatable, as for `bench report`."),
    readme: Path = typer.Option(REPO / "README.md", "--readme",
                                help="README whose <!-- BLOCK:start/end --> block to replace."),
    block: str = typer.Option("results", "--block", help="Name of the README block: "
                              "`results` (the bundled teacher's table) or another, e.g. "
                              "`results-smollm2`, for a comparison of another teacher or "
                              "target (those are not merged into one table)."),
) -> None:
    """Regenerate a README results table from results/compare.json.

    Replaces only the text between `<!-- BLOCK:start -->` and `<!-- BLOCK:end -->`;
    if the README or the markers are missing, prints the table instead.
    """
    from autocompress.report import markers, readme_table, update_readme

    data = _load(json_paths)
    if readme.exists() and update_readme(readme, data, block):
        typer.echo(f"updated the {block} table in {readme}")
    else:
        typer.echo(readme_table(data))
        typer.echo(f"({readme} has no {' / '.join(markers(block))} markers; printed the "
                   "table instead)", err=True)
