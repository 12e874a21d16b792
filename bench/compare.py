"""AutoCompress vs the fair Minitron baseline and the ablations, over seeds (issues 8, 19).

For each CPU-scaled workload preset, each budget (a fraction of the teacher's
*predicted* cost on the preset's main metric), each seed and each method
(``autocompress`` the full search; ``minitron`` the fair homogeneous baseline;
``greedy`` repair from the teacher without DNAS; ``random`` random search with
the same number of scored candidates), this runs the ``compress`` Prefect flow
users run (through ``flows/sweep.py``): profile, fit and validate the cost model,
importance, the method's architecture, prune, distil (the same token budget and
seed for every method), evaluate and verify on the target. Every method shares
the teacher, the corpus, the cost model, the importance scores and the teacher's
evaluation: the flow's stage cache computes each once, and a re-run (or an
interrupted one) reuses every finished stage. The seed sets the search's and the
distillation's seeds. This script keeps no cache and no stages of its own; it
turns the flows' outputs (with every model's per-item benchmark scores) into
``results/compare.json``, which ``autocompress bench report`` and ``readme-table``
read (paired bootstrap intervals vs the baseline: ``bench.stats``).

    .venv/bin/python -m bench.compare                 # every preset, budget, method, 3 seeds
    .venv/bin/python -m bench.compare --presets interactive-cpu --budgets 0.4 --seeds 0 1 \
        --distill-tokens 50000 --eval-limit 100 --search-steps 80   # a quick look
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autocompress.errors import AutoCompressError
from autocompress.limits import HOST_DRIFT, HOST_REFUSAL, HOST_REFUSAL_HINT
from bench.report import analysis_text, cells_with_limits, load_compare, readme_table, write_report

PRESETS = ("local-coding-cpu", "datacenter-cpu", "interactive-cpu")
METHODS = ("autocompress", "minitron", "greedy", "random")  # flows.compress.METHODS
ABLATIONS = ("greedy", "random")  # what --ablation-seeds applies to
TOKENS_PER_STEP = 16 * 256  # the distillation batch below
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------ the flows


def distill_tokens(args: argparse.Namespace, fraction: float) -> int:
    """The distillation budget of a run: ``--tight-distill-tokens`` at the tightest budget."""
    if args.tight_distill_tokens and fraction == min(args.budgets):
        return args.tight_distill_tokens
    return args.distill_tokens


def stage_options(args: argparse.Namespace, seed: int, fraction: float) -> dict[str, dict]:
    """Per-stage settings of one compress run (``compress(options=...)``), checked."""
    from autocompress.stage_config import check_options, parse_options

    tokens = distill_tokens(args, fraction)
    steps = max(1, -(-tokens // TOKENS_PER_STEP))
    options: dict[str, dict[str, Any]] = {
        # One cost model for every preset of the comparison (fitted once, then reused).
        "costmodel": {"workloads": list(args.presets)},
        # The search seed drives DNAS, the random sampler, the score batches and
        # Minitron's short distillations; the distillation seed its data order and init.
        "search": {"dnas": {"steps": args.search_steps, "seed": seed},
                   "threads": args.threads},
        "distill": {"tokens": tokens, "seq_len": 256, "batch_size": 16,
                    "lr": args.lr, "warmup_steps": max(1, steps // 10), "eval_batches": 2,
                    "ckpt_every": 10, "seed": seed},
        "verify": {"repeats": args.verify_repeats},
    }
    return check_options(_merged(options, parse_options(args.options)))


def method_seeds(args: argparse.Namespace, method: str) -> list[int]:
    """The seeds ``method`` runs: ``--ablation-seeds`` for the ablations when given."""
    if method in ABLATIONS and args.ablation_seeds is not None:
        return args.ablation_seeds
    return args.seeds


def earlier_cells(args: argparse.Namespace) -> dict[tuple[str, float], dict[str, Any]]:
    """``--limits-from``: each cell of an earlier comparison's JSON (its limits and the
    teacher's reading there), so that a method added later on this machine runs under the
    very same limits and its results join that file's in one table
    (``bench report --json FILE:METHOD``)."""
    if not args.limits_from:
        return {}

    found = cells_with_limits(load_compare(args.limits_from), args.limits_from)
    missing = [f"{p} @ {f:g}" for p in args.presets for f in args.budgets
               if (p, f) not in found]
    if missing:
        raise AutoCompressError(f"{args.limits_from} has no limits for {', '.join(missing)}",
                                hint="run only the presets and budgets that file has")
    return found


def sweep_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One compress run per preset × budget × seed × method (seed 0 of every cell first,
    so an interrupted comparison has whole cells to show). With ``--limits-from`` a run
    gets that file's limits for its cell instead of its budget fraction."""
    seeds = sorted({s for m in args.methods for s in method_seeds(args, m)})
    fixed = earlier_cells(args)

    def cell(preset: str, fraction: float) -> dict[str, Any]:
        if not fixed:
            return {"budget_fraction": fraction}
        earlier = fixed[(preset, fraction)]
        there = (earlier.get("teacher_verify") or {}).get("measured")
        if not there or args.allow_host_drift:
            return {"limits": earlier["limits"]}
        # The flow stops after timing the teacher if this host reads it HOST_DRIFT away.
        return {"limits": earlier["limits"],
                "limits_origin": {"from": Path(args.limits_from).name,
                                  "teacher_measured": there}}

    return [{"label": run_label(preset, fraction, method, seed), "workload": preset,
             **cell(preset, fraction), "method": method,
             "options": stage_options(args, seed, fraction)}
            for seed in seeds for preset in args.presets for fraction in args.budgets
            for method in args.methods if seed in method_seeds(args, method)]


