"""Comparison report: AutoCompress vs the fair Minitron baseline and the ablations.

Everything here reads the JSON written by ``bench/compare.py``
(``results/compare.json``) and nothing else, so the report, the plots and the
README table can always be regenerated from the numbers, never typed by hand.

- ``readme_table(data)``: the Markdown results table;
- ``replace_between_markers(text, table, block)``: put it between
  ``<!-- results:start -->`` and ``<!-- results:end -->`` (or another block's markers,
  e.g. ``<!-- results-smollm2:start -->`` for a second teacher or target; None if absent);
- ``write_report(data, out_dir)``: ``report.md`` + PNGs (accuracy vs measured
  TPOT / throughput / memory; per-layer architecture heatmaps; cost-model
  predicted vs measured for every final model).

Shape of ``data`` (see ``bench/compare.py``, version 3): ``teacher.scores``,
``teacher.arch``, ``baseline`` (the method others are compared with), and ``runs[]``
with ``preset``, ``budget_fraction``, ``main_metric``, ``limits``, ``teacher_verify``
and ``methods.<name>`` = ``{"seeds": [entry, ...], "failed": {seed: reason}}``, each
entry holding ``seed``, ``arch``, ``params``, ``predicted``, ``measured``, ``noise``,
``verify_ok``, ``scores`` and ``per_item`` (``{task: {item id: score}}``). Version 2
files (one entry per method, ``failed_methods``) read as one seed each.

Accuracy differences between methods are paired by item (the multiple-choice items
both scored) and by seed (the seeds both ran), with a bootstrap 95% interval over items
and seed pairs (``bench.stats``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from autocompress.atomic import write_text_atomic
from autocompress.errors import AutoCompressError
from autocompress.limits import HOST_DRIFT, host_drift
from bench.stats import OVERALL, paired_differences, spearman

DEFAULT_BLOCK = "results"


def markers(block: str = DEFAULT_BLOCK) -> tuple[str, str]:
    """The comment pair around a README block: one table per teacher and target, since
    comparisons of different teachers or targets are not merged into one table."""
    return f"<!-- {block}:start -->", f"<!-- {block}:end -->"


METHOD_LABELS = {"autocompress": "AutoCompress", "minitron": "Minitron",
                 "greedy": "greedy (no DNAS)", "random": "random search"}
METHOD_COLORS = {"teacher": "black", "autocompress": "tab:red", "minitron": "tab:blue",
                 "greedy": "tab:green", "random": "tab:gray"}
PLOT_METRICS = (("tpot_ms", "measured TPOT (ms)"),
                ("throughput_tok_s", "measured throughput (tok/s)"),
                ("memory_gb", "measured memory (GB)"))
# The issue's bar: AutoCompress should beat the baseline by >= 2 points of MC mean,
# with the 95% interval of the paired difference above zero.
WIN_MARGIN = 0.02
HELDOUT = "heldout_loss"  # per-item key of the held-out windows (not a multiple-choice task)


def load_compare(path: str | Path) -> dict[str, Any]:
    """A compare.json; ``FILE:METHOD[,METHOD...]`` keeps only those methods of its cells (to
    put methods of one cell from two runs side by side: ``merge_compares``), and
    ``METHOD=NAME`` keeps one under another name (a variant's run against the default's)."""
    path, methods = Path(path), None
    if not path.exists() and ":" in path.name:
        name, _, wanted = path.name.rpartition(":")
        path, methods = path.with_name(name), [m for m in wanted.split(",") if m]
    if not path.exists():
        raise AutoCompressError(f"{path} does not exist",
                                hint="run `autocompress bench compare` first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AutoCompressError(f"{path} is not valid JSON ({err})",
                                hint="re-run `autocompress bench compare`") from None
    return data if methods is None else only_methods(data, methods, path.name)


def method_names(data: dict[str, Any]) -> set[str]:
    """Every method some cell of ``data`` ran."""
    return {m for run in data.get("runs", []) for m in run.get("methods", {})}


def only_methods(data: dict[str, Any], methods: list[str], name: str) -> dict[str, Any]:
    """``data`` with only ``methods`` in each cell, ``METHOD=NAME`` renamed to NAME; each kept
    method says which file it is from (and its name there)."""
    renamed = {}
    for item in methods:
        method, _, new = item.partition("=")
        renamed[method] = new.strip() or method
    if len(renamed) < len(methods):
        raise AutoCompressError(f"{name}: a method is named more than once in "
                                f"{', '.join(methods)}", hint="name each method once")
    if len(set(renamed.values())) < len(renamed):
        raise AutoCompressError(f"{name}: two methods would share the name in "
                                f"{', '.join(methods)}", hint="give each METHOD=NAME its own NAME")
    present = method_names(data)
    missing = [m for m in renamed if m not in present]
    if missing:
        raise AutoCompressError(f"{name} has no method {', '.join(missing)}",
                                hint=f"it has {', '.join(sorted(present)) or 'none'}")
    runs = [{**run, "methods": {renamed[m]: {**v, "source": _source(data, name, m, renamed[m])}
                                for m, v in run["methods"].items() if m in renamed}}
            for run in data.get("runs", [])]
    return {**data, "runs": [r for r in runs if r["methods"]]}


def _source(data: dict[str, Any], name: str, method: str, shown_as: str) -> dict[str, Any]:
    source = {"file": name, "created": data.get("created")}
    return source if method == shown_as else {**source, "method": method}


def cells_with_limits(data: dict[str, Any], name: str) -> dict[tuple[str, float], dict[str, Any]]:
    """The cells (runs) of a compare.json keyed by (preset, budget fraction), each with the
    limits it ran under (``bench compare --limits-from``, ``bench retime``)."""
    try:
        return {(r["preset"], float(r["budget_fraction"])): {**r, "limits": r["limits"]}
                for r in data["runs"]}
    except (KeyError, TypeError, ValueError) as e:
        raise AutoCompressError(f"cannot read the limits of {name} ({e})",
                                hint="give a results JSON written by bench compare") from None


def _teacher_identity(data: dict[str, Any]) -> str | None:
    """The teacher's content hash (one teacher in two artifact stores is one teacher), else
    its directory."""
    teacher = data.get("teacher", {})
    return teacher.get("sha") or teacher.get("dir")


def merge_compares(datas: list[dict[str, Any]]) -> dict[str, Any]:
    """Several compare.json files (e.g. one per preset, each from its own invocation) as one:
    their cells side by side. They must share the target, teacher, baseline and kind
    (synthetic or not); a cell (preset × budget) may appear once. Each run keeps the
    settings and machine of its own file; the top level is the first file's, with the
    presets and seeds of all, the latest ``created``, the summed wall time."""
    if len(datas) == 1:
        return datas[0]
    first = datas[0]
    same = ("target", "baseline", "synthetic")
    for other in datas[1:]:
        differs = [k for k in same if other.get(k) != first.get(k)]
        if _teacher_identity(other) != _teacher_identity(first):
            differs.append("teacher")
        if differs:
            raise AutoCompressError(f"the comparisons differ in {', '.join(differs)}: their "
                                    "cells cannot share one table",
                                    hint="pass files of one target, teacher and baseline")
    runs, cells = [], {}
    for data in datas:
        for run in map(_stamp_teacher_reading, data.get("runs", [])):
            cell = (run["preset"], run["budget_fraction"])
            if cell in cells:
                _join_cell(cells[cell], run)
                continue
            cells[cell] = {"settings": data.get("settings", {}), "machine": data.get("machine"),
                           **run, "methods": dict(run.get("methods", {}))}
            runs.append(cells[cell])
    def union(key: str) -> list:
        return sorted({v for d in datas for v in d.get("settings", {}).get(key, [])})

    settings = {**first.get("settings", {}), "presets": union("presets")}
    seeds = union("seeds")
    if seeds:  # version-2 files name one ``seed``
        settings["seeds"] = seeds
    return {**first, "runs": runs, "settings": settings,
            "created": max(d.get("created", "") for d in datas),
            "reduced": any(d.get("reduced") for d in datas) and not covers_full_grid(runs),
            "wall_s": sum(d.get("wall_s", 0) for d in datas), "invocations": len(datas),
            "not_run": [n for d in datas for n in d.get("not_run", [])]}


# What issue 19 asks of a teacher's grid: every method at three seeds or more in every cell,
# and two budgets of every preset. Files run one method or one cell at a time are each
# "reduced"; together they may be the whole grid.
FULL_GRID_SEEDS = 3
FULL_GRID_BUDGETS = 2


def covers_full_grid(runs: list[dict[str, Any]]) -> bool:
    """Whether ``runs`` (cells of one teacher and target) hold every method of
    ``METHOD_LABELS`` at ``FULL_GRID_SEEDS`` seeds in each cell, and ``FULL_GRID_BUDGETS``
    budgets of each preset."""
    budgets: dict[str, set] = {}
    for run in runs:
        budgets.setdefault(run["preset"], set()).add(run["budget_fraction"])
        methods = methods_of(run)
        if any(len(methods.get(m, {}).get("seeds", [])) < FULL_GRID_SEEDS
               for m in METHOD_LABELS):
            return False
    return bool(budgets) and all(len(b) >= FULL_GRID_BUDGETS for b in budgets.values())


def _stamp_teacher_reading(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with every seed carrying its own file's teacher reading (``teacher_measured``),
    so that in a merged cell each seed still says what share of *its* host's teacher the
    common limit was."""
    measured = (run.get("teacher_verify") or {}).get("measured")
    if not measured:
        return run

    def stamped(m: dict[str, Any]) -> dict[str, Any]:
        if "seeds" not in m:  # version 2: the entry is the one seed
            return {"teacher_measured": measured, **m}
        return {**m, "seeds": [{"teacher_measured": measured, **e} for e in m["seeds"]]}

    return {**run, "methods": {k: stamped(m) for k, m in run.get("methods", {}).items()}}


