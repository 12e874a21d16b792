"""The check a GPU machine runs for the vLLM target (issue 61): the same serving, on CUDA.

This machine has no GPU, so the GPU targets (``h100-sxm/vllm/bf16`` and the others) are
priced from their spec sheets. On a machine with an NVIDIA GPU and vLLM's CUDA build in
the environment ``AUTOCOMPRESS_VLLM_VENV`` names, this script serves a model exactly as
``cpu-local/vllm`` does (``autocompress.vllm_engine.VllmServer``, eager, one process
group; ``costmodel.measure_vllm.time_workload``: concurrent streamed requests timed by
vLLM's engine, memory as vLLM accounts it) and sets each figure beside the spec-sheet cost
model's prediction for that GPU, so the size of the analytic model's error there is a
measurement, not a guess. It also compares vLLM's log-probabilities with PyTorch's.

    AUTOCOMPRESS_VLLM_VENV=/path/to/venv-with-vllm .venv/bin/python -m bench.vllm_gpu \\
        [--model default] [--workload interactive --workload datacenter] [--repeats 5] \\
        [--out bench/results/vllm_gpu.json]

Without a GPU (NVML finds none) or without vLLM it prints one line saying which, writes
the reason to ``--out`` and exits 0: nothing was measured. About two minutes on an idle
H100 for the bundled teacher (one server start, two workloads).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from autocompress.atomic import write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.hardware import detect_gpus

DEFAULT_OUT = Path("bench/results/vllm_gpu.json")


def skipped(out: Path, reason: str) -> int:
    """One line and a record that nothing was measured, unless ``out`` holds a measured
    result (a GPU machine's), which a later run without a GPU must not replace."""
    if out.is_file() and json.loads(out.read_text()).get("measured"):
        print(f"vLLM GPU check skipped: {reason} (kept the measured result in {out})")
        return 0
    print(f"vLLM GPU check skipped: {reason}")
    write_json_atomic(out, {"measured": False, "skipped": reason})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="a model directory or named teacher")
    parser.add_argument("--workload", action="append", help="workload preset (repeatable)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    gpus, driver, error = detect_gpus()
    if not gpus:
        return skipped(args.out, error or "NVML sees no GPU")
    from autocompress.vllm_engine import vllm_python

    try:
        vllm_python()
    except AutoCompressError as err:
        return skipped(args.out, f"{err.message} ({err.hint})")
    return measure(args, gpus[0], driver)


def measure(args, gpu, driver) -> int:
    from autocompress.costmodel.measure_vllm import logprob_difference, time_workload
    from autocompress.costmodel.model import CostModel
    from autocompress.costmodel.target import Target
    from autocompress.costmodel.workload import get_workload
    from autocompress.export import spec_from_nemotron_nas
    from autocompress.model_source import resolve_model_dir
    from autocompress.vllm_engine import VllmServer, export_for_vllm

    workloads = [get_workload(n) for n in (args.workload or ["interactive", "datacenter"])]
    target = f"{gpu.registry_name}/vllm/{args.dtype}" if gpu.registry_name else None
    cost_model = CostModel.analytic(Target.parse(target)) if target else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="ac-vllm-gpu-") as tmp:
        served = export_for_vllm(resolve_model_dir(args.model), Path(tmp) / "nemotron-nas")
        spec = spec_from_nemotron_nas(json.loads((served / "config.json").read_text()))
        with VllmServer(served, dtype=args.dtype, device="cuda", max_logprobs=-1,
                        max_model_len=max(w.isl + w.osl for w in workloads),
                        max_num_seqs=max(w.batch for w in workloads)) as server:
            for workload in workloads:
                measurement, serving = time_workload(server, workload, repeats=args.repeats)
                predicted = cost_model.predict(spec, workload).metrics() if cost_model else {}
                rows.append({"workload": workload.name, "measured": measurement.metrics(),
                             "predicted": predicted, "serving": serving.model_dump(),
                             "spread": {"ttft_ms": measurement.ttft_ms.spread,
                                        "tpot_ms": measurement.tpot_ms.spread}})
            logits = logprob_difference(server, served)
    print(f"{gpu.name} (driver {driver}), {args.model} as served by vLLM, {args.dtype}; "
          f"predicted by {target or 'no spec sheet (unknown GPU)'}")
    print(f"{'workload':12} {'metric':8} {'measured':>10} {'predicted':>10} {'spread':>7}")
    for row in rows:
        for metric in ("ttft_ms", "tpot_ms", "memory_gb"):
            guess = row["predicted"].get(metric)
            print(f"{row['workload']:12} {metric:8} {row['measured'][metric]:10.4g} "
                  f"{guess if guess is None else f'{guess:.4g}':>10} "
                  f"{row['spread'].get(metric, 0.0) * 100:6.1f}%")
    print(f"largest |log p| difference against PyTorch: {logits['max_abs_logprob_diff']:.2e}")
    write_json_atomic(args.out, {"measured": True, "gpu": gpu.model_dump(), "driver": driver,
                                 "model": args.model, "dtype": args.dtype, "target": target,
                                 "rows": rows, "logits": logits})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
