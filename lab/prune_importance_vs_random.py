"""Pruning by Minitron importance vs pruning the same shape with random channels.

Issue 3 "must show": on the default teacher, importance-guided pruning gives a
lower held-out loss than keeping random channels/heads/neurons. No distillation
is run: this measures how much of the teacher each choice of channels keeps.

    .venv/bin/python -m lab.prune_importance_vs_random --teacher default \
        [--arch ARCH.json] [--random-seeds 5] [--json lab/results/prune_importance_vs_random.json]

Without --arch the target keeps every layer and KV group, 75% of the hidden
channels, half the query heads per group (if a group has more than one) and
half of every FFN.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.importance import (
    CalibrationConfig,
    calibration_batches,
    compute_importance,
    random_importance,
)
from autocompress.modeling import arch_spec_of, load_causal_lm
from autocompress.prune import prune


def default_target(teacher: ArchSpec) -> ArchSpec:
    layers = []
    for layer in teacher.layers:
        att = layer.attention
        group = att.num_heads // att.num_kv_heads
        keep_group = max(1, group // 2)
        layers.append(
            LayerSpec(
                attention=AttentionSpec(
                    num_heads=att.num_kv_heads * keep_group, num_kv_heads=att.num_kv_heads
                ),
                ffn=FFNSpec(intermediate_size=layer.ffn.intermediate_size // 2),
            )
        )
    hidden = (teacher.hidden_size * 3 // 4) // 8 * 8
    return ArchSpec(hidden_size=hidden, layers=layers).complete_from(teacher)


def heldout(model, tokenizer, corpus_dir, args) -> float:
    from autocompress.evaluation.heldout import heldout_loss

    return heldout_loss(
        model,
        tokenizer,
        corpus_dir,
        max_batches=args.eval_batches,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="default")
    parser.add_argument("--arch", type=Path, default=None)
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--random-seeds", type=int, default=5)
    parser.add_argument("--calib-batches", type=int, default=16)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--json", type=Path, default=Path("lab/results/prune_importance_vs_random.json")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from autocompress.data.corpus import ensure_corpus

    corpus_dir = ensure_corpus(args.corpus)
    teacher, tokenizer = load_causal_lm(args.teacher)
    teacher_spec = arch_spec_of(teacher)
    spec = (
        ArchSpec.from_json(args.arch).complete_from(teacher_spec)
        if args.arch
        else (default_target(teacher_spec))
    )
    started = time.perf_counter()
    calib = CalibrationConfig(
        corpus_dir=str(corpus_dir),
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        num_batches=args.calib_batches,
        removal_batches=0,
    )
    importance = compute_importance(
        teacher, calibration_batches(tokenizer, calib), removal_batches=0, progress=True
    )
    teacher_loss = heldout(teacher, tokenizer, corpus_dir, args)
    importance_loss = heldout(prune(teacher, importance, spec), tokenizer, corpus_dir, args)
    random_losses = []
    for seed in range(args.random_seeds):
        student = prune(teacher, random_importance(teacher, seed=seed), spec)
        random_losses.append(heldout(student, tokenizer, corpus_dir, args))

    result = {
        "teacher": str(args.teacher),
        "teacher_params": teacher_spec.num_params(),
        "student_params": spec.num_params(),
        "student_arch": spec.to_dict(),
        "heldout_loss": {
            "teacher": teacher_loss,
            "importance": importance_loss,
            "random": {
                "mean": statistics.mean(random_losses),
                "stdev": statistics.stdev(random_losses) if len(random_losses) > 1 else 0.0,
                "min": min(random_losses),
                "all": random_losses,
            },
        },
        "importance_beats_every_random_seed": importance_loss < min(random_losses),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "seconds": time.perf_counter() - started,
    }

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Held-out loss (nats/token), {spec.num_params():,} of "
        f"{teacher_spec.num_params():,} parameters kept, no distillation"
    )
    table.add_column("model")
    table.add_column("held-out loss", justify="right")
    table.add_row("teacher", f"{teacher_loss:.4f}")
    table.add_row("pruned by importance", f"{importance_loss:.4f}")
    table.add_row(
        f"pruned by random channels ({len(random_losses)} seeds)",
        f"{statistics.mean(random_losses):.4f} ± {result['heldout_loss']['random']['stdev']:.4f} "
        f"(best {min(random_losses):.4f})",
    )
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
