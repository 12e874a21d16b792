"""How much do Prefect + MLflow add per stage? Prints a table, writes JSON.

A flow of ``--stages`` stages, each publishing a small JSON artifact after a
fixed ``--work`` seconds of sleep (known body time), runs ``--repeats`` times
with fresh inputs (every stage executes) and once more with the same inputs
(every stage is a cache hit). Per stage we take the wall time of the task call
seen by the flow minus the body's own time: that is Prefect's task machinery +
MLflow's nested run + artifact logging. The first flow call also pays for
starting Prefect's temporary server; it is reported separately.

    .venv/bin/python -m bench.orchestration_overhead --stages 6 --repeats 3

Run it on a quiet machine: on a loaded one the numbers measure the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=float, default=0.5, help="seconds of body per stage")
    parser.add_argument("--no-track", action="store_true", help="without MLflow")
    parser.add_argument("--out", default="results/bench_orchestration_overhead.json")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="ac-bench-"))
    os.environ.update(AUTOCOMPRESS_HOME=str(home / "home"), PREFECT_HOME=str(home / "prefect"),
                      MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}",
                      PREFECT_SERVER_ANALYTICS_ENABLED="false", MLFLOW_DISABLE_TELEMETRY="true",
                      PREFECT_LOGGING_LEVEL="WARNING",
                      PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600")
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    from prefect import flow

    from flows.common import Step, finish_report, new_report, run_steps, tracked_flow
    from tasks.stage import StageContext, stage, stage_timings

    import_s = time.perf_counter() - started

    @stage("bench_stage", retries=0)
    def bench_stage(ctx: StageContext, index: int, salt: int, previous: dict | None) -> dict:
        time.sleep(args.work)
        return {"ref": ctx.publish_json(f"s{index}.json", {"i": index, "salt": salt})}

    steps = [Step(f"s{i}", bench_stage, index=f"i{i}", salt="salt",
                  previous=f"s{i - 1}" if i else "none") for i in range(args.stages)]

    @flow(name="bench-overhead")
    def bench_flow(salt: int):
        t0 = time.perf_counter()
        with tracked_flow("bench-overhead", {"salt": salt}, "bench", None,
                          track=not args.no_track) as run:
            report = new_report("bench", run)
            values = {"salt": salt, "none": None, **{f"i{i}": i for i in range(args.stages)}}
            run_steps(steps, values, run, report)
            return finish_report(report, run, t0), run.flow_run_id

    rows = []
    for repeat in range(args.repeats + 1):
        salt = repeat if repeat < args.repeats else 0  # the last run repeats run 0: cached
        t0 = time.perf_counter()
        report, flow_run_id = bench_flow(salt)
        call_s = time.perf_counter() - t0
        bodies = {t.stage: t for t in stage_timings(flow_run_id)}
        per_stage = []
        for step in report.steps:
            body = args.work if step.state != "Cached" else 0.0
            per_stage.append(step.seconds - body)
        tracking = sum(t.tracking_s for t in bodies.values())
        rows.append({"repeat": repeat, "cached": repeat == args.repeats, "call_s": call_s,
                     "flow_wall_s": report.wall_s, "stage_work_s": report.stage_work_s,
                     "per_stage_overhead_s": per_stage, "mlflow_in_stages_s": tracking,
                     "states": [s.state for s in report.steps]})

    def summary(values: list[float]) -> str:
        if len(values) < 2:
            return f"{values[0]:.3f}" if values else "–"
        q = statistics.quantiles(values, n=4)
        return f"{statistics.median(values):.3f} [{q[0]:.3f}, {q[2]:.3f}]"

    executed = [x for r in rows if not r["cached"] for x in r["per_stage_overhead_s"]]
    cached = [x for r in rows if r["cached"] for x in r["per_stage_overhead_s"]]
    first = rows[0]
    print(f"imports {import_s:.1f}s; first flow call {first['call_s']:.1f}s "
          f"(includes the temporary Prefect server start)")
    print(f"{'':34} median [q1, q3] seconds")
    print(f"{'overhead per executed stage':34} {summary(executed)}")
    print(f"{'overhead per cached stage':34} {summary(cached)}")
    later = [r for r in rows[1:] if not r["cached"]]
    for r in later:
        share = 1 - r["stage_work_s"] / r["flow_wall_s"]
        print(f"run {r['repeat']}: flow {r['flow_wall_s']:.2f}s, work {r['stage_work_s']:.2f}s, "
              f"overhead share {100 * share:.1f}% "
              f"(MLflow in stages {r['mlflow_in_stages_s']:.2f}s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "import_s": import_s, "rows": rows,
                               "threads": torch.get_num_threads(),
                               "load_avg": os.getloadavg()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
