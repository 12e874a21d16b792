"""What predicts a candidate's quality after the short distillation?

Every search (and every ablation) ends by distilling its short list of candidates
for the same small token budget and keeping the lowest KL to the teacher
(``search.selection``). The search itself ranks architectures before any training:
DNAS and repair minimise the masked teacher's KL right after pruning. This script
asks, over every short list recorded in the committed comparison JSONs, how well
quantities known *before* training rank the candidates *after* the short
distillation:

- ``pruned_kl``: the KL right after pruning (what the search minimises);
- ``params``: parameters kept (more is better: ranked by ``-params``);
- ``blocks``: attention and FFN blocks kept (more is better).

- ``attention_blocks``: attention blocks kept (fewer ranked better: on SmolLM2 the
  teacher's side removes more and recovers better). Recorded since 2026-12-05;
  derived from the choices in search reports (``arch.search.json``, which this
  also reads: ``lab/results/diagnostics/``);
- ``fitted_params``, ``fitted_attention``: ``a·pruned_kl + b·log(params)`` and
  ``a·pruned_kl + b·attention_blocks``, the two fitted by least squares within the
  *other* searches of the same teacher (each search's mean removed; leave one
  search out), i.e. what a search objective with a calibrated term for the
  parameters (or attention blocks) kept would rank by.

The search's short list has two sides: candidates repaired from DNAS's answer and
candidates repaired from the teacher (their ``origin`` starts with "teacher").
Within the searches that short-listed both, it fits ``kl ≈ a·pruned_kl + c·side``
(side = 1 on DNAS's side): ``c`` is how much worse DNAS's candidates end after the
short distillation than their KL right after pruning predicts.

Per search it takes the Spearman correlation of each predictor with the short
distillation's KL, whether the predictor's first choice was the best candidate,
and its regret (its first choice's KL minus the best). The fits on all of a
teacher's searches are printed with bootstrap intervals over searches. Searches
are grouped by teacher (by its parameter count); a short list recorded in two
files (a re-timed copy) counts once.

    .venv/bin/python -m lab.recovery_predictors            # every recorded short list
    .venv/bin/python -m lab.recovery_predictors --methods autocompress greedy
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import short_list_side
from bench.stats import spearman

ROOT = Path(__file__).resolve().parents[1]
TEACHERS = {7_082_240: "bundled 7M", 134_515_008: "SmolLM2-135M"}


def _search_side(row: dict[str, Any]) -> float:
    return float(short_list_side(row) == "search")


# What a row may be ranked or fitted by; lower ranked better after the sign.
FEATURES: dict[str, Callable[[dict[str, Any]], float]] = {
    "pruned_kl": lambda r: float(r["pruned_kl"]),
    "params": lambda r: -float(r["params"]),
    "blocks": lambda r: -float(r["blocks"]),
    "attention_blocks": lambda r: float(r["attention_blocks"]),
    "log_params": lambda r: float(np.log(r["params"])),
    "search_side": _search_side,
}
FITTED = {"fitted_params": "log_params", "fitted_attention": "attention_blocks"}
PREDICTORS = ("pruned_kl", "params", "blocks", "attention_blocks", *FITTED)


# ------------------------------------------------------------------ reading


def short_lists(paths: list[Path]) -> list[dict[str, Any]]:
    """One entry per distinct recorded short list with at least three distilled rows; of a
    list recorded twice, the copy whose rows say more (their attention blocks) is kept."""
    found: dict[tuple, dict[str, Any]] = {}
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for meta, rows in _recorded(data) if isinstance(data, dict) else ():
            rows = [r for r in rows if r.get("kl") is not None and r.get("pruned_kl") is not None]
            if len(rows) < 3:
                continue
            key = tuple((r["params"], round(r["pruned_kl"], 6), round(r["kl"], 6)) for r in rows)
            if key not in found:
                found[key] = {"file": path.name, **meta, "rows": rows}
            elif _has(rows, "attention_blocks") and not _has(found[key]["rows"],
                                                              "attention_blocks"):
                found[key]["rows"] = rows
    return list(found.values())


def _recorded(data: dict[str, Any]):
    """(meta, rows) of each short list in a comparison JSON or a search report."""
    if isinstance(data.get("selection"), list) and "space" in data:  # arch.search.json
        no_op = [name == "no-op" for name in data["space"]["attention"]]
        rows = [dict(r, attention_blocks=sum(not no_op[a] for a in r["choice"]["attention"]))
                if "choice" in r else r for r in data["selection"]]
        workload = data.get("workload")
        yield ({"method": {"search": "autocompress"}.get(data.get("kind"), data.get("kind")),
                "seed": None, "budget": None,
                "preset": workload.get("name") if isinstance(workload, dict) else workload,
                "teacher": _teacher_name(data.get("teacher_params"))}, rows)
        return
    for run in data.get("runs", []):
        for method, entry in run.get("methods", {}).items():
            for seed in entry.get("seeds", []):
                yield ({"method": method, "seed": seed["seed"], "preset": run.get("preset"),
                        "budget": run.get("budget_fraction"),
                        "teacher": _teacher_name(seed.get("teacher_params"))},
                       seed.get("selection") or [])


def _teacher_name(params: int | None) -> str:
    return TEACHERS.get(params, f"{params} parameters")


def _has(rows: list[dict[str, Any]], feature: str) -> bool:
    if feature == "search_side":
        return len({_search_side(r) for r in rows}) == 2
    if feature in ("attention_blocks", "log_params", "params", "blocks"):
        key = "params" if feature == "log_params" else feature
        return all(r.get(key) is not None for r in rows)
    return True


# ------------------------------------------------------------------ statistics


def _centred(entry: dict[str, Any], features: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Within-search (mean removed) features and short-distillation KL."""
    x = np.array([[FEATURES[f](r) for f in features] for r in entry["rows"]])
    y = np.array([r["kl"] for r in entry["rows"]])
    return x - x.mean(0), y - y.mean()