def run_label(preset: str, fraction: float, method: str, seed: int) -> str:
    return f"{preset}-{fraction:g}-{method}-s{seed}"


def run_fraction(point, args: argparse.Namespace) -> float:
    """The budget (cell) a sweep point belongs to, with or without ``--limits-from``."""
    if "budget_fraction" in point.overrides:
        return point.overrides["budget_fraction"]
    return next(f for f in args.budgets for m in args.methods for s in method_seeds(args, m)
                if point.label == run_label(point.overrides["workload"], f, m, s))


def _merged(base: dict, extra: dict) -> dict:
    """``extra`` over ``base``, nested dicts merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def run_sweep(args: argparse.Namespace):
    """``flows.sweep.sweep`` over presets × budgets × methods; returns its SweepReport."""
    from autocompress.commands.pipeline import _prepare_environment

    runs = sweep_runs(args)  # every run's options checked before any stage runs
    _prepare_environment()  # Prefect's home and telemetry, before Prefect is imported
    from flows.compress import METHODS as FLOW_METHODS
    from flows.sweep import sweep

    unknown = [m for m in args.methods if m not in FLOW_METHODS]
    if unknown:
        raise AutoCompressError(f"unknown method(s) {', '.join(unknown)}",
                                hint=f"the compress flow has {', '.join(FLOW_METHODS)}")
    base = {"teacher": args.teacher, "target": args.target, "eval_limit": args.eval_limit,
            "register_as": None, "corpus_dir": args.corpus, "track": not args.no_track}
    return sweep(runs=runs, base=base, experiment=args.experiment, store=args.store)


# ------------------------------------------------------------------ flow outputs -> JSON


def _json(ref) -> dict:
    """The JSON artifact behind ``ref`` (a file, or ``name`` inside a directory)."""
    from autocompress.artifacts import fetch

    return json.loads(fetch(ref).read_text())


def _search_report(arch_ref) -> dict:
    from autocompress.artifacts import fetch

    return json.loads((fetch(arch_ref) / "arch.search.json").read_text())


def _distill_record(model_ref) -> dict:
    from autocompress.artifacts import fetch

    return json.loads((fetch(model_ref) / "distill.json").read_text())


def _scores(evaluation: dict) -> dict:
    """The benchmark suite's headline numbers, as compare.json records them."""
    return {
        "mc_mean": evaluation.get("mc_mean"), "mc_mean_stderr": evaluation.get("mc_mean_stderr"),
        "mc_chance_mean": evaluation.get("mc_chance_mean"),
        "tasks": {k: {"score": v.get("score"), "stderr": v.get("stderr"), "n": v.get("n")}
                  for k, v in evaluation.get("tasks", {}).items()},
        "heldout_loss": evaluation.get("heldout_loss"),
        "heldout_loss_stderr": evaluation.get("heldout_loss_stderr"),
        "bits_per_byte": evaluation.get("bits_per_byte"),
        "next_token_acc": evaluation.get("next_token_acc"),
        "seconds": sum((evaluation.get("details") or {}).get("timings_s", {}).values()),
    }


