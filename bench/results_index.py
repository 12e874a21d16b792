"""The results index (``results/index.json``): which file backs which published table.

The index is the one place that says what each file in ``results/`` is (teacher, target,
preset, budget, methods and seeds) and which table it backs. Each table ("block") lists
its sources in the ``--json FILE[:METHOD]`` syntax of ``bench report`` and the Markdown
pages it may live in; ``regenerate`` rebuilds every block in every page that carries its
``<!-- BLOCK:start -->`` / ``<!-- BLOCK:end -->`` markers, so the tables are never typed
by hand and never rebuilt from a list typed into prose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autocompress.atomic import write_text_atomic
from autocompress.errors import AutoCompressError
from bench.report import load_compare, merge_compares, readme_table, replace_between_markers

REPORT_SUFFIX = "/"  # an index entry ending in "/" is a folder (a report and its plots)


def load_index(path: str | Path) -> dict[str, Any]:
    """The index as a dict, or a one-line error naming what is wrong."""
    path = Path(path)
    if not path.exists():
        raise AutoCompressError(f"{path} does not exist",
                                hint="give the results index with --index")
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AutoCompressError(f"{path} is not valid JSON ({err})",
                                hint="fix the index by hand or restore it from git") from None
    if not isinstance(index.get("blocks"), dict) or not isinstance(index.get("files"), dict):
        raise AutoCompressError(f"{path} has no `blocks` and `files` tables",
                                hint="see results/README.md for the index's shape")
    return index


def _root_of(index_path: Path, root: str | Path | None) -> Path:
    # results/index.json sits one folder below the repository root its pages are under
    return Path(root) if root is not None else index_path.resolve().parent.parent


def block_data(index_path: str | Path, block: str) -> dict[str, Any]:
    """One block's sources, loaded and merged as ``bench report --json ...`` would."""
    index_path = Path(index_path)
    sources = load_index(index_path)["blocks"][block]["sources"]
    return merge_compares([load_compare(index_path.parent / spec) for spec in sources])


def block_tables(index_path: str | Path) -> dict[str, str]:
    """Every block's Markdown table, by block name."""
    blocks = load_index(index_path)["blocks"]
    return {name: readme_table(block_data(index_path, name)) for name in blocks}


def _pages(index: dict[str, Any], block: str, root: Path) -> list[Path]:
    return [root / page for page in index["blocks"][block]["pages"]]


def regenerate(index_path: str | Path, root: str | Path | None = None) -> list[tuple[Path, str]]:
    """Rewrite each block in each of its pages that has its markers; (page, block) done."""
    index_path = Path(index_path)
    index, root = load_index(index_path), _root_of(index_path, root)
    tables = block_tables(index_path)
    done = []
    for block, table in tables.items():
        for page in _pages(index, block, root):
            if not page.exists():
                continue
            new = replace_between_markers(page.read_text(), table, block)
            if new is not None:
                write_text_atomic(page, new)
                done.append((page, block))
    return done


def blocks_without_page(index_path: str | Path, root: str | Path | None = None) -> list[str]:
    """The blocks no page carries the markers of (listed in the index, shown nowhere)."""
    index_path = Path(index_path)
    index, root = load_index(index_path), _root_of(index_path, root)
    missing = []
    for block in index["blocks"]:
        pages = [p for p in _pages(index, block, root) if p.exists()]
        if not any(replace_between_markers(p.read_text(), "", block) is not None
                   for p in pages):
            missing.append(block)
    return missing


def indexed_paths(index: dict[str, Any]) -> list[str]:
    """The index's file and folder entries (folders end in ``/``)."""
    return list(index["files"])


def unindexed_files(results_dir: str | Path, index: dict[str, Any]) -> list[str]:
    """Files under ``results_dir`` the index names neither itself nor by its folder."""
    results_dir = Path(results_dir)
    folders = [p for p in index["files"] if p.endswith(REPORT_SUFFIX)]
    missing = []
    for path in sorted(results_dir.rglob("*")):
        rel = path.relative_to(results_dir).as_posix()
        if path.is_dir() or rel in index["files"] or rel == "index.json":
            continue
        if not any(rel.startswith(folder) for folder in folders):
            missing.append(rel)
    return missing


# ------------------------------------------------------------------ results/README.md

NAMING = (
    "A comparison's name says what it is: "
    "`TEACHER_ENGINE-DTYPE_PRESET_BUDGET_METHODS[_SEEDS][_VARIANT].json`, e.g. "
    "`smollm2-135m_llamacpp-q4_0_interactive-cpu_50_greedy_seed1.json` is greedy's seed 1 of "
    "SmolLM2-135M on llama.cpp q4_0 at 50% of the teacher's interactive-cpu TPOT (no `_SEEDS`: "
    "seeds 0, 1 and 2; `_first-fair`: the first fair comparison, before the stack-depth fix of "
    "the timing; `_modelopt-shortlist`: Minitron short-listing its ten largest candidates). "
    "A `_report/` folder is `autocompress bench report` of the same cells.")


def _seeds_text(methods: dict[str, list[int]]) -> str:
    return "; ".join(f"{m} {', '.join(map(str, seeds))}" for m, seeds in methods.items())


def _file_row(name: str, entry: dict[str, Any]) -> str:
    backs = ", ".join(f"`{b}`" for b in entry.get("backs", [])) or "—"
    if entry.get("kind") == "comparison":
        what = (f"{entry['teacher']}, `{entry['target']}`, {entry['preset']} at "
                f"{round(entry['budget_fraction'] * 100)}%: {_seeds_text(entry['methods'])}"
                f" (the table takes {entry['table_takes']})")
    else:
        what = entry["what"]
    was = f"`{entry['was']}`" if entry.get("was") else "—"
    return f"| `{name}` | {what} | {backs} | {was} |"


def index_readme(index: dict[str, Any]) -> str:
    """``results/README.md``: the index in prose, every file named (written from the index)."""
    lines = ["# Published results", "",
             "Written from `index.json` by `python -m bench.results_index`; do not edit by "
             "hand. " + index["about"], "", NAMING, "", "## Tables", "",
             "| block | what | pages | sources |", "|---|---|---|---|"]
    for block, entry in index["blocks"].items():
        sources = "<br>".join(f"`{s}`" for s in entry["sources"])
        pages = ", ".join(entry["pages"])
        lines.append(f"| `{block}` | {entry['what']} | {pages} | {sources} |")
    lines += ["", "## Files", "", "| file | what | backs | was |", "|---|---|---|---|"]
    lines += [_file_row(name, entry) for name, entry in index["files"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    path = Path(__file__).resolve().parents[1] / "results" / "index.json"
    out = path.with_name("README.md")
    write_text_atomic(out, index_readme(load_index(path)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
