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

- ``fitted``: ``a·pruned_kl + b·log(params)``, the two fitted by least squares
  within the *other* searches of the same teacher (each search's mean removed;
  leave one search out), i.e. what a search objective with a calibrated term for
  the parameters kept would rank by.

The search's short list has two sides: candidates repaired from DNAS's answer and
candidates repaired from the teacher (their ``origin`` starts with "teacher").
Within the searches that short-listed both, it fits ``kl ≈ a·pruned_kl + c·side``
(side = 1 on DNAS's side): ``c`` is how much worse DNAS's candidates end after the
short distillation than their KL right after pruning predicts.

Per search it takes the Spearman correlation of each predictor with the short
distillation's KL, whether the predictor's first choice was the best candidate,
and its regret (its first choice's KL minus the best). The fit on all of a
teacher's searches is printed with a bootstrap interval over searches. Searches
are grouped by teacher (by its parameter count); a short list recorded in two
files (a re-timed copy) counts once.

    .venv/bin/python bench/recovery_predictors.py            # every results/*.json
    .venv/bin/python bench/recovery_predictors.py --methods autocompress greedy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PREDICTORS = ("pruned_kl", "params", "blocks", "fitted")
HIGHER_IS_BETTER = {"params", "blocks"}
TEACHERS = {7_082_240: "bundled 7M", 134_515_008: "SmolLM2-135M"}


def short_lists(paths: list[Path]) -> list[dict[str, Any]]:
    """One entry per distinct recorded short list with at least three distilled rows."""
    seen, found = set(), []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for run in data.get("runs", []):
            for method, entry in run.get("methods", {}).items():
                for seed in entry.get("seeds", []):
                    rows = [r for r in seed.get("selection") or []
                            if r.get("kl") is not None and r.get("pruned_kl") is not None]
                    key = tuple((r["params"], round(r["pruned_kl"], 6), round(r["kl"], 6))
                                for r in rows)
                    if len(rows) < 3 or key in seen:
                        continue
                    seen.add(key)
                    found.append({"file": path.name, "method": method, "seed": seed["seed"],
                                  "preset": run.get("preset"), "budget": run.get("budget_fraction"),
                                  "teacher": _teacher_name(seed.get("teacher_params")),
                                  "rows": rows})
    return found


def _teacher_name(params: int | None) -> str:
    return TEACHERS.get(params, f"{params} parameters")


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (Spearman's convention)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _features(entry: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Within-search (mean removed) ``[pruned_kl, log(params)]`` and short-distillation KL."""
    x = np.array([[r["pruned_kl"], np.log(r["params"])] for r in entry["rows"]])
    y = np.array([r["kl"] for r in entry["rows"]])
    return x - x.mean(0), y - y.mean()


def fit(entries: list[dict[str, Any]]) -> np.ndarray:
    """Least squares ``kl ≈ a·pruned_kl + b·log(params)`` within searches: ``[a, b]``."""
    parts = [_features(e) for e in entries]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return np.linalg.lstsq(x, y, rcond=None)[0]


def predictor_values(entry: dict[str, Any], name: str, coef: np.ndarray | None) -> np.ndarray:
    """The predictor's value per candidate, lower = predicted better."""
    rows = entry["rows"]
    if name == "fitted":
        return np.array([coef[0] * r["pruned_kl"] + coef[1] * np.log(r["params"]) for r in rows])
    values = np.array([float(r[name]) for r in rows])
    return -values if name in HIGHER_IS_BETTER else values


def per_search(entry: dict[str, Any], coef: np.ndarray | None) -> dict[str, Any]:
    """Each predictor's rank correlation, hit and regret on one short list (``coef``: the
    fitted predictor's coefficients, from the other searches; None leaves it out)."""
    kl = np.array([r["kl"] for r in entry["rows"]])
    out: dict[str, Any] = {k: entry[k] for k in ("file", "method", "seed", "preset", "budget",
                                                 "teacher")}
    out["candidates"], out["best_kl"] = len(kl), float(kl.min())
    for name in PREDICTORS:
        if name == "fitted" and coef is None:
            continue
        score = predictor_values(entry, name, coef)
        first = int(np.argmin(score))
        out[name] = {"spearman": round(spearman(score, kl), 4),
                     "hit": bool(kl[first] == kl.min()),
                     "regret": round(float(kl[first] - kl.min()), 4)}
    return out


def leave_one_out(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``per_search`` of every entry, its fitted predictor fitted on the others of its teacher."""
    out = []
    for i, entry in enumerate(entries):
        others = [e for j, e in enumerate(entries) if j != i and e["teacher"] == entry["teacher"]]
        out.append(per_search(entry, fit(others) if len(others) >= 2 else None))
    return out


def exchange_rate(entries: list[dict[str, Any]], n_boot: int = 2000, seed: int = 0
                  ) -> dict[str, Any]:
    """``fit`` on all ``entries``, bootstrapped over searches."""
    a, b = fit(entries)
    rng = np.random.default_rng(seed)
    reps = np.array([fit([entries[i] for i in rng.integers(0, len(entries), len(entries))])
                     for _ in range(n_boot)])
    low, high = np.percentile(reps, [2.5, 97.5], axis=0)
    return {"a_pruned_kl": round(float(a), 4), "a_interval": [round(float(low[0]), 4),
                                                              round(float(high[0]), 4)],
            "b_log_params": round(float(b), 4), "b_interval": [round(float(low[1]), 4),
                                                              round(float(high[1]), 4)],
            "searches": len(entries), "rows": sum(len(e["rows"]) for e in entries)}


def _search_side(row: dict[str, Any]) -> float:
    return 0.0 if str(row.get("origin", "")).startswith("teacher") else 1.0


def side_gap(entries: list[dict[str, Any]], n_boot: int = 2000, seed: int = 0
             ) -> dict[str, Any] | None:
    """Within searches that short-listed both sides, least squares
    ``kl ≈ a·pruned_kl + c·side``, bootstrapped over searches (None: no such search)."""
    parts = []
    for entry in entries:
        side = np.array([_search_side(r) for r in entry["rows"]])
        if side.min() == side.max():
            continue
        x = np.column_stack([[r["pruned_kl"] for r in entry["rows"]], side])
        y = np.array([r["kl"] for r in entry["rows"]])
        parts.append((x - x.mean(0), y - y.mean()))
    if len(parts) < 2:
        return None

    def solve(chosen) -> np.ndarray:
        return np.linalg.lstsq(np.concatenate([parts[i][0] for i in chosen]),
                               np.concatenate([parts[i][1] for i in chosen]), rcond=None)[0]

    a, c = solve(range(len(parts)))
    rng = np.random.default_rng(seed)
    reps = np.array([solve(rng.integers(0, len(parts), len(parts))) for _ in range(n_boot)])
    low, high = np.percentile(reps, [2.5, 97.5], axis=0)
    return {"a_pruned_kl": round(float(a), 4), "c_search_side": round(float(c), 4),
            "c_interval": [round(float(low[1]), 4), round(float(high[1]), 4)],
            "searches": len(parts)}


def summarize(searches: list[dict[str, Any]], entries: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, Any] = {}
    for teacher in sorted({s["teacher"] for s in searches}):
        mine = [s for s in searches if s["teacher"] == teacher]
        group: dict[str, Any] = {"searches": len(mine)}
        for name in PREDICTORS:
            if not all(name in s for s in mine):
                continue
            rho = np.array([s[name]["spearman"] for s in mine])
            rho = rho[np.isfinite(rho)]
            group[name] = {
                "spearman_median": round(float(np.median(rho)), 3) if len(rho) else None,
                "spearman_quartiles": [round(float(q), 3) for q in np.percentile(rho, [25, 75])]
                if len(rho) else None,
                "hits": sum(s[name]["hit"] for s in mine),
                "mean_regret": round(float(np.mean([s[name]["regret"] for s in mine])), 4)}
        of_teacher = [e for e in entries if e["teacher"] == teacher]
        group["fit"] = exchange_rate(of_teacher)
        group["search_side"] = side_gap(of_teacher)
        groups[teacher] = group
    return groups


def print_table(groups: dict[str, Any]) -> None:
    print("predictor of the short distillation's KL, within each short list "
          "(Spearman rho: median [quartiles]; hits: its first choice was the best; regret: nats)")
    print(f"{'teacher':<14} {'searches':>8}  {'predictor':<10} {'rho':>22} {'hits':>8} "
          f"{'regret':>8}")
    for teacher, group in groups.items():
        for name in (p for p in PREDICTORS if p in group):
            row = group[name]
            quart = row["spearman_quartiles"] or [float("nan")] * 2
            print(f"{teacher:<14} {group['searches']:>8}  {name:<10} "
                  f"{row['spearman_median']:>+6.2f} [{quart[0]:+.2f}, {quart[1]:+.2f}]"
                  f" {row['hits']:>4}/{group['searches']:<3} {row['mean_regret']:>8.3f}")
        fit = group["fit"]
        print(f"{'':<14} within-search fit: kl ≈ {fit['a_pruned_kl']:+.3f}·pruned_kl "
              f"{fit['a_interval']} {fit['b_log_params']:+.3f}·log(params) {fit['b_interval']}"
              f" ({fit['rows']} candidates)")
        gap = group["search_side"]
        if gap:
            print(f"{'':<14} DNAS's side vs the teacher's at equal KL right after pruning: "
                  f"{gap['c_search_side']:+.3f} nats {gap['c_interval']} after the short "
                  f"distillation ({gap['searches']} searches with both sides)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, nargs="*", default=None,
                        help="comparison JSONs to read (default: every results/*.json)")
    parser.add_argument("--methods", nargs="*", default=None,
                        help="only these methods' short lists (e.g. autocompress greedy)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/recovery_predictors.json")
    args = parser.parse_args(argv)
    paths = args.json if args.json else sorted((ROOT / "results").glob("*.json"))
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
