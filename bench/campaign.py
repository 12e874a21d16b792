"""The decisive comparison as a campaign of session-sized units (issue 62).

A session here lasts 3 hours and no process outlives it, so the pre-registered plan
(``lab/plans/decisive-comparison.md``, amendment 1) is cut into *units*: one seed of one
cell, a few methods, on one host. This script reads the plan's units, runs the first one
not yet done and writes each step's JSON under ``results/campaign/UNIT/`` as it finishes:

- ``eval_teacher.json``: the teacher on the decisive items (``autocompress eval``);
- per method, ``compare_METHOD.json`` (``bench.compare``: the compress flow users run) and
  ``eval_METHOD.json`` (that model on the decisive items);
- ``unit.json``: the host, the frozen commit, each step's seconds.

A unit interrupted at a session's end resumes where it stopped when its work directory
(``$AUTOCOMPRESS_HOME``: the flows' stage cache) survives; otherwise its partial results are
moved to ``lab/results/campaign_restarted/`` (they stay listed) and the unit starts again,
since its pairs must share one host. ``--commit`` commits each finished step's files.
``--hours H`` (the session's hours left) stops a unit before a step when the steps left
would not finish in time at this host's pace (its seconds on the unit's steps so far
against the finished units'): hosts here differ threefold, and a unit cut short is lost.

    .venv/bin/python -m bench.campaign status           # the table so far
    .venv/bin/python -m bench.campaign run --commit     # the next unit, in the background:
    nohup .venv/bin/python -m bench.campaign run --commit --hours 2.8 > campaign.log 2>&1 &
    .venv/bin/python -m bench.campaign run --dry-run    # the commands it would run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "lab" / "plans" / "decisive-comparison.md"
RESULTS = ROOT / "results" / "campaign"
RESTARTED = ROOT / "lab" / "results" / "campaign_restarted"
UNITS_BLOCK = re.compile(r"```json campaign-units\n(.*?)\n```", re.S)

# The cell every unit runs (the plan's "Cells"); only the budget varies by unit.
TEACHER = "smollm2-135m"
TARGET = "cpu-local/llama.cpp/q4_0"
PRESET = "interactive-cpu"
EVAL_ARGS = ["--tasks", "local,humaneval_bpb", "-c", "num_items=300", "-c", "seed=0"]
DISTILL = {"seq_len": 256, "batch_size": 16, "lr": 0.001, "eval_batches": 2}
TOKENS_PER_STEP = DISTILL["seq_len"] * DISTILL["batch_size"]


class Unit(BaseModel):
    """One unit of the plan: a seed of a cell and the methods run there on one host."""

    id: str
    seed: int
    methods: list[str] = Field(min_length=1)
    kind: Literal["compare", "recovery"] = "compare"
    budget: float | None = None  # fraction of the teacher's TPOT (compare units)
    limits_from: str | None = None  # the unit whose limits this one carries
    from_unit: str | None = None  # recovery: the unit whose architectures it distils again
    tokens: int = 200_000


# ------------------------------------------------------------------ the plan


def plan_units(plan: Path = PLAN) -> list[Unit]:
    """The units of the plan's ``campaign-units`` block, in order, checked."""
    found = UNITS_BLOCK.search(plan.read_text())
    if not found:
        raise SystemExit(f"{plan} has no ```json campaign-units block: write the plan first")
    units = [Unit.model_validate(u) for u in json.loads(found.group(1))]
    ids = [u.id for u in units]
    for unit in units:
        ref = unit.limits_from or unit.from_unit
        if ref is not None and (ref not in ids or ids.index(ref) >= ids.index(unit.id)):
            raise SystemExit(f"unit {unit.id} refers to {ref}, which is not an earlier unit")
    return units


def unit_dir(unit: Unit, results: Path = RESULTS) -> Path:
    return results / unit.id


# ------------------------------------------------------------------ steps


class Step(BaseModel):
    """One resumable piece of a unit: a command whose finished output is ``out``."""

    name: str
    out: Path
    argv: list[str]
    # Set when the argv can only be known once earlier steps are done (a model's path).
    needs: str | None = None


def _python() -> str:
    return sys.executable


def _autocompress() -> str:
    exe = Path(sys.executable).with_name("autocompress")
    return str(exe) if exe.exists() else "autocompress"


def compare_argv(unit: Unit, method: str, out: Path, limits_json: Path | None) -> list[str]:
    """The plan's ``bench.compare`` command of one method of a compare unit."""
    argv = [_python(), "-m", "bench.compare", "--teacher", TEACHER, "--target", TARGET,
            "--presets", PRESET, "--budgets", f"{unit.budget:g}", "--seeds", str(unit.seed),
            "--methods", method, "--search-steps", "100",
            "--distill-tokens", str(unit.tokens), "--reduced", "--json", str(out)]
    if limits_json is not None:
        argv += ["--limits-from", str(limits_json)]
    return argv


