"""Searched vs matched-Minitron architectures on the three CPU presets (issue 5 "must show").

For each preset (local-coding-cpu, datacenter-cpu, interactive-cpu) a limit is set
at ``--fraction`` (default 50%) of the default teacher's predicted cost on the
preset's main metric. Then:

1. ``autocompress search`` (DNAS + exact repair), timed wall-clock;
2. the matched Minitron baseline (largest homogeneous model meeting the same
   limit, top-k by calibration KL), same importance and calibration data;
3. both are pruned from the teacher and scored by held-out loss *before* any
   distillation (``evaluation.heldout_loss``: fixed held-out windows).

Importance is computed once (forward passes on the calibration split) and shared.
Prints a table and writes ``lab/results/search_presets.json`` plus each preset's
arch JSONs, reports and trajectory plots under ``lab/results/search_presets/``.

    .venv/bin/python -m lab.search_presets [--teacher default] [--fraction 0.5]
        [--steps 240] [--threads 1] [--eval-batches 16]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from autocompress.arch import ArchSpec
from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import SearchContext
from autocompress.arch_search.dnas import DNASConfig
from autocompress.arch_search.minitron import MinitronConfig
from autocompress.arch_search.run import minitron_to_file, search_to_file
from autocompress.evaluation.heldout import heldout_windows
from autocompress.limits import LIMIT_METRICS
from autocompress.prune import prune

PRESETS = ("local-coding-cpu", "datacenter-cpu", "interactive-cpu")
RESULTS = Path(__file__).resolve().parent / "results"


def arch_text(arch: dict) -> str:
    """Compact per-layer text: ``h192 | 8/2:768 6/2:576 -:384 ...`` (q/kv:ffn, - = removed)."""
    parts = []
    for layer in arch["layers"]:
        att, ffn = layer["attention"], layer["ffn"]
        a = f"{att['num_heads']}/{att['num_kv_heads']}" if att else "-"
        f = str(ffn["intermediate_size"]) if ffn else "-"
        parts.append(f"{a}:{f}")
    return f"h{arch['hidden_size']} | " + " ".join(parts)


@torch.inference_mode()
def heldout(model, tokenizer, corpus_dir, batches: int) -> torch.Tensor:
    """Per-window mean next-token loss on ``evaluation.heldout_loss``'s held-out windows."""
    windows = heldout_windows(tokenizer, corpus_dir, 256, batches * 8, seed=0)
    losses = []
    for start in range(0, windows.shape[0], 8):
        batch = windows[start:start + 8]
        logits = model(input_ids=batch).logits[:, :-1].float()
        ce = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
        losses.append(ce.mean(dim=1))
    return torch.cat(losses)


