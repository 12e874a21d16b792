"""CLI for the results area: `autocompress bench compare | retime | report | readme-table`.

The code behind these commands is the checkout's `bench/` package (the benchmarks and the
report code), which ships with the repository, not with the installed library: each command
imports it when it runs, so `import autocompress` never needs it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer

from autocompress.commands.aliases import aliased, renamed
from autocompress.errors import AutoCompressError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_JSON = REPO / "results" / "compare.json"
DEFAULT_INDEX = REPO / "results" / "index.json"


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
    # `--json` is an output file on every other command: the compare files read are --results.
    old_json = aliased({"--json": renamed("--results")})
    bench.command("report", cls=old_json)(report_command)
    bench.command("readme-table", cls=old_json)(readme_table_command)
    app.add_typer(bench, name="bench")


def _bench_module(name: str):
    """The module ``bench.NAME`` of this source checkout.

    Imported here, not at the top: the library must import without the checkout's
    ``bench/`` (an installed wheel has none), and only these commands need it.
    """
    if not (REPO / "bench" / "__init__.py").exists():
        raise AutoCompressError(f"{REPO / 'bench'} not found: `bench` commands run from a "
                                "source checkout", hint="clone the repository and install it "
                                "editable (pip install -e .)")
    # The checkout's root holds `bench/` beside `autocompress/`; the editable install
    # puts only the packaged folders on the path.
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    return importlib.import_module(f"bench.{name}")


def _compare_module():
    return _bench_module("compare")


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
    report = _bench_module("report")
    return report.merge_compares([report.load_compare(p) for p in json_paths])


def report_command(
    json_paths: list[Path] = typer.Option([DEFAULT_JSON], "--results", help="compare.json to "
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
    report = _bench_module("report")
    extra = []
    for path in also:
        data = report.load_compare(path)
        kind = "Reduced comparison" if data.get("reduced") else "Comparison"
        extra.append((f"{kind}: `{path.name}` ({data.get('created', '?')})", data))
    data = _load(json_paths)
    if baseline:
        data = report.with_baseline(data, baseline)
    path = report.write_report(data, out_dir or json_paths[0].parent, also=extra)
    typer.echo(f"wrote {path}")


def readme_table_command(
    json_paths: list[Path] = typer.Option([], "--results", help="compare.json to read; "
                                          "repeatable, as for `bench report`. Without it, "
                                          "every block in results/index.json is regenerated."),
    readme: Path = typer.Option(REPO / "README.md", "--readme",
                                help="With --results: the Markdown file whose block to replace."),
    block: str = typer.Option("results", "--block", help="With --results: the name of the "
                              "block (`<!-- BLOCK:start/end -->`), e.g. `results-smollm2`."),
    index: Path = typer.Option(DEFAULT_INDEX, "--index", help="Without --results: the results "
                               "index naming each block's files and pages."),
    root: Path = typer.Option(None, "--root", help="Without --results: the folder the index's "
                              "pages (README.md, docs/...) are under (default: the index's "
                              "repository)."),
) -> None:
    """Regenerate the README's results tables from the results index (results/index.json).

    Each block's table is rebuilt from the files the index lists for it and replaces the
    text between `<!-- BLOCK:start -->` and `<!-- BLOCK:end -->` in every page of the
    index that has those markers. With --results, one table from the given files instead,
    into --readme's --block (printed if the markers are missing).
    """
    if not json_paths:
        _readme_tables_from_index(index, root)
        return
    report = _bench_module("report")
    data = _load(json_paths)
    if readme.exists() and report.update_readme(readme, data, block):
        typer.echo(f"updated the {block} table in {readme}")
    else:
        typer.echo(report.readme_table(data))
        typer.echo(f"({readme} has no {' / '.join(report.markers(block))} markers; printed the "
                   "table instead)", err=True)


def _readme_tables_from_index(index: Path, root: Path | None) -> None:
    results_index = _bench_module("results_index")
    updated = results_index.regenerate(index, root)
    for page, block in updated:
        typer.echo(f"updated the {block} table in {page}")
    missing = results_index.blocks_without_page(index, root)
    if missing:
        typer.echo(f"(no page has the markers of {', '.join(missing)}; not shown anywhere)",
                   err=True)
