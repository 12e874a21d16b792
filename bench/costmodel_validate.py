"""Fit the cpu-local cost model, then validate it on sampled architectures.

Issue 4's bar on the local CPU target: TPOT MAPE ≤ 5 %, TTFT MAPE ≤ 8 %,
peak-memory MAPE ≤ 5 %, Kendall τ ≥ 0.9, over ≥ 30 architectures. Steps:

1. profile the CPU (cached under AUTOCOMPRESS_HOME) — GEMM FLOP/s, bandwidth;
2. fit: measure ``--probes`` designed probe architectures (random weights) on
   the three ``-cpu`` workloads, NNLS (``autocompress costmodel fit``);
3. validate: ``--n`` fresh heterogeneous architectures from the default
   teacher's search space, measured with interleaved repetitions, scored per
   metric (MAPE, Kendall τ, median spread), pooled and per workload.

Prints a table and writes ``--out`` (JSON, with the fitted model's version and
both durations) and a predicted-vs-measured PNG beside it. Timing is paired
with the teacher's architecture (``autocompress/costmodel/measure.py``;
``--absolute`` times each model alone): the spread column is the spread of the
paired figures, and the lines under the table give the spread of the same runs'
absolute times and how far the reference's own speed moved between the fit and
the validation. Run it alone. On 2 quiet cores the defaults take about 22
minutes (7 to fit, 15 to validate); ``--absolute`` about 6.

    .venv/bin/python -m bench.costmodel_validate [--n 30] [--probes 20] [--repeats 5]
        [--fit-repeats 3] [--threads 1] [--target cpu-local/hf-eager/fp32]
        [--out bench/results/costmodel_validate.json]

``--target cpu-local/llama.cpp/q8_0`` does the same in llama.cpp (each model
exported to GGUF; about 10 minutes on 2 cores at load 8). ``--target cpu-local/vllm/bf16``
serves each model in vLLM, one server per model (about 20 s to start), timed absolutely.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from autocompress.atomic import write_json_atomic

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GOALS = {"ttft": 8.0, "tpot": 5.0, "memory": 5.0}
TAU_GOAL = 0.9


def joint_fit_and_validate(target, base, workloads, args):
    """Probes and validation architectures measured together, fitted on the probes only."""
    from autocompress.costmodel.fit import (
        fit_from_rows,
        fit_report,
        measure_on_target,
        rows_from_grid,
    )
    from autocompress.costmodel.measure import timing_reference
    from autocompress.costmodel.probes import ProbeSampler
    from autocompress.costmodel.validate import sample_specs, score_measurements
    from autocompress.modeling import arch_spec_of, build_model

    start = time.perf_counter()
    base_spec = arch_spec_of(base)
    probes = ProbeSampler.for_target(base_spec, target).probe_specs(args.probes, seed=0)
    held_out = sample_specs(base_spec, args.n, seed=1000, target=target)
    models = [build_model(s, base, seed=i) for i, s in enumerate([*probes, *held_out])]
    absolute = args.absolute or not target.paired_timing
    reference = None if absolute else timing_reference(base_spec)
    grid = measure_on_target(target, models, workloads, repeats=args.repeats,
                             warmup=args.warmup, description="probes + validation",
                             reference=reference)
    rows = rows_from_grid(probes, workloads, [row[: len(probes)] for row in grid])
    model = fit_from_rows(target, rows, args.statistic)
    model = model.model_copy(update={"fit": fit_report(
        model, rows, args.statistic, n_probes=len(probes), workloads=workloads,
        seconds=time.perf_counter() - start,
        reference_spec=None if absolute else base_spec)})
    seconds = time.perf_counter() - start
    report = score_measurements(model, held_out, workloads,
                                [row[len(probes):] for row in grid], args.statistic, seconds)
    return model, report, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="validation architectures")
    parser.add_argument("--probes", type=int, default=20, help="fitting probe architectures")
    parser.add_argument("--repeats", type=int, default=5, help="validation repetitions")
    parser.add_argument("--fit-repeats", type=int, default=3, help="fitting repetitions")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--target", default="cpu-local/hf-eager/fp32",
                        help="a measurable target, e.g. cpu-local/llama.cpp/q8_0")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (llama.cpp: the engine's threads)")
    parser.add_argument("--workload", action="append", help="workload preset (repeatable)")
    parser.add_argument("--statistic", choices=("median", "floor"), default="median",
                        help="timing statistic to fit and score (floor on a busy machine)")
    parser.add_argument("--absolute", action="store_true",
                        help="time each model alone (default: paired in lockstep with the "
                        "teacher's architecture, see autocompress/costmodel/measure.py)")
    parser.add_argument("--joint", action="store_true",
                        help="measure probes and validation architectures in one interleaved "
                        "grid (same machine load for both; for a busy machine), then fit on "
                        "the probes and score the rest")
    parser.add_argument("--out", type=Path, default=Path("bench/results/costmodel_validate.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from autocompress.costmodel.fit import CPU_FIT_WORKLOADS, fit_cost_model
    from autocompress.costmodel.model import default_path
    from autocompress.costmodel.probes import default_base_config
    from autocompress.costmodel.target import Target
    from autocompress.costmodel.validate import plot_validation, validate_cost_model
    from autocompress.costmodel.workload import get_workload
    from autocompress.hardware import engine_kernels, load_profile, machine_summary

    workloads = [get_workload(n) for n in (args.workload or CPU_FIT_WORKLOADS)]
    base = default_base_config()
    profile = load_profile()
    target = Target.parse(args.target, profile=profile, threads=args.threads)
    load_before = os.getloadavg()

    if args.joint:
        model, report, fit_seconds = joint_fit_and_validate(target, base, workloads, args)
    else:
        start = time.perf_counter()
        model, _ = fit_cost_model(target, base, workloads, n_probes=args.probes,
                                  repeats=args.fit_repeats, warmup=args.warmup,
                                  statistic=args.statistic, paired=not args.absolute)
        fit_seconds = time.perf_counter() - start
        report = validate_cost_model(model, base, workloads, n=args.n, repeats=args.repeats,
                                     warmup=args.warmup, statistic=args.statistic)
    model.save(default_path(target))
    png = plot_validation(report, args.out.with_suffix(".png"))

    print(f"\ncost model {model.version}; fit {fit_seconds:.0f} s on {args.probes} probes, "
          f"validation {report.seconds:.0f} s on n={args.n} × {len(workloads)} workloads "
          f"({args.threads} thread(s), {args.statistic} of {report.timing} timings)")
    print(f"{'metric':8} {'MAPE %':>8} {'goal':>6} {'tau':>7} {'spread %':>9}  per workload MAPE")
    for metric, mape, tau, spread in report.table():
        per = ", ".join(f"{w}: {report.per_workload[w]['mape'][metric]:.1f}"
                        for w in report.workloads)
        ok = "ok" if mape <= GOALS[metric] and tau >= TAU_GOAL else "MISS"
        print(f"{metric:8} {mape:8.2f} {GOALS[metric]:6.1f} {tau:7.3f} {spread * 100:9.1f}  "
              f"{per}  {ok}")

    if report.timing == "paired":
        absolute = {m: statistics.median(s.absolute_spread[m] for s in report.samples)
                    for m in ("ttft_ms", "tpot_ms")}
        print(f"spread of the same runs' absolute times: TTFT {absolute['ttft_ms'] * 100:.1f} %, "
              f"TPOT {absolute['tpot_ms'] * 100:.1f} % (pairing removes it)")
        if report.at_fit_scale:
            print("scaled by the fit's reference times instead (as verify does): " + ", ".join(
                f"{m} MAPE {report.at_fit_scale['mape'][m]:.2f} τ "
                f"{report.at_fit_scale['kendall_tau'][m]:.3f}" for m in GOALS))
        for name, drift in report.reference_drift.items():
            print(f"reference {name}: validation vs fit session "
                  + ", ".join(f"{k} {v * 100:+.1f} %" for k, v in drift.items()))
    payload = report.model_dump(mode="json")
    payload.update({
        "fit_seconds": fit_seconds,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "validate_seconds": report.seconds,
        "probes": args.probes,
        "fit_repeats": args.fit_repeats,
        "threads": args.threads,
        "statistic": args.statistic,
        "joint": args.joint,
        "timing": report.timing,
        "goals": {"mape": GOALS, "kendall_tau": TAU_GOAL},
        "fit_report": model.fit.model_dump(mode="json") if model.fit else None,
        "hardware": profile.cpu_spec().model_dump(mode="json"),
        "machine": machine_summary(),  # CPU model, vector extensions, cores, threads, load
        "kernels": engine_kernels(target.engine.name),
        "plot": str(png),
    })
    write_json_atomic(args.out, payload)
    if report.timing == "absolute":  # a floor of paired ratios means nothing
        other = "floor" if args.statistic == "median" else "median"
        print("against " + other + " timings: " + ", ".join(
            f"{m} MAPE {report.by_statistic[other]['mape'][m]:.2f}" for m in GOALS))
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
