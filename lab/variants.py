"""The lab's index of every run of a published cell: which runs a table uses, which it does not.

A cell is one teacher, target, preset and budget. For each cell some published table
(``results/index.json``) rebuilds, this lists every comparison file of that cell, in
``results/`` (published) and in ``lab/results/`` (superseded runs, variants, diagnostics),
with each method's seeds, mean multiple-choice score and held-out loss after distillation,
and writes the list into ``lab/README.md`` between its ``lab-variants`` markers.

    .venv/bin/python -m lab.variants
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autocompress.atomic import write_text_atomic
from bench.report import methods_of, replace_between_markers, summary
from bench.results_index import load_index

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "lab-variants"


def cell_key(data: dict[str, Any], run: dict[str, Any]) -> tuple:
    """What makes two runs the same cell: teacher (by size), target, preset, budget."""
    return (data.get("teacher", {}).get("params"), data.get("target"), run.get("preset"),
            round(float(run.get("budget_fraction", 0)), 3))


def _cell_text(key: tuple) -> str:
    params, target, preset, budget = key
    teacher = "SmolLM2-135M" if params and params > 50e6 else "bundled 7M"
    return f"{teacher}, `{target}`, {preset} @ {round(budget * 100)}%"


def _comparisons(folder: Path) -> dict[str, dict[str, Any]]:
    """The comparison files of a folder (those with ``runs``), by path relative to the root."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("runs"), list):
            out[path.relative_to(ROOT).as_posix()] = data
    return out


def _method_text(name: str, method: dict[str, Any]) -> str:
    s = summary(method)
    seeds = ", ".join(str(e.get("seed", 0)) for e in method["seeds"]) or "none"
    mc = "—" if s["mc_mean"] is None else f"{s['mc_mean']:.3f}"
    loss = "—" if s["loss_distilled"] is None else f"{s['loss_distilled']:.3f}"
    return f"{name} (seeds {seeds}): MC {mc}, loss {loss}"


def rows(index: dict[str, Any]) -> list[str]:
    """One Markdown row per file and cell, published cells only, published files first."""
    published = _comparisons(ROOT / "results")
    superseded = _comparisons(ROOT / "lab" / "results")
    blocks_of = {f"results/{name}": entry.get("backs", [])
                 for name, entry in index["files"].items()}
    cells = {cell_key(d, r) for d in published.values() for r in d["runs"]}
    out = []
    for key in sorted(cells, key=str):
        for path, data in {**published, **superseded}.items():
            for run in data["runs"]:
                if cell_key(data, run) != key:
                    continue
                where = ", ".join(f"`{b}`" for b in blocks_of.get(path, [])) or "superseded"
                methods = "; ".join(_method_text(n, m) for n, m in methods_of(run).items())
                out.append(f"| {_cell_text(key)} | `{path}` | {where} | {methods} |")
    return out


def table(index: dict[str, Any]) -> str:
    head = ["| cell | file | table | result (per method: seeds, mean MC, held-out loss) |",
            "|---|---|---|---|"]
    return "\n".join(head + rows(index)) + "\n"


def main() -> None:
    readme = ROOT / "lab" / "README.md"
    text = replace_between_markers(readme.read_text(),
                                   table(load_index(ROOT / "results" / "index.json")), BLOCK)
    if text is None:
        raise SystemExit(f"{readme} has no {BLOCK} markers")
    write_text_atomic(readme, text)
    print(f"wrote {readme}")


if __name__ == "__main__":
    main()
