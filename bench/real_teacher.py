"""A real pretrained teacher (SmolLM2-135M-Instruct) through AutoCompress on 2 CPU cores.

Three parts, each adding its section to ``--out`` (JSON) and printing a table:

- ``scores``: the local suite on SmolLM2 and on the bundled default teacher, on the
  same items (``--limit`` per task), with standard errors. Also writes SmolLM2's
  entry for ``autocompress/assets/named-teachers.json`` (``autocompress teacher list``
  and the built model card show them) to ``bench/results/named-teachers.json``; the
  package's copy is a static file, updated by copying that one over it in a commit.
- ``cache``: distillation speed of one SmolLM2 student, tokens/s with the teacher
  run live and with its cached top-k outputs (plus the one-off cost of building
  them), and the bf16-vs-fp32 timing that picked the precision.
- ``run``: the README's command, ``autocompress run --teacher smollm2-135m --target
  cpu-local/hf-eager/fp32 --workload interactive-cpu --budget-fraction 0.5`` (the
  compress flow through the CLI, in a subprocess), timed end to end; then ``verify``
  of the registered model on the target (the CLI again, with the limits and the cost
  model from its lineage) and the ``flow`` part below.
- ``flow``: the stages of the latest ``autocompress run --teacher smollm2-135m ...``
  read back from MLflow (wall time per stage, search time, distillation tokens and
  time, scores before/after distillation, the share of the loss recovered).

    flock /tmp/measure.lock nice -n 5 python -m bench.real_teacher run
    nice -n 10 python -m bench.real_teacher scores cache --limit 100

Timings on a shared host move with its load: every section records ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autocompress.atomic import write_json_atomic

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEACHER = "smollm2-135m"
RESULTS = Path(__file__).resolve().parent / "results" / "real_teacher.json"
NAMED_SCORES = RESULTS.with_name("named-teachers.json")  # the asset's next version


def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[:3].__str__()


def _machine() -> dict[str, Any]:
    from autocompress.hardware import machine_summary

    return machine_summary()


# ------------------------------------------------------------------ scores


def part_scores(args) -> dict[str, Any]:
    from autocompress.evaluation.suite import evaluate
    from autocompress.modeling import load_causal_lm
    from autocompress.teachers import summarize_eval

    out: dict[str, Any] = {"limit": args.limit, "machine": _machine(), "models": {}}
    given = dict(item.split("=", 1) for item in args.eval_json)
    for name in ("default", TEACHER):
        started = time.perf_counter()
        if name in given:  # `autocompress eval --model NAME --limit N --json FILE` output
            result = json.loads(Path(given[name]).read_text())
            params = result["details"]["num_params"]
        else:
            model, tok = load_causal_lm(name)
            result = evaluate(model, tok, limit=args.limit, model_name=name, quiet=False)
            params = sum(p.numel() for p in model.parameters())
        out["models"][name] = {**summarize_eval(result), "params": params,
                               "seconds": round(time.perf_counter() - started, 1),
                               "from": given.get(name, "evaluated here")}
    out["machine"]["loadavg_after"] = _load()
    a, b = out["models"]["default"], out["models"][TEACHER]
    print(f"{'model':14} {'params':>8} {'MC mean':>16} {'bits/byte':>10} {'loss/token':>10}")
    for name, row in out["models"].items():
        print(f"{name:14} {row['params'] / 1e6:7.1f}M {row['mc_mean']:.3f} ± "
              f"{row['mc_mean_stderr']:.3f}    {row['bits_per_byte']:10.3f} "
              f"{row['heldout_loss']:10.3f}")
    print(f"MC mean difference: {b['mc_mean'] - a['mc_mean']:+.3f}")
    _record_named_scores(out["models"][TEACHER], args.limit)
    return out


def _record_named_scores(row: dict[str, Any], limit: int | None) -> None:
    """The asset's content with this run's SmolLM2 entry, written beside the results: the
    package's ``assets/`` is never written at run time (an installed package may be
    read-only, and a measurement should land in the asset only through a commit)."""
    from autocompress.teachers import SCORES_FILE, recorded_scores, smollm2_gguf
    from autocompress.teachers import file_sha256 as sha

    data = json.loads(SCORES_FILE.read_text()) if SCORES_FILE.exists() else {}
    previous = recorded_scores(TEACHER)
    data[TEACHER] = {
        **{k: v for k, v in row.items() if k != "seconds"},
        "shape": previous.get("shape") or {"params": row["params"], "layers": 30,
                                           "vocab": 49152},
        "gguf_sha256": sha(smollm2_gguf()),
        "measured": f"bench/real_teacher.py, {time.strftime('%Y-%m-%d')}, "
                    f"{'all' if limit is None else limit} items per task",
    }
    NAMED_SCORES.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {NAMED_SCORES}; copy it over {SCORES_FILE} to publish these scores")


# ------------------------------------------------------------------ cache


def part_cache(args) -> dict[str, Any]:
    """tokens/s of one student: teacher live vs cached outputs (+ the cost of caching)."""
    import torch

    from autocompress.arch import ArchSpec
    from autocompress.data.corpus import ensure_corpus
    from autocompress.distill import DistillConfig, DistillData, distill
    from autocompress.importance import random_importance
    from autocompress.modeling import arch_spec_of, load_causal_lm
    from autocompress.prune import prune

    torch.set_num_threads(args.threads)
    teacher, tok = load_causal_lm(TEACHER)
    spec = arch_spec_of(teacher)
    # A student of about half the teacher's layer cost: half the FFN, every other block.
    half = ArchSpec.model_validate({**spec.model_dump(), "layers": [
        layer.model_copy(update={"ffn": layer.ffn.model_copy(
            update={"intermediate_size": layer.ffn.intermediate_size // 2})})
        if i % 2 == 0 else layer.model_copy(update={"attention": None, "ffn": None})
        for i, layer in enumerate(spec.layers)]})
    importance = random_importance(teacher, seed=0)
    data = DistillData.from_corpus(tok, ensure_corpus(), args.seq_len, heldout_windows=0)
    work = Path(args.work) / "cache-bench"
    shutil.rmtree(work, ignore_errors=True)
    runs = {}
    for label, topk, bf16 in (("live", 0, True), ("cached (building)", 64, False),
                              ("cached", 64, False)):
        student = prune(teacher, importance, half)
        config = DistillConfig(tokens=args.cache_steps * args.batch_size * args.seq_len,
                               seq_len=args.seq_len, batch_size=args.batch_size,
                               teacher_topk=topk, bf16=bf16, eval_batches=1)
        started = time.perf_counter()
        result = distill(teacher, student, data, config, work / label.split()[0] / label,
                         outputs_dir=work / "outputs")
        wall = time.perf_counter() - started
        runs[label] = {"tokens": result.tokens_seen, "train_seconds": result.seconds,
                       "wall_seconds": round(wall, 2),
                       "tokens_per_s": round(result.tokens_seen / result.seconds, 1),
                       "tokens_per_s_with_teacher_work": round(result.tokens_seen / wall, 1),
                       "bf16": result.bf16, "bf16_probe": result.bf16_probe,
                       "teacher_outputs": result.teacher_outputs,
                       "loss_first_last": [result.history[0]["loss"],
                                           result.history[-1]["loss"]],
                       "loadavg": _load()}
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'run':20} {'tokens/s (loop)':>16} {'tokens/s (incl. teacher work)':>30}  bf16")
    for label, row in runs.items():
        print(f"{label:20} {row['tokens_per_s']:16.1f} "
              f"{row['tokens_per_s_with_teacher_work']:30.1f}  {row['bf16']}")
    probe = runs["live"]["bf16_probe"]
    if probe:
        print(f"bf16 probe: fp32 {probe['fp32_s']:.3f} s vs bf16 {probe['bf16_s']:.3f} s "
              f"per 2-sequence step -> {'bf16' if runs['live']['bf16'] else 'fp32'}")
    return {"student_params": sum(p.numel() for p in prune(teacher, importance, half)
                                  .parameters()),
            "batch": [args.batch_size, args.seq_len], "steps": args.cache_steps,
            "machine": _machine(), "runs": runs}


# ------------------------------------------------------------------ run


def part_run(args) -> dict[str, Any]:
    """The README's ``autocompress run`` on SmolLM2, timed; then verify what it registered."""
    command = [sys.executable, "-m", "autocompress.cli", "run", "--teacher", TEACHER,
               "--target", args.target, "--workload", args.workload,
               "--budget-fraction", str(args.budget_fraction), "--register-as", args.register_as,
               "--experiment", args.experiment]
    if args.options:
        command += ["--options", args.options]
    if args.limit is not None:
        command += ["--eval-limit", str(args.limit)]
    out: dict[str, Any] = {"command": " ".join(command[1:]), "machine": _machine(),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    started = time.perf_counter()
    code = subprocess.run(command, check=False).returncode
    out.update(wall_seconds=round(time.perf_counter() - started, 1), exit_code=code,
               loadavg_after=_load())
    print(f"autocompress run: exit {code} after {out['wall_seconds'] / 60:.1f} min")
    if code == 0:
        out["verify"] = _verify_registered(args)
    out["flow"] = part_flow(args)
    return out


def _verify_registered(args) -> dict[str, Any]:
    """``autocompress verify`` of the newest registered version, against its lineage's
    limits and cost model (exit code 0 = every limit met when measured)."""
    from autocompress.artifacts import fetch
    from autocompress.tracking import lineage

    report = lineage(args.register_as)
    info = report.lineage
    model_dir = fetch(info.artifacts["model"])
    costmodel = fetch(info.artifacts["costmodel"])
    costmodel = costmodel / "costmodel.json" if costmodel.is_dir() else costmodel
    flags = {"max_ttft_ms": "--max-ttft-ms", "max_tpot_ms": "--max-tpot-ms",
             "max_e2e_ms": "--max-e2e-ms", "min_throughput_tok_s": "--min-throughput",
             "max_memory_gb": "--max-memory-gb"}
    command = [sys.executable, "-m", "autocompress.cli", "verify", "--model", str(model_dir),
               "--target", args.target, "--workload", args.workload,
               "--cost-model", str(costmodel)]
    for key, value in info.limits.items():
        command += [flags[key], str(value)]
    json_out = Path(args.work) / "real-teacher-verify.json"
    started = time.perf_counter()
    code = subprocess.run([*command, "--json", str(json_out)], check=False).returncode
    out = {"registered": f"{args.register_as}@{report.version}", "limits": info.limits,
           "exit_code": code, "passed": code == 0,
           "seconds": round(time.perf_counter() - started, 1), "loadavg": _load()}
    if json_out.exists():
        out["report"] = json.loads(json_out.read_text())
    print(f"verify {out['registered']} on {args.target}: "
          f"{'passed' if code == 0 else f'FAILED (exit {code})'}")
    return out


# ------------------------------------------------------------------ flow


def part_flow(args) -> dict[str, Any]:
    """The latest finished compress run of SmolLM2, read back from MLflow."""
    from autocompress.tracking import get_tracker

    tracker = get_tracker(args.experiment)
    client = tracker.client
    parents = client.search_runs(
        [tracker.experiment_id], filter_string="params.teacher = 'smollm2-135m'",
        order_by=["attributes.start_time DESC"])
    if not parents:
        raise SystemExit("no compress run of smollm2-135m in MLflow: run the flow first")
    parent = parents[0]
    children = client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    stages: dict[str, Any] = {}
    for run in sorted(children, key=lambda r: r.info.start_time):
        name = run.data.tags.get("autocompress.stage") or run.info.run_name
        seconds = ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000
        stages[name] = {"seconds": round(seconds, 1), "status": run.info.status,
                        "cached": run.data.tags.get("autocompress.cached") == "true",
                        "metrics": dict(run.data.metrics)}
    wall = ((parent.info.end_time or parent.info.start_time) - parent.info.start_time) / 1000
    out = {"mlflow_run_id": parent.info.run_id, "params": dict(parent.data.params),
           "wall_seconds": round(wall, 1), "stages": stages}
    out.update(_recovery(stages))
    print(f"flow {parent.info.run_id}: {wall / 60:.1f} min wall")
    for name, row in stages.items():
        print(f"  {name:22} {row['seconds']:8.1f} s  {row['status']}")
    for key in ("teacher_loss", "pruned_loss", "distilled_loss", "loss_recovered"):
        if out.get(key) is not None:
            print(f"  {key:22} {out[key]:.3f}")
    return out


def _recovery(stages: dict[str, Any]) -> dict[str, Any]:
    """Held-out loss teacher / pruned / distilled and the share of the gap closed."""
    # A stage run logs its result's metrics as ``result.<name>``.
    distill = stages.get("distill", {}).get("metrics", {})
    teacher = distill.get("result.teacher_heldout_loss")
    pruned = distill.get("result.initial_heldout_loss")
    final = distill.get("result.final_heldout_loss")
    out: dict[str, Any] = {"teacher_loss": teacher, "pruned_loss": pruned,
                           "distilled_loss": final}
    if None not in (teacher, pruned, final) and pruned != teacher:
        out["loss_recovered"] = (pruned - final) / (pruned - teacher)
    return out


PARTS = {"scores": part_scores, "cache": part_cache, "run": part_run, "flow": part_flow}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", choices=sorted(PARTS))
    parser.add_argument("--limit", type=int, default=None,
                        help="items per task (scores; run: --eval-limit)")
    parser.add_argument("--eval-json", action="append", default=[], metavar="NAME=FILE",
                        help="scores: take NAME's results from `autocompress eval --json`")
    parser.add_argument("--cache-steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--experiment", default="autocompress")
    parser.add_argument("--target", default="cpu-local/hf-eager/fp32", help="run")
    parser.add_argument("--workload", default="interactive-cpu", help="run")
    parser.add_argument("--budget-fraction", type=float, default=0.5, help="run")
    parser.add_argument("--register-as", default="smollm2-135m-compressed", help="run")
    parser.add_argument("--options", default=None, help="run: the CLI's --options (JSON)")
    parser.add_argument("--work", default="/tmp")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for part in args.parts:
        print(f"== {part}")
        results[part] = {**PARTS[part](args), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime())}
        write_json_atomic(args.out, results, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