def fit(entries: list[dict[str, Any]], features: tuple[str, ...] = ("pruned_kl", "log_params")
        ) -> np.ndarray:
    """Least squares ``kl ≈ Σ coef·feature`` within searches (each search's mean removed)."""
    parts = [_centred(e, features) for e in entries]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return np.linalg.lstsq(x, y, rcond=None)[0]


def bootstrap_fit(entries: list[dict[str, Any]], features: tuple[str, ...], n_boot: int = 2000,
                  seed: int = 0) -> dict[str, Any] | None:
    """``fit`` on the entries that have every feature, with a bootstrap over searches."""
    usable = [e for e in entries if all(_has(e["rows"], f) for f in features)]
    if len(usable) < 2:
        return None
    coef = fit(usable, features)
    rng = np.random.default_rng(seed)
    reps = np.array([fit([usable[i] for i in rng.integers(0, len(usable), len(usable))],
                         features) for _ in range(n_boot)])
    low, high = np.percentile(reps, [2.5, 97.5], axis=0)
    return {"coefficients": {f: round(float(c), 4) for f, c in zip(features, coef, strict=True)},
            "intervals": {f: [round(float(lo), 4), round(float(hi), 4)]
                          for f, lo, hi in zip(features, low, high, strict=True)},
            "searches": len(usable), "rows": sum(len(e["rows"]) for e in usable)}


def side_gap(entries: list[dict[str, Any]], **kwargs) -> dict[str, Any] | None:
    """``kl ≈ a·pruned_kl + c·side`` within the searches that short-listed both sides: ``c``
    is how much worse DNAS's side ends than its KL right after pruning says."""
    return bootstrap_fit(entries, ("pruned_kl", "search_side"), **kwargs)


# ------------------------------------------------------------------ per search


def predictor_values(entry: dict[str, Any], name: str,
                     coef: dict[str, np.ndarray]) -> np.ndarray | None:
    """The predictor's value per candidate, lower = predicted better (None: not available)."""
    rows = entry["rows"]
    if name in FITTED:
        features = ("pruned_kl", FITTED[name])
        if name not in coef or not _has(rows, FITTED[name]):
            return None
        x = np.array([[FEATURES[f](r) for f in features] for r in rows])
        return x @ coef[name]
    if not _has(rows, name):
        return None
    return np.array([FEATURES[name](r) for r in rows])


def per_search(entry: dict[str, Any], coef: dict[str, np.ndarray]) -> dict[str, Any]:
    """Each available predictor's rank correlation, hit and regret on one short list
    (``coef``: the fitted predictors' coefficients, from the other searches)."""
    kl = np.array([r["kl"] for r in entry["rows"]])
    out: dict[str, Any] = {k: entry[k] for k in ("file", "method", "seed", "preset", "budget",
                                                 "teacher")}
    out["candidates"], out["best_kl"] = len(kl), float(kl.min())
    for name in PREDICTORS:
        score = predictor_values(entry, name, coef)
        if score is None:
            continue
        first = int(np.argmin(score))
        out[name] = {"spearman": round(spearman(score, kl), 4),
                     "hit": bool(kl[first] == kl.min()),
                     "regret": round(float(kl[first] - kl.min()), 4)}
    return out


