"""The results index: every published file named, and the tables rebuilt from it byte for byte.

These read the real published files in ``results/`` and the real pages (README.md and the
guides under docs/), so a changed result, a renamed file or a hand-edited table fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from autocompress.errors import AutoCompressError
from bench import results_index
from bench.report import between_markers

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
INDEX = RESULTS / "index.json"


@pytest.fixture(scope="module")
def index() -> dict:
    return results_index.load_index(INDEX)


def _readme_table(args: list[str]):
    from autocompress.commands import bench

    app = typer.Typer()
    bench.register(app)
    return CliRunner().invoke(app, ["bench", "readme-table", *args])


def _pages(index: dict) -> set[str]:
    return {page for block in index["blocks"].values() for page in block["pages"]}


def test_every_file_in_results_is_indexed_and_every_entry_exists(index):
    assert results_index.unindexed_files(RESULTS, index) == []
    for name in index["files"]:
        path = RESULTS / name
        assert path.is_dir() if name.endswith("/") else path.is_file(), name
    for block in index["blocks"].values():
        for spec in block["sources"]:
            assert (RESULTS / spec.partition(":")[0]).is_file(), spec


def test_the_index_says_what_each_comparison_holds(index):
    """Each comparison's teacher size, target, preset, budget, methods and seeds, as indexed,
    are the file's own, and it backs exactly the blocks that list it."""
    for name, entry in index["files"].items():
        if entry["kind"] != "comparison":
            continue
        data = json.loads((RESULTS / name).read_text())
        (run,) = data["runs"]
        assert (entry["target"], entry["preset"]) == (data["target"], run["preset"]), name
        assert entry["budget_fraction"] == run["budget_fraction"], name
        seeds = {m: sorted(s["seed"] for s in v["seeds"]) for m, v in run["methods"].items()}
        assert entry["methods"] == seeds, name
        listed = [b for b, v in index["blocks"].items()
                  if any(s.partition(":")[0] == name for s in v["sources"])]
        assert entry["backs"] == listed, name


def test_results_readme_is_written_from_the_index(index):
    text = (RESULTS / "README.md").read_text()
    assert text == results_index.index_readme(index), "run: python -m bench.results_index"
    for name in index["files"]:
        assert f"`{name}`" in text


def test_readme_table_without_arguments_reproduces_the_committed_blocks(index, tmp_path):
    pages = [p for p in sorted(_pages(index)) if (ROOT / p).exists()]
    assert pages, "no page of the index exists"
    for page in pages:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    result = _readme_table(["--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for page in pages:
        assert (tmp_path / page).read_bytes() == (ROOT / page).read_bytes(), (
            f"{page}'s tables differ from results/index.json: run `autocompress bench "
            "readme-table`")
    # every block is shown somewhere, each once per page that has it
    assert results_index.blocks_without_page(INDEX, tmp_path) == []
    assert result.output.count("updated the") >= len(index["blocks"])


def test_a_page_with_only_some_blocks_gets_those(index, tmp_path):
    """A shorter README keeps only a headline block: that one is rebuilt, the others are
    left to the pages that have them, and the command says which are shown nowhere."""
    block = next(iter(index["blocks"]))
    (tmp_path / "README.md").write_text(f"# Results\n\n<!-- {block}:start -->\nstale\n"
                                        f"<!-- {block}:end -->\n")
    result = _readme_table(["--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    table = between_markers((tmp_path / "README.md").read_text(), block)
    assert table == results_index.block_tables(INDEX)[block]
    assert "stale" not in table and "| teacher |" in table
    others = [b for b in index["blocks"] if b != block]
    assert results_index.blocks_without_page(INDEX, tmp_path) == others


def test_a_broken_index_is_a_one_line_error(tmp_path):
    bad = tmp_path / "index.json"
    bad.write_text("{not json")
    with pytest.raises(AutoCompressError, match="not valid JSON"):
        results_index.load_index(bad)
    bad.write_text("{}")
    with pytest.raises(AutoCompressError, match="no `blocks` and `files`"):
        results_index.load_index(bad)


def test_the_library_and_its_cli_import_without_bench(tmp_path):
    """`bench/` ships with the checkout only: importing the CLI (which registers `bench`)
    must not import it, from a directory where it is not on the path."""
    code = ("import sys, autocompress.cli; "
            "sys.exit(any(m == 'bench' or m.startswith(('bench.', 'lab')) for m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": ""}
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env).returncode == 0


def test_bench_commands_outside_a_checkout_say_so(monkeypatch, tmp_path):
    from autocompress.commands import bench

    monkeypatch.setattr(bench, "REPO", tmp_path)
    with pytest.raises(AutoCompressError, match="source checkout"):
        bench._bench_module("report")