def _join_cell(cell: dict[str, Any], run: dict[str, Any]) -> None:
    """Add ``run``'s methods to the same cell from another file, only under the same limits
    (the same cost model's budget), so a paired difference is fair. A method already in the
    cell gains the other file's seeds (e.g. seed 1 run later), if none of them repeats."""
    name = f"{run['preset']} @ {run['budget_fraction']:.0%}"
    if run.get("limits") != cell.get("limits"):
        raise AutoCompressError(f"{name} has different limits in two files "
                                f"({cell.get('limits')} vs {run.get('limits')})",
                                hint="compare methods of one cell under the same limits")
    for method, entry in run.get("methods", {}).items():
        if method not in cell["methods"]:
            cell["methods"][method] = entry
            continue
        cell["methods"][method] = _join_seeds(cell["methods"][method], entry, method, name)


def _seed_of(entry: dict[str, Any]) -> int:
    """The seed of one method's run (a version-2 entry has none: it ran seed 0)."""
    return entry.get("seed", 0)


def _join_seeds(have: dict[str, Any], more: dict[str, Any], method: str, cell: str
                ) -> dict[str, Any]:
    """One method's seeds from two files; each seed keeps the file it came from."""
    def seed_ids(m: dict[str, Any]) -> set[int]:
        ran = {_seed_of(e) for e in m.get("seeds", [m])}
        return ran | {int(s) for s in m.get("failed", {})}

    repeated = sorted(seed_ids(have) & seed_ids(more))
    if repeated:
        raise AutoCompressError(f"{cell}: {method} is in more than one file with seed "
                                f"{', '.join(map(str, repeated))}",
                                hint="pass each seed once, or pick methods with FILE:METHOD")

    def tagged(m: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**e, "source": e.get("source", m.get("source"))} for e in m.get("seeds", [m])]

    return {**have, "seeds": sorted(tagged(have) + tagged(more), key=_seed_of),
            "failed": {**have.get("failed", {}), **more.get("failed", {})},
            "sources": [*_sources(have), *_sources(more)]}


def _sources(method: dict[str, Any]) -> list[dict[str, Any]]:
    return method.get("sources") or ([method["source"]] if method.get("source") else [])


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def methods_of(run: dict) -> dict[str, dict]:
    """``{method: {"seeds": [...], "failed": {...}}}`` of a run (version 2 files too)."""
    out: dict[str, dict] = {}
    for name, m in run.get("methods", {}).items():
        out[name] = ({"seeds": m.get("seeds", []), "failed": m.get("failed", {})}
                     if "seeds" in m else {"seeds": [m], "failed": {}})
    for name, reason in run.get("failed_methods", {}).items():
        out.setdefault(name, {"seeds": [], "failed": {}})["failed"]["0"] = reason
    return out


def baseline_of(data: dict) -> str:
    return data.get("baseline") or "minitron"


def with_baseline(data: dict[str, Any], method: str) -> dict[str, Any]:
    """``data`` with every method compared against ``method`` instead of its own baseline,
    e.g. ``greedy`` to ask what the differentiable search adds over greedy repair; cells
    without ``method`` keep their rows and get no deltas."""
    present = method_names(data)
    if method not in present:
        raise AutoCompressError(f"no cell has the method {method!r} to compare against",
                                hint=f"pass one of {', '.join(sorted(present)) or 'none'}")
    return {**data, "baseline": method}


# ------------------------------------------------------------------ numbers


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return format(value, fmt)