def leave_one_out(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``per_search`` of every entry, its fitted predictors fitted on the others of its
    teacher that have the feature."""
    out = []
    for i, entry in enumerate(entries):
        coef = {}
        for name, feature in FITTED.items():
            others = [e for j, e in enumerate(entries) if j != i
                      and e["teacher"] == entry["teacher"] and _has(e["rows"], feature)]
            if len(others) >= 2:
                coef[name] = fit(others, ("pruned_kl", feature))
        out.append(per_search(entry, coef))
    return out


def summarize(searches: list[dict[str, Any]], entries: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, Any] = {}
    for teacher in sorted({s["teacher"] for s in searches}):
        mine = [s for s in searches if s["teacher"] == teacher]
        group: dict[str, Any] = {"searches": len(mine), "predictors": {}}
        for name in PREDICTORS:
            have = [s for s in mine if name in s]
            if not have:
                continue
            rho = np.array([s[name]["spearman"] for s in have])
            rho = rho[np.isfinite(rho)]
            group["predictors"][name] = {
                "searches": len(have),
                "spearman_median": round(float(np.median(rho)), 3) if len(rho) else None,
                "spearman_quartiles": [round(float(q), 3) for q in np.percentile(rho, [25, 75])]
                if len(rho) else None,
                "hits": sum(s[name]["hit"] for s in have),
                "mean_regret": round(float(np.mean([s[name]["regret"] for s in have])), 4)}
        of_teacher = [e for e in entries if e["teacher"] == teacher]
        group["fits"] = {name: bootstrap_fit(of_teacher, ("pruned_kl", feature))
                         for name, feature in FITTED.items()}
        group["search_side"] = side_gap(of_teacher)
        groups[teacher] = group
    return groups


def print_table(groups: dict[str, Any]) -> None:
    print("predictor of the short distillation's KL, within each short list "
          "(Spearman rho: median [quartiles]; hits: its first choice was the best; regret: nats)")
    print(f"{'teacher':<14} {'predictor':<17} {'rho':>22} {'hits':>8} {'regret':>8}")
    for teacher, group in groups.items():
        for name, row in group["predictors"].items():
            quart = row["spearman_quartiles"] or [float("nan")] * 2
            median = row["spearman_median"] if row["spearman_median"] is not None else float("nan")
            print(f"{teacher:<14} {name:<17} {median:>+6.2f} [{quart[0]:+.2f}, {quart[1]:+.2f}]"
                  f" {row['hits']:>4}/{row['searches']:<3} {row['mean_regret']:>8.3f}")
        for name, result in [*group["fits"].items(), ("search side", group["search_side"])]:
            if result is None:
                continue
            terms = " ".join(f"{c:+.3f}·{f} {result['intervals'][f]}"
                             for f, c in result["coefficients"].items())
            print(f"{'':<14} {name} fit: kl ≈ {terms} ({result['searches']} searches, "
                  f"{result['rows']} candidates)")


def default_inputs() -> list[Path]:
    """Every recorded short list: the published comparisons (results/), the superseded runs
    beside them (lab/results/) and the search reports of the diagnostics."""
    return (sorted((ROOT / "results").glob("*.json"))
            + sorted((ROOT / "lab/results").glob("compare_*.json"))
            + sorted((ROOT / "lab/results/diagnostics").glob("*.search.json")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, nargs="*", default=None,
                        help="comparison JSONs or search reports to read (default: every "
                        "results/*.json, lab/results/compare_*.json and "
                        "lab/results/diagnostics/*.search.json)")
    parser.add_argument("--methods", nargs="*", default=None,
                        help="only these methods' short lists (e.g. autocompress greedy)")
    parser.add_argument("--out", type=Path, default=ROOT / "lab/results/recovery_predictors.json")
    args = parser.parse_args(argv)
    paths = args.json or default_inputs()
    entries = [e for e in short_lists(paths) if not args.methods or e["method"] in args.methods]
    if not entries:
        parser.error("no short list with distilled candidates in the given JSONs")
    searches = leave_one_out(entries)
    groups = summarize(searches, entries)
    print_table(groups)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"groups": groups, "searches": searches,
                                    "files": [p.name for p in paths]}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
