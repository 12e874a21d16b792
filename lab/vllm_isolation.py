"""Does giving vLLM's worker its cores alone remove the between-server TPOT modes?

The vLLM validation (bench/results/costmodel_validate_vllm_bf16.json) had a dozen
datacenter/interactive samples 15-25% slower than the fit, each with a tiny
within-server spread: a shift that lasts a whole server session, not noise. vLLM binds
only its worker's OpenMP threads; the API server, the engine core and our client float,
and the suspicion is that one of them lands on the worker's core.

This serves the same architectures in fresh servers, alternating ``isolate`` off and on
(ABAB, so a machine whose load drifts hits both), and prints each server's TPOT
median per workload and the between-server spread of each condition.

    .venv/bin/python -m lab.vllm_isolation --servers 4 --out lab/results/vllm_isolation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from autocompress.atomic import write_json_atomic
from autocompress.costmodel.workload import get_workload
from autocompress.hardware import machine_summary
from autocompress.vllm_engine import VllmServer, export_for_vllm

WORKLOADS = ("datacenter-cpu", "interactive-cpu")
VALIDATION = Path("bench/results/costmodel_validate_vllm_bf16.json")


def specs(count: int):
    """The validation's first architectures (the same ones each run)."""
    from autocompress.arch import ArchSpec

    samples = json.loads(VALIDATION.read_text())["samples"]
    seen, out = set(), []
    for sample in samples:
        key = json.dumps(sample["spec"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(ArchSpec.model_validate(sample["spec"]))
    return out[:count]


def one_server(directory: Path, isolate: bool, repeats: int, seed: int) -> dict:
    from autocompress.costmodel.measure_vllm import time_workload

    workloads = [get_workload(n) for n in WORKLOADS]
    with VllmServer(directory, dtype="bf16", max_model_len=max(w.isl + w.osl for w in workloads),
                    max_num_seqs=max(w.batch for w in workloads), kv_cache_gib=1,
                    isolate=isolate) as server:
        out = {"isolate": isolate, "worker_cpus": sorted(server.worker_cpus),
               "framework_cpus": sorted(server.framework_cpus or [])}
        for workload in workloads:
            measurement, _ = time_workload(server, workload, repeats=repeats, seed=seed)
            out[workload.name] = measurement.tpot_ms.median
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=4, help="servers per condition and model")
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("lab/results/vllm_isolation.json"))
    args = parser.parse_args()
    from autocompress.costmodel.probes import default_base_config
    from autocompress.modeling import build_model

    runs, began = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ac-isolation-") as tmp:
        served = []
        for index, spec in enumerate(specs(args.models)):
            model = build_model(spec, default_base_config(), seed=index)
            model.save_pretrained(Path(tmp) / f"m{index}")
            served.append(export_for_vllm(Path(tmp) / f"m{index}", Path(tmp) / f"v{index}"))
        for round_ in range(args.servers):
            for isolate in (False, True) if round_ % 2 == 0 else (True, False):
                for index, directory in enumerate(served):
                    run = {"model": index, "round": round_,
                           **one_server(directory, isolate, args.repeats, seed=round_)}
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    summary = {}
    for index in range(len(served)):
        for isolate in (False, True):
            for name in WORKLOADS:
                values = [r[name] for r in runs if r["model"] == index and r["isolate"] == isolate]
                summary[f"m{index} isolate={isolate} {name}"] = {
                    "median_ms": statistics.median(values),
                    "max_over_min": max(values) / min(values),
                    "cv": statistics.pstdev(values) / statistics.mean(values),
                    "values_ms": values}
    for key, value in summary.items():
        print(f"{key:40s} median {value['median_ms']:.3f} ms  max/min {value['max_over_min']:.3f}"
              f"  cv {100 * value['cv']:.1f}%")
    write_json_atomic(args.out, {"runs": runs, "summary": summary, "torch": torch.__version__,
                                 "seconds": time.perf_counter() - began,
                                 "machine": machine_summary()})


if __name__ == "__main__":
    main()