def _verify_summary(report: dict) -> dict:
    return {"measured": report["measured"], "noise": report["noise"],
            "predicted": report["predicted"], "ok": report["ok"],
            "prediction_error": report["prediction_error"]}


def run_seed(point) -> int:
    """The seed of a sweep point (its distillation seed; the search's is the same)."""
    return int(point.overrides["options"]["distill"]["seed"])


def method_entry(point) -> dict:
    """What compare.json records for one method's compress run (one seed)."""
    out = point.outputs
    report = _search_report(out["arch"])
    record = _distill_record(out["model"])
    verification = _json(out["verification"])
    seconds = {s["name"]: s["seconds"] for s in point.steps}
    evaluation = _json(out["evaluation"])
    scores = _scores(evaluation)
    # Held-out loss before and after distillation on the same windows (distill's evals).
    scores["heldout_loss_pruned"] = record["initial_eval"].get("heldout_loss")
    scores["heldout_loss_distilled"] = record["final_eval"].get("heldout_loss")
    return {
        "seed": run_seed(point), "arch": report["arch"], "params": report["params"],
        "teacher_params": report.get("teacher_params"), "predicted": report["predicted"],
        "meets_limits_predicted": report["meets_limits"], "margins": report.get("margins"),
        "search_seconds": report.get("seconds"),
        "scored_candidates": report.get("scored_candidates"),
        "selection": selection_record(report),
        "measured_rounds": report.get("measured_rounds", []),  # the search's own timings
        "timings": {"arch_s": seconds.get("arch"), "distill_s": seconds.get("model"),
                    "eval_s": seconds.get("evaluation"), "verify_s": seconds.get("verification")},
        "files": {"arch": out["arch"].uri, "model": out["model"].uri},
        "scores": scores,
        "distill": {k: record.get(k) for k in ("steps", "tokens_seen", "seconds",
                                               "initial_eval", "final_eval", "teacher_eval")},
        "measured": verification["measured"], "noise": verification["noise"],
        "verify_ok": verification["ok"], "violations": verification["violations"],
        "prediction_error": verification["prediction_error"],
        "measurement": {k: verification["measurement"].get(k)
                        for k in ("ttft_ms", "tpot_ms", "repeats", "threads")},
        "per_item": evaluation.get("per_item", {}),
    }


def selection_record(report: dict) -> list[dict]:
    """The final pick's short list (each candidate's KL right after pruning and after the
    short distillation): the search's ``selection``, the baseline's ``scored`` top-k."""
    if report.get("kind") == "minitron":
        chosen = report.get("chosen") or {}
        return [{"layers": c["num_layers"], "hidden_size": c["hidden_size"],
                 "params": c["params"], "kl": c["score"],
                 "chosen": (c["params"], c["score"]) == (chosen.get("params"),
                                                         chosen.get("score"))}
                for c in report.get("scored", []) if c.get("score") is not None]
    return [{k: f.get(k) for k in ("origin", "layers", "blocks", "attention_blocks",
                                   "hidden_size", "params", "estimate", "pruned_kl", "kl",
                                   "chosen")}
            for f in report.get("selection", [])]


