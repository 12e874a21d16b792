"""Importance criteria side by side: activation (Minitron) vs first-order Taylor.

Issue 19: at three uniform shapes of the bundled teacher (every layer kept, hidden
kept; 4 query heads + FFN 384, 2 query heads + FFN 192, FFN 384 with all heads) the
teacher is pruned by each criterion's ranking and scored on the *whole* held-out
split before any retraining. Each held-out window is one item: the difference of
the two pruned models is paired per window, with a bootstrap 95% interval
(``bench.stats``) and the closed-form s.e. of the mean paired difference.

    .venv/bin/python -m lab.importance_criteria [--teacher default] \
        [--json lab/results/importance_criteria.json]

The calibration data is the flows' default (``importance.CalibrationConfig()``:
16 batches of 8 × 256 tokens of the calibration split) for both criteria.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.importance import (
    CRITERIA,
    CalibrationConfig,
    calibration_batches,
    compute_importance,
)
from autocompress.modeling import arch_spec_of, load_causal_lm
from autocompress.prune import prune
from bench.stats import paired_vectors

# name -> (query heads per layer, FFN width per layer); None keeps the teacher's.
SHAPES = {"4 heads + FFN 384": (4, 384), "2 heads + FFN 192": (2, 192),
          "FFN 384 only": (None, 384)}


def uniform_shape(teacher: ArchSpec, heads: int | None, ffn: int) -> ArchSpec:
    """Every layer kept with ``heads`` query heads (KV groups kept) and FFN ``ffn``."""
    layers = []
    for layer in teacher.layers:
        att = layer.attention
        layers.append(LayerSpec(
            attention=AttentionSpec(num_heads=heads or att.num_heads,
                                    num_kv_heads=att.num_kv_heads),
            ffn=FFNSpec(intermediate_size=ffn)))
    return ArchSpec(hidden_size=teacher.hidden_size, layers=layers).complete_from(teacher)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="default")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-windows", type=int, default=None,
                        help="Held-out windows to score (default: the whole split).")
    parser.add_argument("--json", type=Path,
                        default=Path("lab/results/importance_criteria.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from autocompress.data.corpus import ensure_corpus
    from autocompress.evaluation.heldout import heldout_windows, window_scores

    started = time.perf_counter()
    load_before = os.getloadavg()
    corpus_dir = ensure_corpus(args.corpus)
    teacher, tokenizer = load_causal_lm(args.teacher)
    teacher_spec = arch_spec_of(teacher)
    calib = CalibrationConfig(corpus_dir=str(corpus_dir), removal_batches=0)
    batches = calibration_batches(tokenizer, calib)
    scores, seconds = {}, {}
    for criterion in CRITERIA:
        t0 = time.perf_counter()
        scores[criterion] = compute_importance(teacher, batches, removal_batches=0,
                                               criterion=criterion)
        seconds[criterion] = time.perf_counter() - t0
    windows = heldout_windows(tokenizer, corpus_dir, args.seq_len, args.max_windows or 10**9)
    teacher_loss = float(window_scores(teacher, windows)[0].mean())

    rows = []
    for name, (heads, ffn) in SHAPES.items():
        spec = uniform_shape(teacher_spec, heads, ffn)
        losses = {c: window_scores(prune(teacher, scores[c], spec), windows)[0].tolist()
                  for c in CRITERIA}
        diff = paired_vectors(losses["taylor"], losses["activation"])
        per_window = torch.tensor(losses["taylor"]) - torch.tensor(losses["activation"])
        rows.append({
            "shape": name, "params": spec.num_params(), "arch": spec.to_dict(),
            "loss": {c: sum(v) / len(v) for c, v in losses.items()},
            "taylor_minus_activation": diff.model_dump(),
            "closed_form_se": float(per_window.std() / math.sqrt(per_window.numel())),
            "windows_taylor_better": int((per_window < 0).sum()),
            "per_window": losses,
        })

    taylor_wins = sum(r["taylor_minus_activation"]["high"] < 0 for r in rows)
    activation_wins = sum(r["taylor_minus_activation"]["low"] > 0 for r in rows)
    result = {
        "teacher": str(args.teacher), "teacher_params": teacher_spec.num_params(),
        "teacher_loss": teacher_loss, "windows": int(windows.shape[0]),
        "tokens_per_window": int(windows.shape[1] - 1),
        "calibration": calib.model_dump(exclude={"corpus_dir"}),
        "importance_seconds": seconds, "shapes": rows,
        "verdict": {"taylor_better_shapes": taylor_wins,
                    "activation_better_shapes": activation_wins,
                    "undecided_shapes": len(rows) - taylor_wins - activation_wins},
        "seconds": time.perf_counter() - started,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "threads": args.threads,
    }
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Held-out loss before retraining (nats/token, {result['windows']} "
                  f"windows of {result['tokens_per_window']} tokens; teacher "
                  f"{result['teacher_loss']:.4f})")
    for col in ("shape", "params", "activation", "taylor", "taylor − activation [95% CI]",
                "s.e.", "windows taylor better"):
        table.add_column(col, justify="right")
    for r in result["shapes"]:
        d = r["taylor_minus_activation"]
        table.add_row(r["shape"], f"{r['params']:,}", f"{r['loss']['activation']:.4f}",
                      f"{r['loss']['taylor']:.4f}",
                      f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]",
                      f"{r['closed_form_se']:.4f}",
                      f"{r['windows_taylor_better']}/{result['windows']}")
    Console().print(table)
    load = result["load_average"]
    print(f"{result['seconds']:.0f} s; load average {load['before'][0]:.1f} -> "
          f"{load['after'][0]:.1f}; importance s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in result["importance_seconds"].items()))


if __name__ == "__main__":
    main()
