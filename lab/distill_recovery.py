"""How much of the score lost by pruning does distillation win back?

Prunes the teacher (Minitron importance) to an architecture whose *predicted*
TPOT on the target is about ``--tpot-fraction`` of the teacher's (or to the
spec given with ``--arch``, e.g. a search result), scores teacher / pruned /
distilled on the benchmark suite, measures real TPOT of teacher and student
with the verification harness, and prints + writes:

    recovery = (distilled − pruned) / (teacher − pruned)     per metric

Run (2 CPU cores; ~15-30 min at the default budget):

    .venv/bin/python -m lab.distill_recovery --tokens 1000000 \
        --out lab/results/distill_recovery.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

METRICS = ("mc_mean", "next_token_acc", "heldout_loss", "bits_per_byte")
LOWER_IS_BETTER = {"heldout_loss", "bits_per_byte"}


def candidate_specs(teacher_spec):
    """Minitron-style uniform candidates: fewer layers, narrower FFN, fewer heads."""
    from autocompress.arch import ArchSpec

    first = teacher_spec.layers[0]
    heads, kv = first.attention.num_heads, first.attention.num_kv_heads
    width = first.ffn.intermediate_size
    for layers in range(2, teacher_spec.num_layers + 1):  # first + last are protected
        for ffn_frac in (1.0, 0.75, 0.5):
            for head_frac in (1.0, 0.5):
                n_heads = max(kv, int(heads * head_frac) // kv * kv)
                yield ArchSpec.uniform(
                    num_layers=layers, hidden_size=teacher_spec.hidden_size,
                    num_heads=n_heads, num_kv_heads=kv,
                    intermediate_size=int(width * ffn_frac) // 16 * 16,
                ).complete_from(teacher_spec)


def pick_spec(teacher_spec, cost_model, workload, fraction: float):
    """The largest candidate whose predicted TPOT is ≤ fraction × the teacher's."""
    budget = fraction * cost_model.predict(teacher_spec, workload).tpot_ms
    specs = list(candidate_specs(teacher_spec))
    tpot = {id(s): cost_model.predict(s, workload).tpot_ms for s in specs}
    fitting = [s for s in specs if tpot[id(s)] <= budget]
    if not fitting:
        fastest = min(specs, key=lambda s: tpot[id(s)])
        print(f"no candidate reaches {fraction:.0%} of the teacher's predicted TPOT; "
              f"using the fastest ({tpot[id(fastest)] / budget * fraction:.0%})", flush=True)
        return fastest, budget
    return max(fitting, key=lambda s: s.num_params()), budget


def scores(model, tokenizer, corpus, limit) -> dict:
    from autocompress.evaluation import evaluate

    result = evaluate(model.eval(), tokenizer, limit=limit, corpus_dir=corpus)
    return {k: result.get(k) for k in (*METRICS, "mc_mean_stderr", "next_token_acc_stderr")}