def build_results(sweep_report, args: argparse.Namespace, wall_s: float) -> dict:
    """``results/compare.json`` from the sweep (the fields ``bench.report`` reads).

    ``runs[]``: one per preset × budget, each with ``methods.<name>.seeds[]`` (one entry
    per finished seed: architecture, measured cost, verify result, scores, per-item
    scores) and ``methods.<name>.failed`` (seed -> why that run found no model).
    """
    from autocompress.costmodel.workload import get_workload
    from autocompress.hardware import machine_summary
    from autocompress.limits import Limits

    runs: dict[tuple[str, float], dict] = {}
    teacher: dict[str, Any] = {}
    carried = earlier_cells(args)
    for point in sweep_report.points:
        preset, fraction = point.overrides["workload"], run_fraction(point, args)
        run = runs.setdefault((preset, fraction), {
            "preset": preset, "budget_fraction": fraction,
            "main_metric": get_workload(preset).main_metric,
            "distill_tokens": distill_tokens(args, fraction), "methods": {},
            # where the limits were set, and the teacher's reading there
            **({"limits_carried": {
                "from": args.limits_from,
                "teacher_verify": carried[(preset, fraction)].get("teacher_verify")}}
               if carried else {})})
        method = run["methods"].setdefault(point.overrides["method"],
                                           {"seeds": [], "failed": {}})
        if point.error is not None:
            method["failed"][str(run_seed(point))] = point.error
            continue
        out = point.outputs
        report = _search_report(out["arch"])
        run.update(limits=Limits.model_validate(out["limits"]).model_dump(exclude_none=True),
                   teacher_predicted=report.get("teacher_predicted"),
                   cost_model=report.get("cost_model"),
                   teacher_verify=_verify_summary(_json(out["teacher_verification"])))
        method["seeds"].append(method_entry(point))
        if not teacher:
            teacher = teacher_entry(point, method["seeds"][-1])
    return {
        "version": 3, "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "target": args.target, "synthetic": False, "orchestration": "prefect sweep flow",
        "baseline": args.baseline, "reduced": args.reduced,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "no_track")},
        "teacher": teacher, "runs": list(runs.values()), "not_run": [], "wall_s": wall_s,
        "machine": machine_summary(),  # CPU, torch's kernels, threads, load: machines differ
    }


def teacher_entry(point, method: dict) -> dict:
    from transformers import AutoConfig

    from autocompress.artifacts import fetch
    from autocompress.modeling import arch_spec_of

    out = point.outputs
    spec = arch_spec_of(AutoConfig.from_pretrained(fetch(out["teacher"])))
    scores = _scores(_json(out["teacher_eval"]))
    scores["heldout_loss_fixed"] = method["distill"]["teacher_eval"].get("heldout_loss")
    return {"dir": out["teacher"].uri, "sha": out["teacher"].sha256, "params": spec.num_params(),
            "arch": spec.to_dict(), "scores": scores,
            "per_item": _json(out["teacher_eval"]).get("per_item", {})}


# ------------------------------------------------------------------ output


