"""How long the command line takes to answer, and what a stage process pays to import.

Issue 63: ``autocompress --help`` took 6-8 s because ``import autocompress`` registered the
model classes and so imported torch and transformers; a usage error paid the same (and a
run without a limit started Prefect's server first). This times, in fresh processes,

- ``python -c pass`` (the interpreter alone: the floor every command pays);
- ``--help``, ``COMMAND --help``, ``--version`` and two usage errors (no limit, an
  unknown target), through the installed ``autocompress`` script;
- the imports of a served stage process: the ``stage`` deployment's entrypoint
  (``flows.placement``) and one stage module, before the stage's own work starts;

each for one or more source trees side by side (``--tree before=/tmp/before``: a git
worktree of an older commit, imported first on ``PYTHONPATH`` as bench.campaign does),
alternating trees within each repeat so that a change in the machine's load hits both.
Wall time and CPU time (user + system of the process and its children) are recorded per
run; the JSON has every run, the median and the spread (min, max) of each.

    .venv/bin/python -m bench.startup --tree before=/tmp/before --repeats 7

CPU seconds hardly move with other jobs on the machine; wall time does, so read wall
times as ratios to ``python -c pass`` measured in the same repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autocompress.atomic import write_json_atomic

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "autocompress"

# name -> (argv after the interpreter or the script, slow: fewer repeats where it starts
# Prefect before failing, as the old `run` without a limit did)
CLI_CASES = {
    "--help": ["--help"],
    "run --help": ["run", "--help"],
    "--version": ["--version"],
    "usage error: no limit": ["run", "--model", "default"],
    "usage error: unknown target": ["run", "--target", "nope/hf-eager/fp32",
                                    "--budget-fraction", "0.5"],
}
# Stage modules a served worker imports to run one step (flows.placement.run_stage).
STAGE_MODULES = ["tasks.registry", "tasks.verify", "tasks.distill", "tasks.smoke"]
SLOW_S = 5.0  # a case slower than this on its first run is repeated at most SLOW_REPEATS
SLOW_REPEATS = 3


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, float | int]:
    """Wall and CPU seconds of one process (CPU: the process and everything it waited for)."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 4), "cpu_s": round(usage.ru_utime + usage.ru_stime, 4),
            "exit_code": child.returncode}


def cases() -> dict[str, list[str]]:
    found = {"python -c pass": [sys.executable, "-c", "pass"]}
    found.update({f"autocompress {name}": [str(SCRIPT), *argv]
                  for name, argv in CLI_CASES.items()})
    found.update({f"stage process imports: {module}":
                  [sys.executable, "-c", f"import flows.placement, {module}"]
                  for module in STAGE_MODULES})
    return found


def environment(tree: Path, home: Path) -> dict[str, str]:
    """A fresh home (no fitted cost model, no Prefect database) and ``tree`` first on the path."""
    return {**os.environ, "PYTHONPATH": str(tree), "AUTOCOMPRESS_HOME": str(home),
            "PREFECT_HOME": str(home / "prefect"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true"}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def measure(trees: dict[str, Path], repeats: int) -> dict[str, dict]:
    """Every case in every tree, ``repeats`` times, trees alternating within a repeat."""
    runs: dict[str, dict[str, list[dict]]] = {case: {t: [] for t in trees} for case in cases()}
    with tempfile.TemporaryDirectory(prefix="ac-startup-") as tmp:
        envs = {name: environment(path, Path(tmp) / name) for name, path in trees.items()}
        for repeat in range(repeats):
            order = list(trees) if repeat % 2 == 0 else list(reversed(trees))
            for case, argv in cases().items():
                for tree in order:
                    done = runs[case][tree]
                    if repeat >= SLOW_REPEATS and done and done[0]["wall_s"] > SLOW_S:
                        continue
                    done.append(timed(argv, envs[tree], trees[tree]))  # cwd: `-c` puts it first
            print(f"repeat {repeat + 1}/{repeats} done", flush=True)
    return runs


def results_of(runs: dict[str, dict[str, list[dict]]]) -> dict[str, dict]:
    """Per case and tree: median and spread of wall and CPU time, the wall time as a ratio
    to ``python -c pass`` in the same tree's runs, and the exit codes seen."""
    floor = {tree: statistics.median(r["wall_s"] for r in done)
             for tree, done in runs["python -c pass"].items()}
    out: dict[str, dict] = {}
    for case, by_tree in runs.items():
        out[case] = {}
        for tree, done in by_tree.items():
            wall = [r["wall_s"] for r in done]
            out[case][tree] = {
                "wall_s": summary(wall), "cpu_s": summary([r["cpu_s"] for r in done]),
                "wall_over_python_pass": round(statistics.median(wall) / floor[tree], 1),
                "exit_codes": sorted({r["exit_code"] for r in done}), "runs": done}
    return out


def print_table(results: dict[str, dict], trees: list[str]) -> None:
    print(f"{'case':48s}" + "".join(f"{t + ' wall s (min-max)':>26s}{'cpu s':>8s}{'×pass':>7s}"
                                    for t in trees))
    for case, by_tree in results.items():
        cells = ""
        for tree in trees:
            r = by_tree[tree]
            w = r["wall_s"]
            wall = f"{w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f})"
            cells += f"{wall:>26s}{r['cpu_s']['median']:>8.2f}{r['wall_over_python_pass']:>7.1f}"
        print(f"{case:48s}{cells}")


def parse_tree(text: str) -> tuple[str, Path]:
    name, _, path = text.partition("=")
    if not path or not (Path(path) / "autocompress" / "cli.py").is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH of a checkout")
    return name, Path(path).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=parse_tree, action="append", default=[],
                        help="NAME=PATH of another checkout to time beside this one "
                        "(e.g. before=/tmp/before, a worktree of the older commit)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--note", default="", help="what else the machine was doing")
    parser.add_argument("--out", default="results/startup.json")
    args = parser.parse_args(argv)
    trees = dict(args.tree) | {"after": ROOT}
    load_before = os.getloadavg()
    results = results_of(measure(trees, args.repeats))
    print_table(results, list(trees))
    commits = {name: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path,
                                    capture_output=True, text=True).stdout.strip()
               for name, path in trees.items()}
    record = {"benchmark": "startup", "trees": {n: str(p) for n, p in trees.items()},
              "commits": commits, "repeats": args.repeats, "cores": os.cpu_count(),
              "python": sys.version.split()[0], "note": args.note,
              "loadavg_1_5_15": {"start": list(load_before), "end": list(os.getloadavg())},
              "cases": results}
    print(f"wrote {write_json_atomic(args.out, record, indent=1)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