def recovery(teacher: dict, pruned: dict, distilled: dict) -> dict:
    out = {}
    for key in METRICS:
        t, p, d = teacher.get(key), pruned.get(key), distilled.get(key)
        if None not in (t, p, d) and t != p:
            out[key] = (d - p) / (t - p)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="default")
    parser.add_argument("--arch", type=Path, help="ArchSpec JSON (default: pick by TPOT)")
    parser.add_argument("--tokens", type=int, default=1_000_000, help="distillation budget")
    parser.add_argument("--target", default="cpu-local/hf-eager/fp32")
    parser.add_argument("--workload", default="interactive-cpu")
    parser.add_argument("--tpot-fraction", type=float, default=0.5)
    parser.add_argument("--eval-limit", type=int, default=None,
                        help="items per task (default or 0: all of them)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("results/tmp/distill_recovery"))
    parser.add_argument("--out", type=Path, default=Path("lab/results/distill_recovery.json"))
    args = parser.parse_args()
    args.eval_limit = args.eval_limit or None
    torch.set_num_threads(args.threads)

    from autocompress.arch import ArchSpec
    from autocompress.costmodel.measure import measure_many
    from autocompress.costmodel.model import CostModel
    from autocompress.costmodel.target import Target
    from autocompress.costmodel.workload import get_workload
    from autocompress.data.corpus import ensure_corpus
    from autocompress.distill import DistillConfig, DistillData, distill
    from autocompress.importance import CalibrationConfig, importance_for_checkpoint
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import arch_spec_of, load_causal_lm
    from autocompress.prune import prune

    started = time.time()
    corpus = ensure_corpus()
    teacher_dir = resolve_model_dir(args.teacher)
    teacher, tokenizer = load_causal_lm(teacher_dir)
    target, workload = Target.parse(args.target), get_workload(args.workload)
    cost_model = CostModel.for_target(target)
    teacher_spec = arch_spec_of(teacher)
    if args.arch:
        spec, budget = ArchSpec.from_json(args.arch).complete_from(teacher_spec), None
    else:
        spec, budget = pick_spec(teacher_spec, cost_model, workload, args.tpot_fraction)
    print(f"student spec: {spec.num_layers} layers, {spec.num_params():,} params "
          f"(teacher {teacher_spec.num_params():,})", flush=True)

    importance = importance_for_checkpoint(teacher_dir, CalibrationConfig(), progress=False)
    student = prune(teacher, importance, spec)

    # Scores before distillation are cached: they cost as much as the distillation.
    args.work.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{teacher_dir}|{spec.to_json()}|{args.eval_limit}".encode()).hexdigest()
    cache = args.work / f"scores-before-{key[:12]}.json"
    if cache.exists():
        before = json.loads(cache.read_text())
    else:
        print("scoring teacher and pruned student ...", flush=True)
        before = {"teacher": scores(teacher, tokenizer, corpus, args.eval_limit),
                  "pruned": scores(student, tokenizer, corpus, args.eval_limit)}
        cache.write_text(json.dumps(before))
    measured = measure_many([teacher, student], workload, repeats=7, progress=False)

    out_dir = args.work / "student"
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.rmtree(out_dir.with_name(out_dir.name + ".work"), ignore_errors=True)
    config = DistillConfig(tokens=args.tokens, lr=args.lr, eval_every=100)
    print(f"distilling {config.steps} steps ({args.tokens:,} tokens) ...", flush=True)
    student.train()
    result = distill(teacher, student, DistillData.from_corpus(tokenizer, corpus, config.seq_len),
                     config, out_dir, tokenizer=tokenizer)
    distilled = scores(student, tokenizer, corpus, args.eval_limit)

    report = {
        "teacher": str(teacher_dir), "target": target.name, "workload": workload.name,
        "student_spec": json.loads(spec.to_json()),
        "params": {"teacher": teacher_spec.num_params(), "student": spec.num_params()},
        "tpot_ms": {
            "teacher_measured": measured[0].tpot_ms.model_dump(),
            "student_measured": measured[1].tpot_ms.model_dump(),
            "teacher_predicted": cost_model.predict(teacher_spec, workload).tpot_ms,
            "student_predicted": cost_model.predict(spec, workload).tpot_ms,
            "budget_predicted": budget,
            "measured_ratio": measured[1].tpot_ms.median / measured[0].tpot_ms.median,
        },
        "distill": {"tokens": result.tokens_seen, "steps": result.steps,
                    "seconds": result.seconds, "evals": result.evals,
                    "config": result.config},
        "scores": {**before, "distilled": distilled},
        "recovery": recovery(before["teacher"], before["pruned"], distilled),
        "cost_model": cost_model.version,
        "torch_threads": args.threads,
        "wall_seconds": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    _print_table(report)


def _print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"distillation recovery, {report['distill']['tokens']:,} tokens; "
                        f"student TPOT = {report['tpot_ms']['measured_ratio']:.0%} of teacher "
                        "(measured)")
    for column in ("metric", "teacher", "pruned", "distilled", "recovered"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    s, rec = report["scores"], report["recovery"]
    for key in METRICS:
        row = [s[name].get(key) for name in ("teacher", "pruned", "distilled")]
        table.add_row(key, *("-" if v is None else f"{v:.4f}" for v in row),
                      f"{rec[key]:.0%}" if key in rec else "-")
    Console().print(table)


if __name__ == "__main__":
    main()