def print_table(data: dict) -> None:
    """The report's table and verdict on the terminal (one implementation: ``report``)."""

    print(readme_table(data))
    print("\n".join(analysis_text(data)))


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--teacher", default="default", help="Teacher dir or `default`.")
    p.add_argument("--target", default="cpu-local/hf-eager/fp32",
                   help="Deployment target every method is measured on (`autocompress "
                   "costmodel targets` lists them).")
    p.add_argument("--presets", nargs="+", default=list(PRESETS),
                   help=f"Workload presets, one cell each (default: {' '.join(PRESETS)}).")
    p.add_argument("--budgets", nargs="+", type=float, default=[0.6, 0.4],
                   help="Fractions of the teacher's predicted main-metric cost.")
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   help="Methods of the compress flow to run (default: all four).")
    p.add_argument("--baseline", default="minitron",
                   help="The method the others are compared with, item by item.")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="Seeds of the search and the distillation; every cell runs each.")
    p.add_argument("--ablation-seeds", nargs="+", type=int, default=None,
                   help="Seeds of the ablations (greedy, random) when fewer are affordable "
                   "than for the search and the baseline (default: --seeds).")
    p.add_argument("--distill-tokens", type=int, default=100_000,
                   help="Distillation tokens per compressed model (the same for every method).")
    p.add_argument("--tight-distill-tokens", type=int, default=None,
                   help="Distillation tokens at the tightest budget (e.g. 1000000); "
                   "default: --distill-tokens.")
    p.add_argument("--reduced", action="store_true",
                   help="Label the results as a reduced comparison (fewer cells or seeds).")
    p.add_argument("--lr", type=float, default=1e-3, help="Distillation learning rate.")
    p.add_argument("--eval-limit", type=int, default=0,
                   help="Items per benchmark task (0 = all of them).")
    p.add_argument("--search-steps", type=int, default=160, help="DNAS steps of the search.")
    p.add_argument("--verify-repeats", type=int, default=5,
                   help="Timing repeats of the final check of each model on the target.")
    p.add_argument("--threads", type=int, default=2, help="torch threads for the search "
                   "(timing uses the cost model's own count)")
    p.add_argument("--limits-from", default=None, metavar="JSON",
                   help="Run each cell under the limits an earlier comparison's JSON recorded "
                   "for it (not the budget fraction of this machine's cost model), so methods "
                   "added later join that file in one table.")
    p.add_argument("--allow-host-drift", action="store_true",
                   help="With --limits-from, run even where this host reads the teacher more "
                   f"than {HOST_DRIFT * 100:.0f}%% away from the host that set the limits (by "
                   "default each run "
                   "stops right after timing the teacher: the same limit would be another "
                   "budget here).")
    p.add_argument("--options", default=None, help="More per-stage settings as JSON, merged "
                   'over the above, e.g. \'{"costmodel": {"n_probes": 8}}\'.')
    p.add_argument("--corpus", default=None, help="Corpus directory (default: the stdlib one).")
    p.add_argument("--store", default=None, help="Artifact store (default: "
                   "$AUTOCOMPRESS_STORE or $AUTOCOMPRESS_HOME/artifacts).")
    p.add_argument("--experiment", default="autocompress-compare", help="MLflow experiment.")
    p.add_argument("--no-track", action="store_true", help="Do not log to MLflow.")
    p.add_argument("--json", default=str(RESULTS / "compare.json"),
                   help="Where to write the results (every method x seed x cell, per-item scores).")
    p.add_argument("--report", action="store_true", help="Write results/report.md + PNGs too.")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    args = build_parser(prog).parse_args(argv)
    if args.eval_limit == 0:
        args.eval_limit = None
    t0 = time.perf_counter()
    sweep_report = run_sweep(args)
    data = build_results(sweep_report, args, time.perf_counter() - t0)
    from autocompress.atomic import write_json_atomic

    out = Path(args.json)
    write_json_atomic(out, data)
    print_table(data)  # with a line per cell whose carried limit crossed hosts
    log(f"wrote {out} ({data['wall_s']:.0f} s)")
    refused = [p.error for p in sweep_report.points if p.error and HOST_REFUSAL in p.error]
    if refused:
        # The sweep keeps a failed run's message only; the hint is check_same_host's.
        raise AutoCompressError(refused[0], hint=HOST_REFUSAL_HINT)
    if args.report:

        log(f"report: {write_report(data, out.parent)}")
    return data


if __name__ == "__main__":
    from autocompress.cli import report_errors

    report_errors(main)