def eval_argv(model: str, out: Path) -> list[str]:
    return [_autocompress(), "eval", "--model", model, *EVAL_ARGS, "--json", str(out)]


def limits_source(unit: Unit, units: list[Unit], results: Path) -> Path | None:
    """The compare JSON whose limits a unit's *first* method carries (None: it sets its own).

    A ``b`` unit carries its ``a`` unit's limits unless its record says this host read the
    teacher too far away from there (then it set its own, as the plan allows)."""
    if unit.limits_from is None:
        return None
    record = read_record(unit_dir(unit, results))
    if record.get("own_limits_because"):
        return None
    source = next(u for u in units if u.id == unit.limits_from)
    return unit_dir(source, results) / f"compare_{source.methods[0]}.json"


def unit_steps(unit: Unit, units: list[Unit], results: Path = RESULTS) -> list[Step]:
    """Every step of a unit, in the order they run."""
    here = unit_dir(unit, results)
    steps = [Step(name="teacher eval", out=here / "eval_teacher.json",
                  argv=eval_argv(TEACHER, here / "eval_teacher.json"))]
    if unit.kind == "recovery":
        return steps + recovery_steps(unit, units, results)
    first = here / f"compare_{unit.methods[0]}.json"
    carried = limits_source(unit, units, results)
    for i, method in enumerate(unit.methods):
        out = here / f"compare_{method}.json"
        steps.append(Step(name=f"{method} compare", out=out,
                          argv=compare_argv(unit, method, out, carried if i == 0 else first)))
        steps.append(Step(name=f"{method} eval", out=here / f"eval_{method}.json", argv=[],
                          needs=str(out)))
    return steps


