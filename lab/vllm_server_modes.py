"""When does a vLLM server fall into its slow mode: at its start, or later in its life?

Two earlier readings disagree. In the vLLM validation
(``bench/results/costmodel_validate_vllm_bf16.json``) a dozen datacenter/interactive
TPOTs were 15-25% above the fit while the same server's local-coding TPOT, timed first,
was not: a mode that sets in during a server's life. In ``lab/vllm_isolation.py``, which
timed datacenter first, fresh servers of one architecture differed by 10-17% (cv): a mode
fixed at the start. This serves one architecture in fresh servers and, in each, times
interactive-cpu again and again with the other workloads between (I L I D I L I D I), so
each server's interactive TPOT shows whether it moves within the server, after which
workload, or only between servers.

    .venv/bin/python -m lab.vllm_server_modes --servers 6 --out lab/results/vllm_server_modes.json

Run it on a quiet machine (no campaign unit timing, no tests): about 2 minutes a server.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from autocompress.atomic import write_json_atomic
from autocompress.costmodel.workload import get_workload
from autocompress.hardware import machine_summary
from autocompress.vllm_engine import VllmServer, export_for_vllm
from lab.vllm_isolation import specs

ORDER = ("interactive-cpu", "local-coding-cpu", "interactive-cpu", "datacenter-cpu",
         "interactive-cpu", "local-coding-cpu", "interactive-cpu", "datacenter-cpu",
         "interactive-cpu")


def one_server(directory: Path, repeats: int, seed: int) -> list[dict]:
    """Every workload of ``ORDER`` timed in turn in one fresh server: its TPOT median and
    the seconds since the server answered."""
    from autocompress.costmodel.measure_vllm import time_workload

    workloads = [get_workload(name) for name in dict.fromkeys(ORDER)]
    with VllmServer(directory, dtype="bf16", max_model_len=max(w.isl + w.osl for w in workloads),
                    max_num_seqs=max(w.batch for w in workloads), kv_cache_gib=1) as server:
        up, out = time.perf_counter(), []
        for step, name in enumerate(ORDER):
            measurement, _ = time_workload(server, get_workload(name), repeats=repeats,
                                           seed=seed * 100 + step)
            out.append({"step": step, "workload": name, "tpot_ms": measurement.tpot_ms.median,
                        "since_up_s": round(time.perf_counter() - up, 1)})
    return out


def summarize(servers: list[list[dict]]) -> dict:
    """Interactive's spread within each server against its spread between servers."""
    per_server = [[t["tpot_ms"] for t in s if t["workload"] == "interactive-cpu"] for s in servers]
    within = [max(v) / min(v) for v in per_server]
    medians = [statistics.median(v) for v in per_server]
    return {"interactive_within_max_over_min": within,
            "interactive_server_medians_ms": medians,
            "between_max_over_min": max(medians) / min(medians),
            "first_vs_last_interactive": [v[-1] / v[0] for v in per_server]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--model", type=int, default=25,
                        help="which validation architecture (25 read +21%% at datacenter)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("lab/results/vllm_server_modes.json"))
    args = parser.parse_args()
    from autocompress.costmodel.probes import default_base_config
    from autocompress.modeling import build_model

    began, servers = time.perf_counter(), []
    spec = specs(args.model + 1)[args.model]
    with tempfile.TemporaryDirectory(prefix="ac-modes-") as tmp:
        build_model(spec, default_base_config(), seed=0).save_pretrained(Path(tmp) / "m")
        served = export_for_vllm(Path(tmp) / "m", Path(tmp) / "v")
        for index in range(args.servers):
            servers.append(one_server(served, args.repeats, seed=index))
            print(" ".join(f"{t['workload'][:5]} {t['tpot_ms']:.3f}" for t in servers[-1]),
                  flush=True)
    summary = summarize(servers)
    print(summary)
    write_json_atomic(args.out, {"servers": servers, "summary": summary, "model": args.model,
                                 "order": ORDER, "torch": torch.__version__,
                                 "seconds": time.perf_counter() - began,
                                 "machine": machine_summary()})


if __name__ == "__main__":
    main()
