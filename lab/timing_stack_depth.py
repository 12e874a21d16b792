"""Does a model's measured decode step depend on how deep the caller's Python stack is?

CPython keeps a thread's frames in 16 KiB chunks that it maps when a call crosses the end
of one and unmaps when the call returns. A decode step of a small model is mostly Python
calls, so where the caller's stack leaves the model's calls straddling a chunk's end,
every step maps, faults in and unmaps chunks. This benchmark times one model from a range
of caller stack depths in two ways, side by side at each depth:

- **caller's thread**: the timing loop (``generate_once``) run right there, as the
  harness did before;
- **harness**: ``measure_model``, which first picks the padding of frames at which a
  short trial run of the model faults least (``costmodel.measure.quiet_padding``).

It prints each depth's median decode step of both ways, the minor page faults per step of
the first (the chunks being mapped), the seconds the harness spends choosing its padding
(16 short trial runs, once per model and timing grid) beside the seconds of the whole
``measure_model`` call, and the spread of each over all depths; the JSON keeps every
reading. Neighbouring rows are seconds apart, so compare within a row.

    python -m lab.timing_stack_depth --json lab/results/timing_stack_depth.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default", help="Model directory or named teacher "
                   "(its architecture is timed with random weights).")
    p.add_argument("--workload", default="local-coding-cpu", help="Workload preset (prompt "
                   "length and batch).")
    p.add_argument("--osl", type=int, default=32, help="Decode steps per run.")
    p.add_argument("--depths", type=int, nargs=3, default=[0, 320, 8],
                   metavar=("FIRST", "LAST", "STEP"), help="Caller stack depths (frames).")
    p.add_argument("--repeats", type=int, default=3, help="Timed runs per depth and way.")
    p.add_argument("--threads", type=int, default=2, help="torch threads.")
    p.add_argument("--json", default="lab/results/timing_stack_depth.json")
    return p


def time_in_callers_thread(model, ids, osl: int, repeats: int) -> tuple[float, float]:
    """(median decode step ms, minor faults per step) of the loop run on this thread."""
    from autocompress.costmodel.measure import generate_once, thread_page_faults

    generate_once(model, ids, osl)  # warm-up
    before, medians = thread_page_faults(), []
    for _ in range(repeats):
        _, steps, _ = generate_once(model, ids, osl)
        medians.append(statistics.median(steps) * 1e3)
    faults = thread_page_faults() - before
    return statistics.median(medians), faults / (repeats * (osl - 1))


def time_with_harness(model, workload, repeats: int) -> float:
    """Median decode step ms from ``measure_model``."""
    from autocompress.costmodel.measure import measure_model

    return measure_model(model, workload, repeats=repeats, warmup=1, memory=False).tpot_ms.median


def time_padding_choice(model, ids) -> float:
    """Seconds ``quiet_padding`` takes to choose this model's padding (its trial runs)."""
    from autocompress.costmodel.measure import padding_trial, quiet_padding

    started = time.perf_counter()
    quiet_padding(padding_trial(model, None, ids, None))
    return time.perf_counter() - started


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "max_over_min": max(values) / min(values)}


def main(argv: list[str] | None = None) -> dict:
    import torch
    from transformers import AutoConfig

    from autocompress.atomic import write_json_atomic
    from autocompress.costmodel.measure import padded, prompt_ids, timing_reference
    from autocompress.costmodel.workload import get_workload
    from autocompress.errors import AutoCompressError
    from autocompress.hardware import machine_summary
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import arch_spec_of

    args = build_parser().parse_args(argv)
    first, last, step = args.depths
    if step < 1 or first < 0 or last < first or args.repeats < 1 or args.osl < 2:
        raise AutoCompressError("bad --depths, --repeats or --osl",
                                hint="e.g. --depths 0 320 8 --repeats 3 --osl 32")
    torch.set_num_threads(args.threads)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), last + 1000))
    spec = arch_spec_of(AutoConfig.from_pretrained(resolve_model_dir(args.model)))
    model = timing_reference(spec).eval()  # the architecture with random weights
    workload = get_workload(args.workload).model_copy(update={"osl": args.osl})
    ids = prompt_ids(model, workload)
    rows, started = [], time.perf_counter()
    print(f"{'depth':>5}  {'caller ms':>9}  {'faults/step':>11}  {'harness ms':>10}  "
          f"{'call s':>6}  {'padding s':>9}", flush=True)
    for depth in range(first, last + 1, step):
        own_ms, own_faults = padded(depth, time_in_callers_thread, model, ids, args.osl,
                                    args.repeats)
        call_started = time.perf_counter()
        harness_ms = padded(depth, time_with_harness, model, workload, args.repeats)
        call_s = time.perf_counter() - call_started
        padding_s = padded(depth, time_padding_choice, model, ids)
        rows.append({"depth": depth, "callers_thread_ms": own_ms,
                     "callers_thread_faults_per_step": own_faults, "harness_ms": harness_ms,
                     "harness_call_s": call_s, "padding_choice_s": padding_s})
        print(f"{depth:>5}  {own_ms:>9.3f}  {own_faults:>11.1f}  {harness_ms:>10.3f}  "
              f"{call_s:>6.2f}  {padding_s:>9.2f}", flush=True)
    summary = {"callers_thread_ms": _spread([r["callers_thread_ms"] for r in rows]),
               "harness_ms": _spread([r["harness_ms"] for r in rows]),
               "padding_choice_s": _spread([r["padding_choice_s"] for r in rows]),
               "harness_call_s": _spread([r["harness_call_s"] for r in rows])}
    for way, spread in summary.items():
        unit = "s" if way.endswith("_s") else "ms"
        print(f"{way}: {spread['min']:.3f}-{spread['max']:.3f} {unit} "
              f"(max/min {spread['max_over_min']:.3f})")
    data = {"benchmark": "timing_stack_depth", "model": str(args.model),
            "params": spec.num_params(), "workload": workload.model_dump(),
            "repeats": args.repeats, "threads": args.threads, "python": sys.version.split()[0],
            "machine": machine_summary(), "rows": rows, "summary": summary,
            "wall_s": time.perf_counter() - started}
    write_json_atomic(args.json, data)
    print(f"wrote {args.json}")
    return data


if __name__ == "__main__":
    from autocompress.cli import report_errors

    report_errors(main)