def _pm(value: Any, err: Any, fmt: str = ".3f") -> str:
    text = _num(value, fmt)
    return text if err is None or text == "—" else f"{text} ± {format(err, fmt)}"


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _seed_sd(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.stdev(values) if len(values) > 1 else None


def teacher_reading(run: dict, metric: str) -> float | None:
    """The teacher's measured ``metric`` in the run of ``run``'s cell (its verify on target)."""
    return ((run.get("teacher_verify") or {}).get("measured") or {}).get(metric)


def _seed_reading(run: dict, entry: dict, metric: str) -> float | None:
    """One seed's teacher reading: its own file's (merged cells), else the cell's."""
    return (entry.get("teacher_measured") or {}).get(metric) or teacher_reading(run, metric)


def teacher_readings(run: dict, seeds: list[dict], metric: str) -> list[float]:
    """The distinct teacher readings under which ``seeds`` ran (each seed's own file's, else
    the cell's), ascending."""
    values = {_seed_reading(run, e, metric) for e in seeds} or {teacher_reading(run, metric)}
    return sorted(v for v in values if v)


def drifted(readings: list[float]) -> bool:
    """Whether sorted teacher readings are far enough apart to be two hosts."""
    return len(readings) > 1 and host_drift(readings[0], readings[-1])


def carried_reading(run: dict, metric: str) -> tuple[float, str] | None:
    """The teacher's reading where a carried limit was set (``bench compare --limits-from``)
    and that file's name, when it differs from this run's by more than ``HOST_DRIFT``."""
    carried = run.get("limits_carried") or {}
    then = ((carried.get("teacher_verify") or {}).get("measured") or {}).get(metric)
    now = teacher_reading(run, metric)
    if not then or not now or not host_drift(then, now):
        return None
    return then, Path(carried.get("from", "?")).name


def _limit_text(run: dict, seeds: list[dict] | None = None) -> str:
    """The cell's limits, each with its share of the teacher as this run measured it: a
    limit carried from another session (``--limits-from``) is a fraction of *that*
    session's teacher, and the teacher's own reading moves between sessions. With
    ``seeds`` (one method's, in a cell merged from several files) the share is each seed's
    own host's, given as a range where those hosts drifted apart."""
    parts = []
    for name, bound in run.get("limits", {}).items():
        sign = "≤" if name.startswith("max_") else "≥"
        metric = name.removeprefix("max_").removeprefix("min_")
        text = f"{metric} {sign} {bound:.3g}"
        readings = teacher_readings(run, seeds or [], metric)
        if drifted(readings):
            low, high = readings[0], readings[-1]
            text += (f" ({bound / high:.0%}–{bound / low:.0%} of the teacher's {low:.3g}–"
                     f"{high:.3g}, as each seed's host read it)")
        elif readings:  # one host: this method's own reading, else the cell's
            reading = readings[0] if len(readings) == 1 else (teacher_reading(run, metric)
                                                              or readings[0])
            text += f" ({bound / reading:.0%} of the teacher's {reading:.3g})"
        carried = carried_reading(run, metric)
        if carried:
            text += f"; set as {bound / carried[0]:.0%} of its {carried[0]:.3g} in {carried[1]}"
        parts.append(text)
    return ", ".join(parts)


def _pair_drift(run: dict, metric: str, base: str) -> list[str]:
    """Each seed s of a method that ran on a host more than ``HOST_DRIFT`` away from the
    baseline's seed s (their paired difference then mixes two budgets)."""
    methods = methods_of(run)
    base_seeds = {_seed_of(e): e for e in methods.get(base, {}).get("seeds", [])}
    out = []
    for name, m in methods.items():
        pairs = [(_seed_of(e), _seed_reading(run, e, metric),
                  _seed_reading(run, base_seeds[_seed_of(e)], metric))
                 for e in m["seeds"] if name != base and _seed_of(e) in base_seeds]
        out += [f"{method_label(name)} seed {s} {a:.3g} against {b:.3g}"
                for s, a, b in pairs if a and b and host_drift(a, b)]
    return out


def host_drift_notes(data: dict) -> list[str]:
    """One line per cell whose runs read the teacher on hosts more than ``HOST_DRIFT`` apart
    (cells merged from several files, or a limit carried from another host). Worst: a seed
    pair on two hosts, whose paired difference mixes two budgets. Milder: each pair on one
    host, but the seeds on different ones, so the limit was a different share per seed."""
    notes = []
    for run in data.get("runs", []):
        metric = run.get("main_metric", "tpot_ms")
        cell = f"{run['preset']} @ {run['budget_fraction']:.0%}"
        seeds = [e for m in methods_of(run).values() for e in m["seeds"]]
        readings = teacher_readings(run, seeds, metric)
        pairs = _pair_drift(run, metric, baseline_of(data))
        fix = ("Run the later method at its budget fraction on its own host and `bench "
               "retime` the earlier file's architectures under its limits.")
        if pairs:
            notes.append(f"{cell}: seed pairs on hosts more than {HOST_DRIFT:.0%} apart (the "
                         f"teacher's {metric} where each "
                         f"ran, against {method_label(baseline_of(data))}'s same seed: "
                         f"{'; '.join(pairs)}); those paired differences mix two budgets. "
                         f"{fix}")
        elif drifted(readings):
            notes.append(f"{cell}: the seeds ran on hosts whose teacher read {readings[0]:.3g}–"
                         f"{readings[-1]:.3g} {metric}; each seed pair shares one host, but the "
                         "limit was a different share of the teacher for each seed.")
        carried = carried_reading(run, metric)
        if carried:
            notes.append(f"{cell}: the limit, carried from {carried[1]}, was set where the "
                         f"teacher read {carried[0]:.3g} {metric}; here it read "
                         f"{teacher_reading(run, metric):.3g}, so it is another budget. {fix}")
    return notes


def _mc_tasks(per_item: dict) -> list[str]:
    return sorted(k for k in per_item if k != HELDOUT)


def paired_vs(a: dict, b: dict) -> dict[str, Any] | None:
    """A − B (two methods of one run) paired by item and, over the seeds both ran, by seed
    (``stats.paired_differences``' ``paired_seeds``); with no seed in common, over all their
    seeds, resampled independently.

    ``{"mc": {task|overall: PairedDiff dict}, "heldout_loss": PairedDiff dict | None,
    "seeds": the seeds paired, "all_seeds": whether those are every seed of both}``; None
    where either has no per-item scores.
    """

    by_seed_a, by_seed_b = _per_item_by_seed(a), _per_item_by_seed(b)
    common = sorted(set(by_seed_a) & set(by_seed_b))
    if common:
        runs_a, runs_b = [by_seed_a[s] for s in common], [by_seed_b[s] for s in common]
    else:
        runs_a, runs_b = list(by_seed_a.values()), list(by_seed_b.values())
    if not runs_a or not runs_b:
        return None
    paired = {"paired_seeds": bool(common)}
    tasks = sorted(set.intersection(*(set(_mc_tasks(r)) for r in [*runs_a, *runs_b])))
    out: dict[str, Any] = {"mc": None, HELDOUT: None, "seeds": common,
                           "all_seeds": len(common) == len(by_seed_a) == len(by_seed_b)}
    if tasks:
        diffs = paired_differences(runs_a, runs_b, tasks, **paired)
        out["mc"] = {k: v.model_dump() for k, v in diffs.items()}
        out["mc"]["overall"] = diffs[OVERALL].model_dump()
    if all(HELDOUT in r for r in [*runs_a, *runs_b]):
        out[HELDOUT] = paired_differences(runs_a, runs_b, [HELDOUT],
                                          **paired)[HELDOUT].model_dump()
    return out


def _on_seeds(method: dict, seeds: list[int]) -> dict:
    """``method`` with only the runs of ``seeds``."""
    return {**method, "seeds": [e for e in method["seeds"] if _seed_of(e) in seeds]}


def _per_item_by_seed(method: dict) -> dict[int, dict]:
    """The per-item scores of each seed a method ran (seeds without them left out)."""
    return {_seed_of(e): e["per_item"] for e in method["seeds"] if e.get("per_item")}


def summary(m: dict) -> dict[str, Any]:
    """One method of one run over its seeds: means, seed spread, worst measured cost."""
    seeds = m["seeds"]
    scores = [e.get("scores", {}) for e in seeds]
    params = sorted({e.get("params") for e in seeds if e.get("params") is not None})
    verified = [e.get("verify_ok") for e in seeds if "verify_ok" in e]
    return {
        "n": len(seeds), "failed": len(m.get("failed", {})),
        "params": params,
        "mc_mean": _mean([s.get("mc_mean") for s in scores]),
        "mc_seed_sd": _seed_sd([s.get("mc_mean") for s in scores]),
        "mc_stderr": _mean([s.get("mc_mean_stderr") for s in scores]),
        "loss_pruned": _mean([s.get("heldout_loss_pruned") for s in scores]),
        "loss_distilled": _mean([s.get("heldout_loss_distilled") for s in scores]),
        "verified": sum(bool(v) for v in verified), "verify_runs": len(verified),
        "violations": sorted({v for e in seeds for v in e.get("violations", [])}),
    }


# ------------------------------------------------------------------ table


def _worst_measured(seeds: list[dict], metric: str) -> str:
    """The measured main metric of the seed nearest its limit (max; ± its noise)."""
    measured = [(e["measured"].get(metric), e.get("noise", {}).get(metric),
                 e.get("predicted", {}).get(metric)) for e in seeds if e.get("measured")]
    measured = [t for t in measured if t[0] is not None]
    if not measured:
        return "—"
    value, noise, pred = max(measured, key=lambda t: t[0])
    return f"{_pm(value, noise, '.2f')} (pred {_num(pred, '.2f')})"


def _verify_text(sm: dict) -> str:
    if sm["verify_runs"] == 0:
        return "not run"
    text = f"{sm['verified']}/{sm['verify_runs']} pass"
    return text if not sm["violations"] else f"{text} (FAIL {', '.join(sm['violations'])})"


def _delta_text(comparison: dict | None) -> str:
    if comparison is None or comparison.get("mc") is None:
        return "—"
    d = comparison["mc"]["overall"]
    text = f"{100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"
    if comparison.get("seeds") and not comparison.get("all_seeds", True):
        text += f" (seeds {', '.join(str(s) for s in comparison['seeds'])})"
    return text


def table_rows(data: dict) -> list[dict[str, str]]:
    """One row per (preset, budget, method), teacher first; strings ready to print."""
    teacher = data.get("teacher", {})
    ts = teacher.get("scores", {})
    base = baseline_of(data)
    rows = [{"preset": "—", "budget": "100%", "limit": "—", "method": "teacher", "seeds": "—",
             "params": _num(teacher.get("params"), ","),
             "mc_mean": _pm(ts.get("mc_mean"), ts.get("mc_mean_stderr")), "delta": "—",
             "loss": _num(ts.get("heldout_loss_fixed"), ".3f"),
             "main": "—", "memory": "—", "verify": "—"}]
    for run in data.get("runs", []):
        metric = run.get("main_metric", "tpot_ms")
        methods = methods_of(run)
        common = {"preset": run["preset"], "budget": f"{run['budget_fraction']:.0%}"}
        for name, m in methods.items():
            common["limit"] = _limit_text(run, m["seeds"])
            if not m["seeds"]:
                reason = "; ".join(sorted(set(m["failed"].values())))
                rows.append({**common, "method": method_label(name),
                             "seeds": f"0/{len(m['failed'])}", "params": "—",
                             "mc_mean": "—", "delta": "—", "loss": "—", "main": "—",
                             "memory": "—",
                             "verify": "no architecture: " + reason.split(":")[0]})
                continue
            sm = summary(m)
            delta = ("(baseline)" if name == base else
                     _delta_text(paired_vs(m, methods[base])) if base in methods
                     and methods[base]["seeds"] else "—")
            err = sm["mc_seed_sd"] if sm["n"] > 1 else sm["mc_stderr"]
            memory = [e["measured"].get("memory_gb") for e in m["seeds"] if e.get("measured")]
            rows.append({
                **common, "method": method_label(name),
                "seeds": f"{sm['n']}/{sm['n'] + sm['failed']}",
                "params": " / ".join(f"{p:,}" for p in sm["params"]) or "—",
                "mc_mean": _pm(sm["mc_mean"], err), "delta": delta,
                "loss": f"{_num(sm['loss_pruned'], '.3f')} → "
                        f"{_num(sm['loss_distilled'], '.3f')}",
                "main": _worst_measured(m["seeds"], metric),
                "memory": _num(max((x for x in memory if x is not None), default=None), ".4f"),
                "verify": _verify_text(sm),
            })
    return rows


TABLE_COLUMNS = (("preset", "preset"), ("budget", "budget"), ("limit", "limit"),
                 ("method", "method"), ("seeds", "seeds"), ("params", "params"),
                 ("mc_mean", "MC mean ± s.d. over seeds (s.e. if one)"),
                 ("delta", "Δ vs baseline, points [95% CI]"),
                 ("loss", "held-out loss (pruned → distilled)"),
                 ("main", "measured main metric ± noise (pred), worst seed"),
                 ("memory", "measured memory GB"), ("verify", "verify on target"))


def _distill_tokens_text(data: dict) -> str:
    """Distillation tokens per model, per cell as each run recorded it (cells merged from
    several files may differ), else from the settings; '' when unknown."""
    by_tokens: dict[int, list[str]] = {}
    for run in data.get("runs", []):
        tokens = run.get("distill_tokens")
        if isinstance(tokens, int):
            by_tokens.setdefault(tokens, []).append(
                f"{run['preset']} @ {run['budget_fraction']:.0%}")
    if len(by_tokens) > 1:
        return "; ".join(f"{tokens:,} tokens per model in {', '.join(cells)}"
                         for tokens, cells in sorted(by_tokens.items(), reverse=True))
    if by_tokens:
        return f"{next(iter(by_tokens)):,} tokens per model"
    settings = data.get("settings", {})
    tokens, tight = settings.get("distill_tokens"), settings.get("tight_distill_tokens")
    if not isinstance(tokens, int):
        return ""
    return f"{tokens:,} tokens per model" + (f", {tight:,} at the tightest budget"
                                              if tight else "")


def readme_table(data: dict) -> str:
    """The Markdown results table (+ a one-line provenance note)."""
    lines = ["| " + " | ".join(title for _, title in TABLE_COLUMNS) + " |",
             "|" + "---|" * len(TABLE_COLUMNS)]
    for row in table_rows(data):
        lines.append("| " + " | ".join(row[key] for key, _ in TABLE_COLUMNS) + " |")
    settings = data.get("settings", {})
    seeds = settings.get("seeds", [settings.get("seed", 0)])
    tokens = _distill_tokens_text(data)
    note = ""
    if tokens:
        note = (f"\n_Generated by `bench/compare.py` ({data.get('created', '?')}; target "
                f"{data.get('target', '?')}; baseline {method_label(baseline_of(data))}; seeds "
                f"{', '.join(map(str, seeds))}; distillation {tokens}; "
                + (f"eval limit {settings['eval_limit']} items per task)._"
                   if settings.get("eval_limit") else "full benchmark suite)._"))
        note += ("\n_Δ: paired by benchmark item and by seed (the seeds both methods ran; "
                 "named where not all of them), mean over seeds, bootstrap 95% interval over "
                 "items and seed pairs (`bench.stats`); — where per-item scores were "
                 "not recorded._")
    sources = _method_sources(data)
    if sources:
        note += "\n_Methods from several runs, paired under the same limits: " + "; ".join(
            sources) + "._"
    note += "".join(f"\n_Host drift: {n}_" for n in host_drift_notes(data))
    if data.get("invocations", 1) > 1:
        note += f"\n_{_grid_wall_text(data)}._"
    if data.get("reduced"):
        note += "\n_REDUCED comparison (fewer presets, budgets or seeds than the issue asks)._"
    if data.get("synthetic"):
        note += "\n_SYNTHETIC test data, not a measurement._"
    return "\n".join(lines) + "\n" + note + "\n"


def _method_sources(data: dict) -> list[str]:
    """Where each method picked from a file (``FILE:METHOD``) came from."""
    seen: dict[str, str] = {}
    for run in data.get("runs", []):
        for name, method in run.get("methods", {}).items():
            files = [f"`{src['file']}` ({src.get('created')})"
                     + (f" as {method_label(src['method'])}" if src.get("method") else "")
                     for src in _sources(method)]
            if files:
                seen.setdefault(name, f"{method_label(name)} from {' and '.join(files)}")
    return list(seen.values())


def _marker_span(text: str, block: str) -> tuple[int, int] | None:
    """Where the part between ``block``'s markers starts and ends in ``text``."""
    open_mark, close_mark = markers(block)
    start, end = text.find(open_mark), text.find(close_mark)
    if start < 0 or end < 0 or end < start:
        return None
    return start + len(open_mark), end


def between_markers(text: str, block: str = DEFAULT_BLOCK) -> str | None:
    """The part of ``text`` between ``block``'s markers (after the opening line); None if
    absent."""
    span = _marker_span(text, block)
    return None if span is None else text[span[0]:span[1]].removeprefix("\n")


def replace_between_markers(text: str, table: str,
                            block: str = DEFAULT_BLOCK) -> str | None:
    """``text`` with the part between ``block``'s markers replaced; None if absent."""
    span = _marker_span(text, block)
    return None if span is None else text[:span[0]] + "\n" + table + text[span[1]:]


def update_readme(readme: str | Path, data: dict, block: str = DEFAULT_BLOCK) -> bool:
    """Rewrite ``block``'s table in ``readme`` atomically; False (untouched) if no markers."""
    readme = Path(readme)
    new = replace_between_markers(readme.read_text(), readme_table(data), block)
    if new is None:
        return False
    write_text_atomic(readme, new)
    return True


# ------------------------------------------------------------------ analysis


def _diff(a: dict, b: dict, key: str) -> float | None:
    return None if a.get(key) is None or b.get(key) is None else a[key] - b[key]


def verdicts(data: dict) -> list[dict[str, Any]]:
    """Per run and method: MC-mean and loss deltas vs the baseline, paired intervals, who wins.

    ``mc_delta`` is the difference of the seed-mean MC means; ``paired`` the per-item
    comparison (None without per-item scores: then ``mc_delta_se`` treats the two
    means as independent, the old and looser reading).
    """
    base = baseline_of(data)
    teacher = data.get("teacher", {}).get("scores", {})
    out = []
    for run in data.get("runs", []):
        methods = methods_of(run)
        if base not in methods or not methods[base]["seeds"]:
            continue
        b_all = summary(methods[base])
        for name, m in methods.items():
            if name == base or not m["seeds"]:
                continue
            paired = paired_vs(m, methods[base])
            a, b = summary(m), b_all
            if paired and paired["seeds"] and not paired["all_seeds"]:  # the seeds both ran
                a, b = (summary(_on_seeds(x, paired["seeds"])) for x in (m, methods[base]))
            delta = _diff(a, b, "mc_mean")
            mc = paired["mc"]["overall"] if paired and paired["mc"] else None
            se = (mc["se"] if mc else math.hypot(a.get("mc_stderr") or 0.0,
                                                  b.get("mc_stderr") or 0.0))
            out.append({
                "preset": run["preset"], "budget_fraction": run["budget_fraction"],
                "method": name, "baseline": base, "seeds": a["n"], "baseline_seeds": b["n"],
                "mc_delta": delta, "mc_delta_se": se, "paired": paired,
                "loss_delta_pruned": _diff(a, b, "loss_pruned"),
                "loss_delta_distilled": _diff(a, b, "loss_distilled"),
                "meets_bar": (mc["mean"] >= WIN_MARGIN and mc["low"] > 0 if mc else
                              delta is not None and delta >= WIN_MARGIN),
                "both_verified": bool(a["verified"] == a["verify_runs"] > 0
                                      and b["verified"] == b["verify_runs"] > 0),
                **teacher_headroom(teacher, a, b),
            })
    return out


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole or whole <= 0 else part / whole


def teacher_headroom(teacher: dict, a: dict, b: dict) -> dict[str, float | None]:
    """How far the baseline ``b`` is below the teacher, and what share of that gap ``a``
    closes, in MC points and in held-out loss. A distilled student rarely passes its
    teacher, so a bar near or above the teacher's own lead cannot be met by any method."""
    headroom = _diff(teacher, b, "mc_mean")
    loss_headroom = (None if b.get("loss_distilled") is None
                     or teacher.get("heldout_loss_fixed") is None
                     else b["loss_distilled"] - teacher["heldout_loss_fixed"])
    loss_gain = _diff(b, a, "loss_distilled")
    return {"teacher_headroom": headroom,
            "gap_closed": _share(_diff(a, b, "mc_mean"), headroom),
            "bar_share": _share(WIN_MARGIN, headroom),
            "loss_headroom": loss_headroom, "loss_gap_closed": _share(loss_gain, loss_headroom)}


def _headroom_text(v: dict) -> str:
    headroom = v.get("teacher_headroom")
    if headroom is None:
        return ""
    if headroom <= WIN_MARGIN:
        text = (f" The teacher itself is only {100 * headroom:+.1f} points above "
                f"{method_label(v['baseline'])} on these items: the bar asks for more than the "
                "teacher's own lead.")
    else:
        text = (f" The teacher is {100 * headroom:+.1f} points above "
                f"{method_label(v['baseline'])} on these items, so the bar asks for "
                f"{v['bar_share']:.0%} of that gap; {method_label(v['method'])} closes "
                f"{v['gap_closed']:.0%} of it.")
    if v.get("loss_gap_closed") is not None:
        text += (f" Of the baseline's {v['loss_headroom']:.3f} nats of held-out loss above the "
                 f"teacher it closes {v['loss_gap_closed']:.0%}.")
    return text


def compute_parts(data: dict) -> dict[str, float]:
    """Seconds of search, distillation and evaluation (the teacher's included) behind
    ``data``, as each stage recorded them when it ran (so a resumed comparison still counts
    its cached stages). Of the search, also the part the structured searches record as their
    short list's distillation and timing on the target (``short_distill``, ``timing``)
    and the baseline's whole search, which records one total (``baseline_search``)."""
    parts = dict.fromkeys(("search", "short_distill", "timing", "baseline_search",
                           "distill"), 0.0)
    parts["evaluation"] = data.get("teacher", {}).get("scores", {}).get("seconds") or 0.0
    for run in data.get("runs", []):
        for name, m in methods_of(run).items():
            for e in m["seeds"]:
                search = e.get("search_seconds")
                if isinstance(search, dict):
                    parts["search"] += search.get("total", 0.0)
                    pick = search.get("final_pick") or {}
                    parts["short_distill"] += pick.get("short_distill", 0.0)
                    parts["timing"] += pick.get("timing_on_target", 0.0)
                else:
                    parts["search"] += search or 0.0
                    if name == baseline_of(data):
                        parts["baseline_search"] += search or 0.0
                parts["distill"] += (e.get("distill") or {}).get("seconds") or 0.0
                parts["evaluation"] += e.get("scores", {}).get("seconds") or 0.0
    return parts


def compute_seconds(data: dict) -> float:
    """Seconds of search, distillation and evaluation behind ``data`` (``compute_parts``)."""
    parts = compute_parts(data)
    return parts["search"] + parts["distill"] + parts["evaluation"]


def _seeds_text(v: dict, paired: dict) -> str:
    if paired.get("seeds"):
        return "seed pairs " + ", ".join(str(s) for s in paired["seeds"])
    return f"{v['seeds']} vs {v['baseline_seeds']} seeds, resampled independently"


def _verdict_line(v: dict) -> str:
    head = (f"- **{v['preset']} @ {v['budget_fraction']:.0%}, {method_label(v['method'])} vs "
            f"{method_label(v['baseline'])}**: ")
    if v["mc_delta"] is None:
        loss = v["loss_delta_pruned"]
        return (head + "benchmark scores missing (run stopped before evaluation)"
                + ("" if loss is None else f"; held-out loss Δ after pruning {loss:+.3f}, "
                   "negative = first better") + ".")
    paired = v["paired"]
    mc = paired["mc"]["overall"] if paired and paired["mc"] else None
    if mc:
        sure = ("above zero" if mc["low"] > 0 else "below zero" if mc["high"] < 0
                else "includes zero")
        stat = (f"{100 * mc['mean']:+.1f} points, 95% CI [{100 * mc['low']:+.1f}, "
                f"{100 * mc['high']:+.1f}] (paired over {mc['n_items']} items, "
                f"{_seeds_text(v, paired)}; interval {sure})")
    else:
        stat = (f"{100 * v['mc_delta']:+.1f} points (±{100 * v['mc_delta_se']:.1f} s.e. as "
                "independent means; no per-item scores)")
    who = ("ahead" if mc and mc["low"] > 0 else "behind" if mc and mc["high"] < 0
           else "ahead" if not mc and v["mc_delta"] > 0 else
           "behind" if not mc and v["mc_delta"] < 0 else "not distinguishable")
    bar = "meets" if v["meets_bar"] else "does NOT meet"
    task_part = ""
    if mc:
        tasks = {k: d for k, d in paired["mc"].items() if k not in ("overall",)}
        task_part = " Per task: " + ", ".join(
            f"{k} {100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"
            for k, d in sorted(tasks.items()) if k != "overall") + "."
    loss = paired.get(HELDOUT) if paired else None
    loss_part = (f" Held-out loss Δ {loss['mean']:+.3f} [{loss['low']:+.3f}, "
                 f"{loss['high']:+.3f}] nats (paired over windows; negative = "
                 f"{method_label(v['method'])} better)." if loss else
                 f" Held-out loss Δ {_num(v['loss_delta_pruned'], '+.3f')} after pruning, "
                 f"{_num(v['loss_delta_distilled'], '+.3f')} after distillation.")
    return (head + f"MC mean Δ = {stat}: {method_label(v['method'])} {who}; it {bar} the "
            f"≥ 2-point bar with the interval above zero.{_headroom_text(v)}{task_part}"
            f"{loss_part} All verified "
            f"on target: {'yes' if v['both_verified'] else 'no'}.")


def analysis_text(data: dict) -> list[str]:
    """The verdict: failures first, then each method vs the baseline, then a plain summary."""
    lines = []
    for run in data.get("runs", []):
        methods = methods_of(run)
        for name, m in methods.items():
            for seed, reason in sorted(m["failed"].items()):
                others = [method_label(k) for k, o in methods.items() if o["seeds"]]
                lines.append(
                    f"- **{run['preset']} @ {run['budget_fraction']:.0%}**: "
                    f"{method_label(name)} (seed {seed}) found no architecture ({reason})"
                    + (f"; {', '.join(others)} did." if others else "."))
    found = verdicts(data)
    lines += [_verdict_line(v) for v in found]
    lines += [f"- **Host drift**, {note}" for note in host_drift_notes(data)]
    ours = [v for v in found if v["method"] == "autocompress"]
    if ours:
        lost = [f"{v['preset']} @ {v['budget_fraction']:.0%}" for v in ours
                if not v["meets_bar"]]
        lines += ["", f"**In short:** AutoCompress meets the bar (≥ +2 points over "
                  f"{method_label(baseline_of(data))}, interval above zero) in "
                  f"{len(ours) - len(lost)} of {len(ours)} cells"
                  + (f"; it does **not** in: {', '.join(lost)}." if lost else ".")]
    return lines


def _rank_correlation(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho (``stats.spearman``); None for fewer than three or a constant side."""

    rho = spearman(a, b) if len(a) >= 3 else math.nan
    return None if math.isnan(rho) else rho


TEACHER_SIDE = "teacher: "  # origin prefix of a candidate repaired from the teacher


def short_list_side(candidate: dict) -> str:
    """Which side of the search's short list a candidate came from: repair from the
    teacher (what greedy also finds) or repair from the DNAS answer."""
    return "teacher" if str(candidate.get("origin", "")).startswith(TEACHER_SIDE) else "search"


def selection_lines(data: dict) -> list[str]:
    """The final pick of each method and seed: how many candidates got the short
    distillation, the winner, whether the ranking right after pruning agreed, and, where
    the short list had both sides, which side won (per cell and method, a count)."""
    lines = []
    for run in data.get("runs", []):
        wins: dict[str, list[str]] = {}
        for name, e in _seed_entries(run):
            short = [f for f in e.get("selection") or [] if f.get("kl") is not None]
            chosen = next((f for f in short if f.get("chosen")), None)
            if len(short) < 2 or chosen is None:
                continue
            text = (f"- {run['preset']} @ {run['budget_fraction']:.0%}, {method_label(name)} "
                    f"s{e['seed']}: {len(short)} candidates short-distilled "
                    f"(KL {min(f['kl'] for f in short):.3f}–{max(f['kl'] for f in short):.3f}); "
                    f"chosen {chosen['layers']} layers, {chosen['params']:,} params, KL "
                    f"{chosen['kl']:.3f}")
            pruned = [f.get("pruned_kl") for f in short]
            if all(p is not None for p in pruned):
                best_pruned = min(short, key=lambda f: f["pruned_kl"])
                rho = _rank_correlation(pruned, [f["kl"] for f in short])
                text += (f" ({chosen['pruned_kl']:.3f} right after pruning; the best right "
                         f"after pruning, {best_pruned['layers']} layers, had "
                         f"{best_pruned['kl']:.3f} after the short distillation"
                         + (f"; Spearman ρ {rho:+.2f}" if rho is not None else "") + ")")
            if {short_list_side(f) for f in short} == {"teacher", "search"}:
                side = short_list_side(chosen)
                wins.setdefault(name, []).append(side)
                text += (" — from the teacher's side (greedy repair)" if side == "teacher"
                         else " — from the search's side (repair of the DNAS answer)")
            lines.append(text + ".")
        for name, sides in wins.items():
            lines.append(f"- {run['preset']} @ {run['budget_fraction']:.0%}, "
                         f"{method_label(name)}: the search's side won "
                         f"{sides.count('search')} of {len(sides)} seeds.")
    return lines


# ------------------------------------------------------------------ plots


def _seed_entries(run: dict) -> list[tuple[str, dict]]:
    """(method, entry) for every finished seed of every method of ``run``."""
    return [(name, e) for name, m in methods_of(run).items() for e in m["seeds"]]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _teacher_points(run: dict) -> dict | None:
    tv = run.get("teacher_verify")
    return tv.get("measured") if tv else None


def plot_accuracy_vs_cost(data: dict, path: Path) -> Path:
    """MC mean vs measured TPOT / throughput / memory: teacher, Minitron, AutoCompress."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PLOT_METRICS), figsize=(5 * len(PLOT_METRICS), 4))
    teacher_mc = data.get("teacher", {}).get("scores", {}).get("mc_mean")
    markers = "osD^v<>"
    presets = sorted({r["preset"] for r in data.get("runs", [])})
    for ax, (metric, label) in zip(axes, PLOT_METRICS, strict=True):
        for run in data.get("runs", []):
            mk = markers[presets.index(run["preset"]) % len(markers)]
            tmeas = _teacher_points(run)
            if tmeas and teacher_mc is not None:
                ax.scatter(tmeas[metric], teacher_mc, color=METHOD_COLORS["teacher"], marker=mk)
            for method, m in _seed_entries(run):
                if "measured" not in m or m["scores"].get("mc_mean") is None:
                    continue  # not verified or not evaluated yet: no point to draw
                x = m["measured"].get(metric)
                y = m["scores"].get("mc_mean")
                err = m["noise"].get(metric, 0.0)
                ax.errorbar(x, y, xerr=err, yerr=m["scores"].get("mc_mean_stderr") or 0.0,
                            fmt=mk, color=METHOD_COLORS.get(method, "gray"),
                            mfc="none" if not m.get("verify_ok") else None, capsize=2)
                ax.annotate(f"{run['budget_fraction']:.0%}", (x, y), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("MC mean (benchmark suite)")
        ax.grid(alpha=0.3)
    shown = {"teacher"} | {k for r in data.get("runs", []) for k in methods_of(r)}
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=n.capitalize() if
                          n == "teacher" else method_label(n))
               for n, c in METHOD_COLORS.items() if n in shown]
    handles += [plt.Line2D([], [], color="gray", marker=markers[i % len(markers)], ls="",
                           label=p) for i, p in enumerate(presets)]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def arch_matrix(arch: dict) -> dict[str, list[int]]:
    """Per-layer heads, KV groups and FFN width (0 = block removed)."""
    heads, kv, ffn = [], [], []
    for layer in arch["layers"]:
        att, mlp = layer.get("attention"), layer.get("ffn")
        heads.append(att["num_heads"] if att else 0)
        kv.append(att["num_kv_heads"] if att else 0)
        ffn.append(mlp["intermediate_size"] if mlp else 0)
    return {"query heads": heads, "KV groups": kv, "FFN width": ffn}


def plot_arch_heatmaps(run: dict, teacher_arch: dict | None, path: Path) -> Path:
    """One panel per quantity; rows = teacher / methods, columns = layers."""
    archs = ([("teacher", teacher_arch)] if teacher_arch else []) + [
        (f"{method_label(k)} s{m.get('seed', 0)}", m["arch"]) for k, m in _seed_entries(run)]
    title = f"{run['preset']} @ {run['budget_fraction']:.0%} ({_limit_text(run)})"
    return plot_heatmaps(archs, title, path)


def plot_heatmaps(archs: list[tuple[str, dict]], title: str, path: Path) -> Path:
    """Per-layer heads, KV groups and FFN widths of ``archs`` (name, ArchSpec dict): one
    panel per quantity, one row per architecture, one column per layer."""
    import numpy as np

    plt = _pyplot()
    mats = [(name, arch_matrix(a), a["hidden_size"]) for name, a in archs]
    quantities = list(mats[0][1])
    fig, axes = plt.subplots(len(quantities), 1, figsize=(8, 1.2 + 1.1 * len(mats) *
                                                           len(quantities)))
    width = max(len(m[quantities[0]]) for _, m, _ in mats)
    for ax, q in zip(axes, quantities, strict=True):
        # Models may differ in depth (Minitron drops whole layers): pad with masked cells.
        grid = np.ma.masked_less([m[q] + [-1] * (width - len(m[q])) for _, m, _ in mats], 0)
        vmax = int(grid.max()) or 1
        ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, aspect="auto")
        for i, row in enumerate(grid.filled(-1).tolist()):
            for j, value in enumerate(row):
                text = "" if value < 0 else (str(value) if value else "–")
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if value < 0.6 * vmax else "black")
        ax.set_yticks(range(len(mats)), [f"{n} (h{h})" for n, _, h in mats], fontsize=8)
        ax.set_xticks(range(width), [str(i) for i in range(width)], fontsize=7)
        ax.set_title(q, fontsize=9)
    axes[-1].set_xlabel("layer of the model (– = block removed, blank = no such layer)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the suptitle
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_predicted_vs_measured(data: dict, path: Path) -> Path:
    """Cost-model prediction vs measurement for every final model (and the teacher)."""
    plt = _pyplot()
    metrics = (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("memory_gb", "memory GB"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4))
    for ax, (metric, label) in zip(axes, metrics, strict=True):
        values = []
        for run in data.get("runs", []):
            points = [("teacher", run.get("teacher_verify") or {})]
            points += [(k, {"predicted": m["predicted"], "measured": m.get("measured"),
                            "noise": m.get("noise", {})})
                       for k, m in _seed_entries(run)]
            for who, p in points:
                if not p.get("predicted") or not p.get("measured"):
                    continue
                x, y = p["predicted"][metric], p["measured"][metric]
                values += [x, y]
                ax.errorbar(x, y, yerr=p.get("noise", {}).get(metric, 0.0), fmt="o",
                            color=METHOD_COLORS.get(who, "gray"), capsize=2)
        if values:
            lo, hi = min(values), max(values)
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
        ax.set_xlabel(f"predicted {label}")
        ax.set_ylabel(f"measured {label}")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=n)
               for n, c in METHOD_COLORS.items()]
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ report