def mean_stderr(values: torch.Tensor) -> tuple[float, float]:
    return float(values.mean()), float(values.std() / values.numel() ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", default="default")
    parser.add_argument("--target", default="cpu-local/hf-eager/fp32")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=DNASConfig().steps)
    parser.add_argument("--score", default="measured", choices=["measured", "probability"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--importance", type=Path, default=None)
    parser.add_argument("--minitron-top-k", type=int, default=MinitronConfig().top_k,
                        help="Homogeneous candidates scored by calibration KL (ModelOpt top-k).")
    parser.add_argument("--no-best-homogeneous", action="store_true",
                        help="Skip the stronger control: every feasible homogeneous candidate "
                        "scored by calibration KL (not only the top-k by parameters).")
    parser.add_argument("--json", type=Path, default=RESULTS / "search_presets.json")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    config = SearchConfig(dnas=DNASConfig(steps=args.steps), score=args.score,
                          minitron=MinitronConfig(top_k=args.minitron_top_k))
    art_dir = args.json.with_suffix("")
    art_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    base = SearchContext.build(args.teacher, args.target, args.presets[0], config,
                               importance=args.importance)
    importance_s = time.perf_counter() - t0
    model, tokenizer, imp = base.model, base.tokenizer, base.importance
    teacher_loss, teacher_stderr = mean_stderr(
        heldout(model, tokenizer, base.corpus_dir, args.eval_batches))
    print(f"teacher held-out loss {teacher_loss:.4f}; importance + setup {importance_s:.1f} s; "
          f"cost model {base.cost_model.version}")

    rows = []
    for preset in args.presets:
        ctx = SearchContext.build((model, tokenizer), args.target, preset, config,
                                  importance=imp)
        ctx.teacher_dir = base.teacher_dir
        limits = ctx.resolve_limits(None, args.fraction)
        print(f"\n== {preset}: {limits.describe()}")
        t = time.perf_counter()
        searched = search_to_file(ctx, limits, art_dir / f"{preset}.searched.json", config)
        search_s = time.perf_counter() - t
        t = time.perf_counter()
        baseline = minitron_to_file(ctx, art_dir / f"{preset}.minitron.json", limits=limits,
                                    config=config)
        baseline_s = time.perf_counter() - t
        row = {"preset": preset, "limits": limits.model_dump(exclude_none=True),
               "teacher_predicted": searched["teacher_predicted"]}
        runs = [("searched", searched, search_s), ("minitron", baseline, baseline_s)]
        if not args.no_best_homogeneous:
            every = config.model_copy(update={"minitron": MinitronConfig(top_k=100_000)})
            t = time.perf_counter()
            best = minitron_to_file(ctx, art_dir / f"{preset}.best-homogeneous.json",
                                    limits=limits, config=every)
            runs.append(("best_homogeneous", best, time.perf_counter() - t))
        for name, report, seconds in runs:
            spec = ArchSpec.from_json(json.dumps(report["arch"]))
            student = prune(model, imp, spec)
            per_window = heldout(student, tokenizer, ctx.corpus_dir, args.eval_batches)
            loss, stderr = mean_stderr(per_window)
            if name == "searched":
                searched_windows = per_window
            row[name] = {
                "heldout_loss": loss,
                "heldout_loss_stderr": stderr,
                "predicted": report["predicted"],
                "margins": report["margins"],
                "meets_limits": report["meets_limits"],
                "params": report["params"],
                "wall_s": seconds,
                "arch": arch_text(report["arch"]),
            }
            if name == "searched":
                row[name]["seconds"] = report["seconds"]
            else:  # paired over the same windows: baseline loss - searched loss
                gap, gap_err = mean_stderr(per_window - searched_windows)
                row[name]["gap_vs_searched"] = gap
                row[name]["gap_vs_searched_stderr"] = gap_err
                row[name]["candidates_scored"] = len(report["scored"])
                row[name]["candidates_total"] = report["num_candidates"]
                row[name]["param_target"] = report["param_target"]
            print(f"  {name:16s} loss {row[name]['heldout_loss']:.4f}  params "
                  f"{report['params']:>9,}  {seconds:6.1f} s  {row[name]['arch']}")
        rows.append(row)

    print_table(rows, teacher_loss)
    wins = sum(r["searched"]["heldout_loss"] < r["minitron"]["heldout_loss"] for r in rows)
    wins_best = sum(r["searched"]["heldout_loss"] < r["best_homogeneous"]["heldout_loss"]
                    for r in rows if "best_homogeneous" in r)
    result = {
        "teacher": str(base.teacher_dir), "target": args.target,
        "cost_model": base.cost_model.version, "fraction": args.fraction,
        "teacher_heldout_loss": teacher_loss, "teacher_heldout_loss_stderr": teacher_stderr,
        "importance_and_setup_s": importance_s,
        "threads": args.threads, "steps": args.steps, "score": args.score,
        "minitron_top_k": args.minitron_top_k,
        "search_wins": wins, "search_wins_vs_best_homogeneous": wins_best, "presets": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nsearched beats matched Minitron in {wins}/{len(rows)} presets "
          f"(and the best homogeneous architecture in {wins_best}); wrote {args.json}")


def print_table(rows: list[dict], teacher_loss: float) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"held-out loss after pruning, no distillation (teacher {teacher_loss:.4f})"
    table = Table(title=title)
    for column in ("preset", "limit", "arch", "held-out loss ± se", "gap vs searched",
                   "params", "predicted", "wall s", "cpu s"):
        table.add_column(column, justify="right")
    for r in rows:
        (metric_limit, bound), = ((k, v) for k, v in r["limits"].items())
        metric = LIMIT_METRICS[metric_limit][0]
        for name in ("searched", "minitron", "best_homogeneous"):
            if name not in r:
                continue
            x = r[name]
            cpu = x.get("seconds", {}).get("cpu_total")
            table.add_row(r["preset"] if name == "searched" else "",
                          f"{metric} <= {bound:.4g}" if name == "searched" else "", name,
                          f"{x['heldout_loss']:.4f} ± {x.get('heldout_loss_stderr', 0):.4f}",
                          f"{x['gap_vs_searched']:+.4f} ± {x['gap_vs_searched_stderr']:.4f}"
                          if "gap_vs_searched" in x else "",
                          f"{x['params']:,}",
                          f"{x['predicted'][metric]:.4g}", f"{x['wall_s']:.0f}",
                          f"{cpu:.0f}" if cpu is not None else "")
    Console(width=140).print(table)
    for r in rows:
        for name in ("searched", "minitron", "best_homogeneous"):
            if name in r:
                print(f"{r['preset'] if name == 'searched' else '':17s} {name:16s} "
                      f"{r[name]['arch']}")


if __name__ == "__main__":
    main()
