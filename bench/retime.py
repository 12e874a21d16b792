"""Re-time an earlier comparison's models on this machine, under a comparison's limits here.

Machines differ between sessions (one "AMD EPYC" here had AVX2 only, another AVX-512), so
a budget such as "50% of the teacher's predicted TPOT" is a different number of
milliseconds on each, and a method run on one machine cannot be paired with a method run
on another as they stand. A model's accuracy (its per-item benchmark scores) does not
depend on the machine; its cost does. This script re-times every architecture that an
earlier ``bench compare`` JSON recorded, on this machine and target, with the check users
run (``autocompress.verify.verify``, as the flow's verify stage), under the limits of the
same cell in a comparison run here (``--limits-from``), and writes a copy of the earlier
JSON whose measured and predicted costs, verify results and limits are this
machine's. The originals
stay beside them (``measured_elsewhere``). Then

    autocompress bench readme-table --json OLD_retimed.json:autocompress --json NEW.json:minitron

pairs the two methods item by item under one limit, measured on one machine.

A random-weight model of each architecture is timed (the search and the baseline time
their candidates the same way): the engine's cost does not depend on the weights' values.

    .venv/bin/python -m bench.retime --json EARLIER.json --methods autocompress \
        --limits-from NEW.json --out EARLIER_retimed.json
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autocompress.errors import AutoCompressError
from bench.report import cells_with_limits, load_compare

# What a comparison records of a model's timing on the target (bench/compare.py).
TIMING_FIELDS = ("measured", "noise", "predicted", "verify_ok", "violations",
                 "prediction_error", "measurement")


# What a comparison records per cell of the machine it ran on: the limits, and the teacher's
# predicted and measured cost there.
CELL_FIELDS = ("limits", "teacher_predicted", "teacher_verify", "cost_model")


def time_arch(arch: dict, teacher_dir: Path, target: str, preset: str,
              limits: dict[str, float], repeats: int, cost_model) -> dict[str, Any]:
    """``verify`` of a random-weight model of ``arch`` (with the teacher's tokenizer and
    non-shape settings); returns the comparison's timing fields."""
    from transformers import AutoConfig, AutoTokenizer

    from autocompress.arch import ArchSpec
    from autocompress.limits import Limits
    from autocompress.modeling import build_model
    from autocompress.verify import verify

    spec = ArchSpec.model_validate(arch)
    model = build_model(spec, AutoConfig.from_pretrained(teacher_dir), seed=0)
    with tempfile.TemporaryDirectory(prefix="ac-retime-") as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(teacher_dir).save_pretrained(tmp)
        report = verify(tmp, target, preset, Limits.model_validate(limits), repeats=repeats,
                        cost_model=cost_model).model_dump(mode="json")
    return {"measured": report["measured"], "noise": report["noise"],
            "predicted": report["predicted"], "verify_ok": report["ok"],
            "violations": report["violations"],
            "prediction_error": report["prediction_error"],
            "measurement": {k: report["measurement"].get(k)
                            for k in ("ttft_ms", "tpot_ms", "repeats", "threads")}}


def retimed(data: dict, methods: list[str] | None, cells: dict[tuple[str, float], dict],
            timer) -> dict:
    """A copy of ``data`` with every kept method's seeds re-timed by ``timer(arch, preset,
    limits)`` under the limits of their cell in ``cells`` (``report.cells_with_limits``),
    whose ``CELL_FIELDS`` replace the cell's; what was there before stays as
    ``measured_elsewhere`` / ``*_elsewhere``."""
    out = copy.deepcopy(data)
    for run in out["runs"]:
        cell = (run["preset"], float(run["budget_fraction"]))
        if cell not in cells:
            raise AutoCompressError(f"no limits for {cell[0]} @ {cell[1]:g}",
                                    hint="give --limits-from a comparison with that cell")
        for key in CELL_FIELDS:
            run[f"{key}_elsewhere"], run[key] = run.get(key), cells[cell].get(key)
        for name in list(run["methods"]):
            if methods is not None and name not in methods:
                del run["methods"][name]
                continue
            for entry in run["methods"][name]["seeds"]:
                entry["measured_elsewhere"] = {k: entry.get(k) for k in TIMING_FIELDS}
                entry.update(timer(entry["arch"], run["preset"], run["limits"]))
    return out


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="The earlier comparison (bench compare JSON).")
    p.add_argument("--methods", nargs="+", default=None,
                   help="Only these methods (default: every method in the file).")
    p.add_argument("--limits-from", default=None, metavar="JSON",
                   help="A comparison run on this machine: each cell is checked against its "
                   "limits, and takes its teacher's costs (default: the earlier file's own).")
    p.add_argument("--target", default=None,
                   help="Target to time on (default: the earlier comparison's).")
    p.add_argument("--cost-model", default=None, metavar="COSTMODEL_JSON",
                   help="The fitted cost model for the predictions beside the timings, e.g. "
                   "the flow's costmodel artifact (default: the target's registered one).")
    p.add_argument("--repeats", type=int, default=5, help="Timing repeats per model.")
    p.add_argument("--out", required=True, help="Where to write the re-timed copy.")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    from autocompress.atomic import write_json_atomic
    from autocompress.costmodel import CostModel
    from autocompress.costmodel.target import Target
    from autocompress.hardware import machine_summary
    from autocompress.model_source import resolve_model_dir

    args = build_parser(prog).parse_args(argv)
    inputs = [Path(p).resolve() for p in (args.json, args.limits_from) if p]
    if Path(args.out).resolve() in inputs:
        raise AutoCompressError(f"--out {args.out} is one of the inputs",
                                hint="write the re-timed copy to a new file")
    data = load_compare(args.json)
    cells = cells_with_limits(load_compare(args.limits_from) if args.limits_from else data,
                              args.limits_from or args.json)
    target = args.target or data["target"]
    teacher_dir = resolve_model_dir(data["settings"]["teacher"])
    cost_model = (CostModel.load(args.cost_model) if args.cost_model
                  else CostModel.for_target(Target.parse(target)))

    def timer(arch: dict, preset: str, cell: dict) -> dict:
        return time_arch(arch, teacher_dir, target, preset, cell, args.repeats, cost_model)

    out = retimed(data, args.methods, cells, timer)
    out["retimed"] = {"from": args.json, "limits_from": args.limits_from, "target": target,
                      "cost_model": cost_model.version, "repeats": args.repeats,
                      "created": datetime.now(UTC).isoformat(timespec="seconds")}
    out["machine_elsewhere"], out["machine"] = data.get("machine"), machine_summary()
    write_json_atomic(Path(args.out), out)
    for run in out["runs"]:
        for name, method in run["methods"].items():
            for entry in method["seeds"]:
                was = (entry["measured_elsewhere"].get("measured") or {})
                print(f"{run['preset']} @ {run['budget_fraction']:g} {name} seed {entry['seed']}: "
                      f"{_costs(entry['measured'])} here (was {_costs(was)}), "
                      f"{'pass' if entry['verify_ok'] else 'FAIL ' + ','.join(entry['violations'])}"
                      f" under {run['limits']}")
    print(f"wrote {args.out}")
    return out


def _costs(measured: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in measured.items() if k in ("tpot_ms", "ttft_ms"))


if __name__ == "__main__":
    from autocompress.cli import report_errors

    report_errors(main)