def prediction_rows(data: dict) -> list[str]:
    lines = ["| preset | budget | model | metric | predicted | measured ± noise | error |",
             "|---|---|---|---|---|---|---|"]
    for run in data.get("runs", []):
        points = [("teacher", run.get("teacher_verify") or {})]
        points += [(f"{method_label(k)} s{m.get('seed', 0)}", m) for k, m in _seed_entries(run)]
        for who, p in points:
            if not p.get("predicted") or not p.get("measured"):
                continue
            for metric in ("ttft_ms", "tpot_ms", "memory_gb"):
                pred, meas = p["predicted"][metric], p["measured"][metric]
                err = (pred - meas) / meas if meas else float("nan")
                lines.append(f"| {run['preset']} | {run['budget_fraction']:.0%} | {who} | "
                             f"{metric} | {pred:.4g} | {meas:.4g} ± "
                             f"{p['noise'].get(metric, 0.0):.2g} | {err:+.0%} |")
    return lines


def pick_timing_rows(data: dict) -> list[str]:
    """Each pick's main metric as its method timed it while choosing it (the last pick round
    of that architecture in ``measured_rounds``) against ``verify``'s later reading: a search
    whose timings sit systematically above or below ``verify``'s aims too low or too high."""
    rows = []
    for run in data.get("runs", []):
        metric = run.get("main_metric", "tpot_ms")
        for method, entry in _seed_entries(run):
            picked = [r for r in entry.get("measured_rounds") or []
                      if r.get("stage", "pick") == "pick"
                      and r.get("params") == entry.get("params")]
            verified = (entry.get("measured") or {}).get(metric)
            if not picked or not verified:
                continue
            searched = picked[-1]["measured"][metric]
            rows.append(f"| {run['preset']} | {run['budget_fraction']:.0%} | "
                        f"{method_label(method)} s{entry.get('seed', 0)} | {metric} | "
                        f"{picked[-1]['predicted'][metric]:.4g} | {searched:.4g} | "
                        f"{verified:.4g} | {searched / verified - 1:+.1%} |")
    if not rows:
        return []
    return ["| preset | budget | model | metric | predicted | timed in the search | verify | "
            "search vs verify |", "|---|---|---|---|---|---|---|---|", *rows]


