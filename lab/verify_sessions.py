"""How steady is `verify`? One timing session against several pooled, on one model.

On a shared host the same model can read 5-18% apart in back-to-back timing sessions
while each session reports ~1% noise (lab/measurement-history.md). This benchmark
verifies one model again and again, alternating ``--singles`` single-session verifies
with a ``--sessions``-session pooled one, and prints every reading, its spread and how
often each kind passes the limit. Same harness as the flows' verify stage.

    python -m lab.verify_sessions --model <distilled model dir> \
        --workload datacenter-cpu --max-tpot-ms 4.02 \
        --cost-model <the run's costmodel.json> --json lab/results/verify_sessions.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Model directory or .gguf to verify.")
    p.add_argument("--target", default="cpu-local/hf-eager/fp32")
    p.add_argument("--workload", default="interactive-cpu")
    p.add_argument("--max-tpot-ms", type=float, required=True, help="The limit checked.")
    p.add_argument("--cost-model", default=None, help="Cost model JSON (default: the "
                   "target's fitted one): its thread count, statistic and timing reference.")
    p.add_argument("--rounds", type=int, default=2, help="Rounds of singles + one pool.")
    p.add_argument("--singles", type=int, default=3, help="Single-session verifies per round.")
    p.add_argument("--sessions", type=int, default=3, help="Sessions in a pooled verify.")
    p.add_argument("--repeats", type=int, default=9, help="Timed repeats per session.")
    p.add_argument("--json", default="lab/results/verify_sessions.json")
    return p


def _summary(readings: list[float], passed: list[bool]) -> dict:
    return {"n": len(readings), "tpot_ms": readings, "min": min(readings),
            "max": max(readings), "median": statistics.median(readings),
            "passed": sum(passed)}


def main(argv: list[str] | None = None) -> dict:
    from autocompress.atomic import write_json_atomic
    from autocompress.costmodel.model import CostModel
    from autocompress.errors import AutoCompressError
    from autocompress.hardware import machine_summary
    from autocompress.limits import Limits
    from autocompress.verify import verify

    args = build_parser().parse_args(argv)
    if min(args.rounds, args.singles, args.sessions, args.repeats) < 1:
        raise AutoCompressError("--rounds, --singles, --sessions and --repeats must be ≥ 1",
                                hint="pass 1 or more")
    cost_model = CostModel.load(args.cost_model) if args.cost_model else None
    limits = Limits(max_tpot_ms=args.max_tpot_ms)
    kinds: dict[str, dict[str, list]] = {"single": {"tpot": [], "ok": []},
                                         "pooled": {"tpot": [], "ok": [], "sessions": []}}
    started = time.perf_counter()
    for _ in range(args.rounds):
        for kind, sessions, count in (("single", 1, args.singles),
                                      ("pooled", args.sessions, 1)):
            for _ in range(count):
                report = verify(args.model, args.target, args.workload, limits,
                                repeats=args.repeats, cost_model=cost_model,
                                sessions=sessions)
                kinds[kind]["tpot"].append(report.measured["tpot_ms"])
                kinds[kind]["ok"].append(report.ok)
                if kind == "pooled":
                    kinds[kind]["sessions"].append(
                        [s["tpot_ms"] for s in report.measurement["sessions"]])
    data = {"model": str(args.model), "target": args.target, "workload": args.workload,
            "max_tpot_ms": args.max_tpot_ms, "repeats": args.repeats,
            "sessions_per_pool": args.sessions, "machine": machine_summary(),
            "seconds": time.perf_counter() - started,
            "single": _summary(kinds["single"]["tpot"], kinds["single"]["ok"]),
            "pooled": {**_summary(kinds["pooled"]["tpot"], kinds["pooled"]["ok"]),
                       "sessions": kinds["pooled"]["sessions"]}}
    print(f"{'verify':<8} {'n':>3} {'TPOT ms: every reading':<48} {'spread':>7} {'pass':>6}")
    for kind in ("single", "pooled"):
        s = data[kind]
        readings = ", ".join(f"{t:.3f}" for t in s["tpot_ms"])
        print(f"{kind:<8} {s['n']:>3} {readings:<48} "
              f"{(s['max'] - s['min']) / s['median']:>6.1%} {s['passed']:>3}/{s['n']}")
    print(f"limit {args.max_tpot_ms} ms; {data['machine']['cpu']}, "
          f"{data['machine']['torch_threads']} torch threads")
    write_json_atomic(Path(args.json), data, indent=1)
    print(f"wrote {args.json} ({data['seconds']:.0f} s)")
    return data


if __name__ == "__main__":
    from autocompress.cli import report_errors

    report_errors(main)