def recovery_steps(unit: Unit, units: list[Unit], results: Path) -> list[Step]:
    """Prune each method's architecture of ``from_unit`` again and distil it longer."""
    source = next(u for u in units if u.id == unit.from_unit)
    here, there = unit_dir(unit, results), unit_dir(source, results)
    steps: list[Step] = []
    total = -(-unit.tokens // TOKENS_PER_STEP)
    for method in unit.methods:
        arch = here / f"arch_{method}.json"
        pruned, model = here / "work" / f"pruned_{method}", here / "work" / f"distilled_{method}"
        config = [f"{k}={v}" for k, v in {**DISTILL, "seed": unit.seed,
                                          "warmup_steps": max(1, total // 10)}.items()]
        steps += [
            Step(name=f"{method} arch", out=arch, argv=[],
                 needs=str(there / f"compare_{method}.json")),
            Step(name=f"{method} prune", out=pruned / "config.json",
                 argv=[_autocompress(), "prune", "--model", TEACHER, "--arch", str(arch),
                       "--out", str(pruned)]),
            Step(name=f"{method} distill", out=model / "config.json",
                 argv=[_autocompress(), "distill", "--model", str(pruned), "--teacher", TEACHER,
                       "--tokens", str(unit.tokens), "--out", str(model),
                       *[a for c in config for a in ("-c", c)]]),
            Step(name=f"{method} eval", out=here / f"eval_{method}.json",
                 argv=eval_argv(str(model), here / f"eval_{method}.json")),
        ]
    return steps


def only_method(compare_json: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run, its one method's entry) of a one-cell, one-method compare JSON."""
    [run] = json.loads(compare_json.read_text())["runs"]
    [method] = run["methods"].values()
    return run, method


def model_dir(compare_json: Path) -> str:
    """The distilled model of a one-method compare JSON, as a local directory."""
    _, method = only_method(compare_json)
    if not method["seeds"]:
        raise RuntimeError(f"{compare_json} has no model: {method.get('failed')}")
    return method["seeds"][0]["files"]["model"].removeprefix("file://")


def resolve(step: Step) -> Step:
    """An eval step of a compare unit, its model taken from the compare JSON it needs."""
    if step.needs is None:
        return step
    return step.model_copy(update={"argv": eval_argv(model_dir(Path(step.needs)), step.out)})


# ------------------------------------------------------------------ the unit's record


def this_host() -> dict[str, Any]:
    """What identifies the host a unit ran on (its pairs must share one)."""
    from autocompress.hardware import machine_summary

    return {"hostname": socket.gethostname(), **machine_summary()}


def frozen_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def read_record(here: Path) -> dict[str, Any]:
    path = here / "unit.json"
    return json.loads(path.read_text()) if path.exists() else {}


def write_record(here: Path, record: dict[str, Any]) -> None:
    from autocompress.atomic import write_json_atomic

    write_json_atomic(here / "unit.json", record)


def workdir_token(unit: Unit) -> Path:
    """The marker in the work directory that says which start of a unit it holds."""
    from autocompress.paths import home  # where the flows' stage cache lives

    return home() / "campaign" / f"{unit.id}.token"


def start_or_resume(unit: Unit, here: Path, restarted: Path = RESTARTED) -> dict[str, Any]:
    """The unit's record: resumed if its work directory holds this start's token; else a
    fresh start (earlier partial results moved to ``restarted``, never deleted)."""
    record, token = read_record(here), workdir_token(unit)
    if record and token.exists() and token.read_text().strip() == record.get("token"):
        record.setdefault("resumed", []).append(_now())
        return record
    if here.exists() and any(here.iterdir()):
        keep = restarted / f"{unit.id}_{record.get('started', 'unknown').replace(':', '')}"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(here), str(keep))
        print(f"[campaign] {unit.id}: its work directory is gone (a new session or host); "
              f"partial results kept in {keep}; starting the unit again", flush=True)
    here.mkdir(parents=True, exist_ok=True)
    record = {"unit": unit.model_dump(), "token": secrets.token_hex(8), "started": _now(),
              "host": this_host(), "commit": frozen_commit(), "steps": {}}
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text(record["token"])
    return record


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ------------------------------------------------------------------ running


Runner = Callable[[list[str], Path], int]


def campaign_commit(units: list[Unit], results: Path = RESULTS) -> str:
    """The commit every unit's code comes from: the one that started the first unit
    (the plan's frozen code), or HEAD before any unit has started."""
    first = read_record(unit_dir(units[0], results))
    return first.get("commit") or frozen_commit()


def frozen_tree(commit: str) -> Path:
    """A git worktree of ``commit`` in the work directory (made again where it is gone):
    the unit's commands import the search, the flows and the benchmarks from there, so
    work landing on main meanwhile changes neither what a unit computes nor its stage
    cache's keys."""
    from autocompress.paths import home

    tree = home() / "campaign" / f"code-{commit[:12]}"
    if not (tree / ".git").exists():
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), commit], cwd=ROOT,
                       check=True, capture_output=True)
    return tree


def run_logged(argv: list[str], log: Path, code: Path = ROOT) -> int:
    """Run one step's command from the code in ``code``, its output appended to the
    unit's log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    # The worktree's packages come first on the path (the editable install's finder is last).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with log.open("a") as out:
        out.write(f"\n$ (in {code}) {' '.join(argv)}\n")
        out.flush()
        child = subprocess.Popen(argv, cwd=code, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            return child.wait()
        finally:  # stopped (Ctrl-C, SIGTERM): the step stops with it, resumable
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()


def git_commit(paths: list[Path], message: str) -> None:
    """Commit only ``paths`` (others' staged or unstaged work is left as it is)."""
    rel = [str(p.relative_to(ROOT)) for p in paths if p.exists()]
    for _ in range(10):  # another git process may hold the index for a moment
        add = subprocess.run(["git", "add", "--", *rel], cwd=ROOT, capture_output=True, text=True)
        done = add.returncode == 0 and subprocess.run(
            ["git", "commit", "-q", "-m", message, "--", *rel], cwd=ROOT,
            capture_output=True, text=True).returncode == 0
        if done:
            return
        time.sleep(3)
    print(f"[campaign] could not commit {', '.join(rel)}; commit them by hand", flush=True)


def past_seconds(units: list[Unit], results: Path = RESULTS) -> dict[str, float]:
    """Each step's median seconds over the finished units (the campaign's own record)."""
    seen: dict[str, list[float]] = {}
    for other in units:
        record = read_record(unit_dir(other, results))
        if record.get("finished"):
            for name, step in record.get("steps", {}).items():
                if "seconds" in step:
                    seen.setdefault(name, []).append(step["seconds"])
    return {name: statistics.median(values) for name, values in seen.items()}


def time_left_estimate(record: dict[str, Any], names: list[str],
                       past: dict[str, float]) -> tuple[float, float]:
    """(this host's pace against the finished units, the seconds the steps ``names`` would
    take at that pace): a step the record never saw counts as the slowest of its kind."""
    done = [(step["seconds"], past[name]) for name, step in record["steps"].items()
            if "seconds" in step and past.get(name)]
    pace = sum(a for a, _ in done) / sum(b for _, b in done) if done else 1.0

    def typical(name: str) -> float:
        kind = [v for n, v in past.items() if n.split()[-1] == name.split()[-1]]
        return past.get(name, max(kind, default=0.0))

    return pace, pace * sum(typical(name) for name in names)


def run_unit(unit: Unit, units: list[Unit], results: Path = RESULTS, runner: Runner = run_logged,
             commit: bool = False, restarted: Path = RESTARTED,
             deadline: float | None = None, clock: Callable[[], float] = time.time
             ) -> dict[str, Any]:
    """Run every step of ``unit`` not yet done; returns its record. ``deadline`` (a
    ``clock`` time: the session's end): stop before a step when the steps left would not
    finish by then at this host's pace, since a unit cut at a session's end starts again."""
    here = unit_dir(unit, results)
    record = start_or_resume(unit, here, restarted)
    write_record(here, record)
    log = here / "unit.log"
    steps = unit_steps(unit, units, results)
    past = past_seconds(units, results)
    for index, step in enumerate(steps):
        if step.out.exists():
            continue
        if deadline is not None:
            left = [s.name for s in steps[index:]
                    if not s.out.exists() and not s.name.endswith(" arch")]  # arch: no compute
            pace, need = time_left_estimate(record, left, past)
            remaining = deadline - clock()
            if need > remaining:
                record["stopped"] = {"before": step.name, "at": _now(), "pace": round(pace, 2),
                                     "estimate_s": round(need), "left_s": round(remaining)}
                write_record(here, record)
                raise SystemExit(
                    f"[campaign] {unit.id}: stopped before {step.name}: at this host's pace "
                    f"({pace:.1f}x the finished units) the rest takes about {need / 3600:.1f} h "
                    f"and {max(0.0, remaining) / 3600:.1f} h are left; run it in a "
                    "session with that time (a unit cut at a session's end starts again)")
        if step.name.endswith(" arch"):
            _write_arch(step)
        else:
            step = resolve(step)
            t0 = time.perf_counter()
            print(f"[campaign] {unit.id}: {step.name} ...", flush=True)
            code = runner(step.argv, log)
            modelless = _set_aside_if_modelless(step)  # before any retry looks at the file
            code = code or modelless
            if code != 0 and _carried_limits_refused(step, unit, log):
                record["own_limits_because"] = "this host read the teacher more than 10% " \
                                               f"away from unit {unit.limits_from}'s"
                write_record(here, record)
                return run_unit(unit, units, results, runner, commit, restarted)
            if code != 0 or not step.out.exists():
                record["steps"][step.name] = {"failed": code, "at": _now()}
                write_record(here, record)
                raise SystemExit(f"[campaign] {unit.id}: {step.name} failed (exit {code}); "
                                 f"see {log}; run the campaign again to resume")
            record["steps"][step.name] = {"seconds": round(time.perf_counter() - t0, 1),
                                          "finished": _now()}
        write_record(here, record)
        print(f"[campaign] {unit.id}: {step.name} done", flush=True)
        if commit and _published(step.out):
            git_commit([step.out, here / "unit.json"], f"campaign {unit.id}: {step.name} "
                       f"({record['steps'].get(step.name, {}).get('seconds', 0) / 3600:.2f} h)")
    record["finished"] = _now()
    write_record(here, record)
    if commit:
        git_commit([here / "unit.json"], f"campaign {unit.id}: finished")
    return record


def _published(path: Path) -> bool:
    """Whether a step's output is a result to commit (not a model under ``work/``)."""
    return path.is_relative_to(ROOT) and "work" not in path.relative_to(ROOT).parts


def _set_aside_if_modelless(step: Step) -> int:
    """A compare JSON whose method found no model (bench.compare writes one even then) is
    renamed ``*.failed-TIME.json``, so that a re-run does not take it for a finished step;
    returns 1 if so."""
    if "bench.compare" not in step.argv or not step.out.exists():
        return 0
    if only_method(step.out)[1]["seeds"]:
        return 0
    step.out.rename(step.out.with_suffix(f".failed-{_now().replace(':', '')}.json"))
    return 1


def _write_arch(step: Step) -> None:
    from autocompress.atomic import write_json_atomic

    write_json_atomic(step.out, only_method(Path(step.needs))[1]["seeds"][0]["arch"])


def _carried_limits_refused(step: Step, unit: Unit, log: Path) -> bool:
    """Whether a carried-limits compare stopped because this host reads the teacher too
    far from the host that set them (bench.compare's host refusal)."""
    from autocompress.limits import HOST_REFUSAL

    if unit.limits_from is None or "--limits-from" not in step.argv:
        return False
    tail = log.read_text()[-4000:] if log.exists() else ""
    return HOST_REFUSAL in tail and unit.limits_from in step.argv[
        step.argv.index("--limits-from") + 1]


def is_done(unit: Unit, results: Path = RESULTS) -> bool:
    return bool(read_record(unit_dir(unit, results)).get("finished"))


# ------------------------------------------------------------------ status


def status_rows(units: list[Unit], results: Path = RESULTS) -> list[dict[str, Any]]:
    """One row per unit: methods done, hours, host, the teacher's timed TPOT and limit."""
    rows = []
    for unit in units:
        here = unit_dir(unit, results)
        record = read_record(here)
        done = [m for m in unit.methods if (here / f"eval_{m}.json").exists()]
        seconds = sum(s.get("seconds", 0) for s in record.get("steps", {}).values())
        host = record.get("host", {})
        rows.append({"unit": unit.id, "methods": unit.methods, "done": done,
                     "state": "done" if record.get("finished") else
                     ("started" if record else "not started"),
                     "hours": round(seconds / 3600, 2), "host": host.get("hostname"),
                     "cpu": host.get("cpu"), **teacher_reading(here, unit)})
    return rows


def teacher_reading(here: Path, unit: Unit) -> dict[str, Any]:
    """The teacher's timed TPOT in the unit's first compare and the limit there."""
    first = here / f"compare_{unit.methods[0]}.json"
    if unit.kind != "compare" or not first.exists():
        return {}
    run, _ = only_method(first)
    timed = (run.get("teacher_verify") or {}).get("measured", {}).get("tpot_ms")
    limit = (run.get("limits") or {}).get("max_tpot_ms")
    return {"teacher_tpot_ms": timed, "limit_tpot_ms": limit,
            "limit_share_of_timed": limit / timed if timed and limit else None}


def status_table(rows: list[dict[str, Any]]) -> str:
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, int | float) else "–"

    lines = ["| unit | methods done | state | hours | host | teacher TPOT (ms) "
             "| limit (ms, share) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = r.get("limit_share_of_timed")
        lines.append(
            f"| {r['unit']} | {len(r['done'])}/{len(r['methods'])} "
            f"({', '.join(r['done']) or '–'}) | {r['state']} | {num(r['hours'], '.2f')} | "
            f"{r['host'] or '–'} | {num(r.get('teacher_tpot_ms'), '.3f')} | "
            f"{num(r.get('limit_tpot_ms'), '.3f')}"
            f"{f' ({share:.0%})' if share else ''} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ CLI


def _positive_hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        hours = 0.0
    if not hours > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours above 0, "
                                         "e.g. --hours 2.8")
    return hours


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.campaign", description=__doc__.split("\n")[0])
    p.add_argument("action", nargs="?", choices=("run", "status"), default="status")
    p.add_argument("--unit", default=None, help="Run this unit (default: the first not done).")
    p.add_argument("--commit", action="store_true",
                   help="git-commit each finished step's JSON (only those files).")
    p.add_argument("--dry-run", action="store_true", help="Print the unit's commands only.")
    p.add_argument("--hours", type=_positive_hours, default=None,
                   help="Hours this session has left: stop before a step that would not "
                   "finish in time at this host's pace (its speed on the unit's steps so far "
                   "against the finished units).")
    args = p.parse_args(argv)
    units = plan_units()
    if args.action == "status":
        print(status_table(status_rows(units)))
        return 0
    pending = [u for u in units if not is_done(u)]
    if args.unit:
        pending = [u for u in units if u.id == args.unit]
        if not pending:
            raise SystemExit(f"no unit {args.unit!r} in {PLAN.name}; units: "
                             f"{', '.join(u.id for u in units)}")
    if not pending:
        print("every unit of the plan is done")
        return 0
    unit = pending[0]
    if args.dry_run:
        for step in unit_steps(unit, units):
            print(f"# {step.name} -> {step.out.relative_to(ROOT)}")
            print(" ".join(step.argv) if step.argv else f"  (from {step.needs})")
        return 0
    # SIGTERM (a session ending, `kill`) stops the unit as Ctrl-C does: the running step's
    # command is stopped too, and the next run resumes there.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    code = frozen_tree(campaign_commit(units))
    print(f"[campaign] {unit.id}: code from {code}", flush=True)
    t0 = time.perf_counter()
    deadline = time.time() + 3600 * args.hours if args.hours is not None else None
    run_unit(unit, units, commit=args.commit, deadline=deadline,
             runner=lambda argv, log: run_logged(argv, log, code))
    print(f"[campaign] {unit.id} finished in {(time.perf_counter() - t0) / 3600:.2f} h")
    print(status_table(status_rows(units)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