def _settings_text(data: dict) -> str:
    s = data.get("settings", {})
    limit = s.get("eval_limit")
    seeds = s.get("seeds", [s.get("seed", 0)])
    tight = s.get("tight_distill_tokens")
    return (f"Same importance, calibration/training data and distillation budget "
            f"({s.get('distill_tokens')} tokens" + (f", {tight} at the tightest budget"
                                                    if tight else "")
            + f") for every method; seeds {', '.join(map(str, seeds))} (search and "
            "distillation); " + (f"benchmark items capped at {limit} per task; " if limit
                                 else "the full benchmark suite; ")
            + f"search steps {s.get('search_steps')}."
            + (f" More stage options: `{s['options']}`." if s.get("options") else ""))


def _wall_text(data: dict) -> str:
    runs = data.get("invocations", 1)
    which = "the last invocation" if runs == 1 else f"its {runs} invocations, summed,"
    return f"wall time of {which} {data.get('wall_s', 0):.0f} s"


def _grid_wall_text(data: dict) -> str:
    """The cost of a table built from several runs: their summed wall time and the compute
    of every model in it, as each stage recorded it (what an uncached run of the same grid
    would spend, less the teacher's stages, the cost model's fit and the verify timings)."""
    cores = (data.get("machine") or {}).get("cores")
    h = {k: v / 3600 for k, v in compute_parts(data).items()}
    of_search = []  # only what the runs recorded (older files keep one total per search)
    if h["baseline_search"]:
        of_search.append(f"{method_label(baseline_of(data))}'s {h['baseline_search']:.1f} h")
    if h["short_distill"] or h["timing"]:
        of_search.append(f"short distillations {h['short_distill']:.1f} h and timing on the "
                         f"target {h['timing']:.1f} h, where the other searches record them")
    return (f"Wall time: {data.get('invocations')} runs, {data.get('wall_s', 0) / 3600:.1f} h "
            f"summed{f' on {cores} cores' if cores else ''}; search, distillation and "
            f"evaluation of every model in the table {compute_seconds(data) / 3600:.1f} h: "
            f"search {h['search']:.1f} h"
            + (f" ({'; '.join(of_search)})" if of_search else "")
            + f", distillation {h['distill']:.1f} h, evaluation {h['evaluation']:.1f} h")


