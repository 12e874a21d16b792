"""The decisive comparison's verdicts (issue 62), from the campaign's finished units.

The rule is the plan's (``lab/plans/decisive-comparison.md``, amendment 1), applied the same
way whichever side wins. For a comparison A − B over the seeds both sides have (paired by
item and by seed, ``bench.stats.paired_differences``):

- **MC points** on the 1,200 local items (higher is better) and **HumanEval bits/byte** on
  the 164 problems (lower is better, as a share of the teacher's bits/byte), each with an
  interval at the claim's confidence (97.5%; 98.75% for claim 1);
- *A beats B* if either metric clears its bar with its interval on A's side of 0 **and**
  the other metric does not contradict it (B's side with its interval excluding 0); *B
  beats A* by the same test with the signs turned; otherwise *not distinguishable*;
- held-out loss (nats, per window) is reported beside and decides nothing.

    .venv/bin/python -m bench.decisive          # table + results/campaign/decisive.{json,md}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.campaign import RESULTS, Unit, only_method, plan_units, unit_dir
from bench.stats import PairedDiff, paired_differences

MC_TASKS = ("next_line", "identifier", "docstring", "indent")
BPB_TASK = "humaneval_bpb"
HELDOUT_TASK = "heldout_loss"


class Comparison(BaseModel):
    """A − B, each side a method in a kind of unit (``a`` or ``b`` of a seed)."""

    name: str
    a: tuple[str, str]  # (method, unit kind)
    b: tuple[str, str]
    mc_bar: float  # MC points
    bpb_bar: float  # share of the teacher's bits/byte
    confidence: float
    role: str  # "decides", "supports" or "control"


COMPARISONS = (
    Comparison(name="claim 1: greedy − minitron-scored", a=("greedy", "a"),
               b=("minitron-scored", "a"), mc_bar=2.0, bpb_bar=0.02, confidence=0.9875,
               role="decides"),
    Comparison(name="claim 1: autocompress − minitron-scored (across units)",
               a=("autocompress", "b"), b=("minitron-scored", "a"), mc_bar=2.0, bpb_bar=0.02,
               confidence=0.9875, role="supports"),
    Comparison(name="claim 2: autocompress − greedy", a=("autocompress", "b"),
               b=("greedy", "b"), mc_bar=1.0, bpb_bar=0.01, confidence=0.975, role="decides"),
    Comparison(name="control: greedy (unit b) − greedy (unit a)", a=("greedy", "b"),
               b=("greedy", "a"), mc_bar=1.0, bpb_bar=0.01, confidence=0.975, role="control"),
)


# ------------------------------------------------------------------ the rule


def oriented(diff: tuple[float, float, float], sign: int) -> tuple[float, float, float]:
    """(mean, low, high) of ``sign`` × the difference (the interval's ends swap with it)."""
    mean, low, high = diff
    return (mean, low, high) if sign > 0 else (-mean, -high, -low)


def side_wins(mc: tuple[float, float, float], bpb_gain: tuple[float, float, float],
              mc_bar: float, bpb_bar: float) -> bool:
    """Whether the side these differences favour when positive beats the other side."""
    def clears(d, bar):
        return d[0] >= bar and d[1] > 0

    def contradicts(d):
        return d[2] < 0

    return ((clears(mc, mc_bar) and not contradicts(bpb_gain))
            or (clears(bpb_gain, bpb_bar) and not contradicts(mc)))


def verdict(mc: tuple[float, float, float], bpb_gain: tuple[float, float, float],
            mc_bar: float, bpb_bar: float) -> str:
    """``A beats B``, ``B beats A`` or ``not distinguishable``: one test, both directions.

    ``mc``: A − B in MC points; ``bpb_gain``: B's bits/byte − A's, as a share of the
    teacher's (positive: A is better), each (mean, low, high)."""
    if side_wins(oriented(mc, 1), oriented(bpb_gain, 1), mc_bar, bpb_bar):
        return "A beats B"
    if side_wins(oriented(mc, -1), oriented(bpb_gain, -1), mc_bar, bpb_bar):
        return "B beats A"
    return "not distinguishable"


# ------------------------------------------------------------------ the units' files


def side_files(units: list[Unit], side: tuple[str, str], budget: float, results: Path,
               prefix: str) -> dict[int, Path]:
    """seed -> the ``PREFIX_METHOD.json`` of ``side`` (method, unit kind) in finished steps."""
    method, kind = side
    out = {}
    for unit in units:
        if unit.kind != "compare" or unit.budget != budget or not unit.id.endswith(f"-{kind}"):
            continue
        path = unit_dir(unit, results) / f"{prefix}_{method}.json"
        if method in unit.methods and path.exists():
            out[unit.seed] = path
    return out


def side_runs(units: list[Unit], side: tuple[str, str], budget: float,
              results: Path) -> dict[int, dict[str, Any]]:
    """seed -> the evaluation JSON of ``side`` (method, unit kind) in finished steps."""
    return {seed: json.loads(path.read_text())
            for seed, path in side_files(units, side, budget, results, "eval").items()}


def side_archs(units: list[Unit], side: tuple[str, str], budget: float,
               results: Path) -> dict[int, Any]:
    """seed -> the architecture ``side`` (method, unit kind) picked, where its compare ran."""
    out = {}
    for seed, path in side_files(units, side, budget, results, "compare").items():
        picked = only_method(path)[1].get("seeds") or []
        if picked:
            out[seed] = picked[0]["arch"]
    return out


def teacher_bpb(units: list[Unit], budget: float, results: Path) -> float | None:
    """The teacher's HumanEval bits/byte (the same items in every unit: their mean)."""
    values = []
    for unit in units:
        path = unit_dir(unit, results) / "eval_teacher.json"
        if unit.budget == budget and path.exists():
            values.append(json.loads(path.read_text())["tasks"][BPB_TASK]["score"])
    return sum(values) / len(values) if values else None


def _triple(d: PairedDiff, scale: float = 1.0) -> tuple[float, float, float]:
    return (d.mean * scale, d.low * scale, d.high * scale)


def compare(comparison: Comparison, units: list[Unit], budget: float,
            results: Path = RESULTS) -> dict[str, Any]:
    """One comparison over the seeds both sides have: the three metrics and the verdict."""
    a = side_runs(units, comparison.a, budget, results)
    b = side_runs(units, comparison.b, budget, results)
    seeds = sorted(set(a) & set(b))
    row: dict[str, Any] = {"name": comparison.name, "role": comparison.role,
                           "seeds": seeds, "confidence": comparison.confidence}
    teacher = teacher_bpb(units, budget, results)
    if not seeds or teacher is None:
        return {**row, "verdict": "not run yet"}
    runs_a, runs_b = [a[s]["per_item"] for s in seeds], [b[s]["per_item"] for s in seeds]

    def diff(tasks):
        return paired_differences(runs_a, runs_b, tasks, n_boot=2000, seed=0,
                                  paired_seeds=True, confidence=comparison.confidence)["overall"]

    mc_diff, bpb = diff(MC_TASKS), diff([BPB_TASK])
    mc = _triple(mc_diff, 100)
    gain = oriented(_triple(bpb, 1 / teacher), -1)  # B − A: positive when A is better
    heldout = diff([HELDOUT_TASK])
    # Where both sides picked one architecture the difference is nil by construction (one
    # distillation, cached), not a measured tie: the report says so.
    arch_a = side_archs(units, comparison.a, budget, results)
    arch_b = side_archs(units, comparison.b, budget, results)
    same = [s for s in seeds if s in arch_a and arch_a[s] == arch_b.get(s)]
    return {**row, "same_architecture_seeds": same, "mc_points": mc,
            "bpb_diff": _triple(bpb), "bpb_gain_share": gain,
            "heldout_diff": _triple(heldout), "teacher_bpb": teacher,
            "n_items": {"mc": mc_diff.n_items, "bpb": bpb.n_items},
            "verdict": verdict(mc, gain, comparison.mc_bar, comparison.bpb_bar),
            "decisive": seeds == [0, 1, 2]}


def method_hours(units: list[Unit], results: Path = RESULTS) -> list[dict[str, Any]]:
    """Compute hours per method and unit: its flow's stages and its decisive evaluation."""
    rows = []
    for unit in units:
        here = unit_dir(unit, results)
        steps = (json.loads((here / "unit.json").read_text()).get("steps", {})
                 if (here / "unit.json").exists() else {})
        for method in unit.methods:
            compare_s = steps.get(f"{method} compare", {}).get("seconds")
            if compare_s is None:
                continue
            seed = only_method(here / f"compare_{method}.json")[1]["seeds"][0]
            rows.append({"unit": unit.id, "method": method, "compare_h": compare_s / 3600,
                         "stages_s": seed["timings"],
                         "eval_h": steps.get(f"{method} eval", {}).get("seconds", 0) / 3600})
    return rows


# ------------------------------------------------------------------ report


def _fmt(t, spec) -> str:
    return f"{t[0]:{spec}} [{t[1]:{spec}}, {t[2]:{spec}}]"


def report_markdown(rows: list[dict[str, Any]], hours: list[dict[str, Any]],
                    budget: float) -> str:
    lines = [f"## The decisive comparison at {budget:.0%} (plan amendment 1)", "",
             "| comparison | role | seeds | MC points | HumanEval bits/byte (share of the "
             "teacher's, + = A better) | held-out loss (nats) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "mc_points" not in r:
            lines.append(f"| {r['name']} | {r['role']} | – | – | – | – | {r['verdict']} |")
            continue
        status = "" if r["decisive"] else " (not decisive: seeds 0, 1, 2 are not all in)"
        if r.get("same_architecture_seeds"):
            status += ("; the same architecture on both sides for seed(s) "
                       + ", ".join(map(str, r["same_architecture_seeds"])))
        gain = [100 * x for x in r["bpb_gain_share"]]
        lines.append(
            f"| {r['name']} | {r['role']} | {', '.join(map(str, r['seeds']))} | "
            f"{_fmt(r['mc_points'], '+.1f')} | {_fmt(gain, '+.1f')}% | "
            f"{_fmt(r['heldout_diff'], '+.3f')} | {r['verdict']}{status} |")
    levels = ", ".join(sorted({f"{r['confidence']:.2%}" for r in rows}))
    lines += ["", f"Intervals: {levels} percentile bootstraps, paired by item and seed.", "",
              "| unit | method | compare (h) | of which search/selection (h) | distillation (h) "
              "| decisive eval (h) |", "|---|---|---|---|---|---|"]
    for h in hours:
        arch_h, distill_h = ((h["stages_s"].get(k) or 0) / 3600 for k in ("arch_s", "distill_s"))
        lines.append(f"| {h['unit']} | {h['method']} | {h['compare_h']:.2f} | {arch_h:.2f} | "
                     f"{distill_h:.2f} | {h['eval_h']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.decisive", description=__doc__.split("\n")[0])
    p.add_argument("--budget", type=float, default=0.5, help="The cell (default 0.5).")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    from autocompress.atomic import write_json_atomic, write_text_atomic

    units = plan_units()
    rows = [compare(c, units, args.budget, args.results) for c in COMPARISONS]
    hours = method_hours(units, args.results)
    text = report_markdown(rows, hours, args.budget)
    print(text)
    tag = f"{args.budget * 100:.0f}"
    write_json_atomic(args.results / f"decisive_{tag}.json",
                      {"budget": args.budget, "comparisons": rows, "hours": hours})
    write_text_atomic(args.results / f"decisive_{tag}.md", text + "\n")
    return {"comparisons": rows, "hours": hours}


if __name__ == "__main__":
    main()