def _provenance(data: dict) -> str:
    return (f"Target `{data.get('target')}`; teacher `{data.get('teacher', {}).get('dir')}`; "
            f"created {data.get('created')}; {_wall_text(data)} "
            "(stages cached by earlier ones are not in it); "
            f"search + distillation + evaluation of every model, cached or not: "
            f"{compute_seconds(data):.0f} s.")


def comparison_section(title: str, data: dict) -> list[str]:
    """Markdown lines of one more comparison: its settings, table and verdict (no plots)."""
    lines = ["", f"## {title}", ""]
    if data.get("reduced"):
        lines += ["**REDUCED comparison** (fewer presets, budgets or seeds than issue 19 "
                  "asks for).", ""]
    lines += [_provenance(data), _settings_text(data), "", readme_table(data), "### Verdict", ""]
    lines += analysis_text(data) or ["- no run has the baseline and another method yet."]
    picks = selection_lines(data)
    return lines + (["", "### Final picks (each candidate distilled briefly, lowest KL wins)",
                     "", *picks] if picks else [])


def write_report(data: dict, out_dir: str | Path,
                 also: list[tuple[str, dict]] | None = None) -> Path:
    """Write ``report.md`` and its PNGs into ``out_dir``; returns the report path.

    ``also``: more comparisons as ``(title, data)``, each appended as a section with
    its own table and verdict (e.g. a reduced run of the newer methods).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = data.get("runs", [])
    lines = [f"# AutoCompress vs {method_label(baseline_of(data))} and the ablations", ""]
    if data.get("synthetic"):
        lines += ["**SYNTHETIC DATA (test fixture) — not a measurement.**", ""]
    if data.get("reduced"):
        lines += ["**REDUCED comparison** (fewer presets, budgets or seeds than issue 19 "
                  "asks for).", ""]
    lines += [_provenance(data), _settings_text(data), "", "## Results", "",
              readme_table(data), "## Verdict (tighter budgets are what the issue asks about)",
              ""]
    lines += analysis_text(data) or ["- no run has the baseline and another method yet."]
    picks = selection_lines(data)
    if picks:
        lines += ["", "## Final picks (each candidate distilled briefly, lowest KL wins)", "",
                  *picks]
    if data.get("not_run"):
        lines += ["", "Not run:"] + [f"- {n['preset']} @ {n['budget_fraction']:.0%}: "
                                     f"{n['reason']}" for n in data["not_run"]]
    for title, extra in also or []:
        lines += comparison_section(title, extra)
    if runs:
        lines += ["", "## Accuracy vs measured cost", "",
                  "Hollow markers = failed verification on the target; error bars = "
                  "measurement noise (x) and benchmark standard error (y).", "",
                  f"![accuracy vs cost]({plot_accuracy_vs_cost(data, out_dir / 'accuracy_vs_cost.png').name})",  # noqa: E501
                  "", "## Architectures per layer", ""]
        for run in runs:
            name = f"arch_{run['preset']}_{round(100 * run['budget_fraction'])}.png"
            plot_arch_heatmaps(run, data.get("teacher", {}).get("arch"), out_dir / name)
            lines += [f"![{run['preset']} architecture]({name})", ""]
        png = plot_predicted_vs_measured(data, out_dir / "predicted_vs_measured.png")
        lines += ["## Cost model: predicted vs measured", "", f"![predicted vs measured]"
                  f"({png.name})", ""] + prediction_rows(data)
        timing = pick_timing_rows(data)
        if timing:
            lines += ["", "## Each pick as the search timed it and as `verify` did", "",
                      *timing]
    return write_text_atomic(out_dir / "report.md", "\n".join(lines) + "\n")
