"""Do two picks differ right after pruning or only after training? (issue 19's diagnosis)

Takes the architectures two methods picked in one cell of a comparison JSON
(``bench/compare.py``), cuts each from the teacher with the given importance,
and scores it right after pruning and after each distillation below: KL to the
teacher on the 8 fixed calibration batches the final picks score on (seq 128,
batch 8, seed 0 + 7919) and loss on the first 64 held-out windows (seq 256).

- ``short32k``: the final pick's short distillation (32,768 tokens, seq 128 x 8,
  lr 1e-3, warmup steps/10), the baseline's default;
- ``flow50k`` / ``flow200k``: the comparison's distillation settings (seq 256 x 16,
  lr 1e-3, warmup steps/10) at 50k and 200k tokens.

Run (2 shared cores, 1 thread; ~35 min under load):

    python -m lab.pick_distillation --compare results/compare_reduced.json \
        --importance <the run's importance.safetensors> --out lab/results/pick_distillation.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

SETTINGS = {"short32k": {"tokens": 32768, "seq_len": 128, "batch_size": 8, "lr": 1e-3},
            "flow50k": {"tokens": 50000, "lr": 1e-3},
            "flow200k": {"tokens": 200000, "lr": 1e-3}}


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor) -> float:
    model.eval()
    total = 0.0
    for i in range(0, len(windows), 16):
        batch = windows[i:i + 16]
        logits = model(input_ids=batch).logits[:, :-1]
        total += float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))) * len(batch)
    return total / len(windows)


def main() -> None:
    from autocompress.arch import ArchSpec
    from autocompress.arch_search.discretize import teacher_logits
    from autocompress.arch_search.selection import kl_to_teacher
    from autocompress.data.corpus import ensure_corpus
    from autocompress.data.tokens import PackedTokens
    from autocompress.distill import DistillConfig, DistillData, distill
    from autocompress.importance import Importance
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import load_causal_lm
    from autocompress.prune import prune

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare", required=True, help="compare JSON (bench/compare.py).")
    p.add_argument("--importance", required=True, help="The run's importance file.")
    p.add_argument("--methods", nargs=2, default=["autocompress", "minitron"])
    p.add_argument("--cell", type=int, default=0, help="Index of the run (cell) in the JSON.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--out", required=True)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    teacher, tokenizer = load_causal_lm(str(resolve_model_dir("default")))
    teacher.eval()
    importance = Importance.load(args.importance)
    corpus = ensure_corpus(None)
    calib = PackedTokens(tokenizer, corpus, "calibration", 128)
    batches = [calib.batch_at(i, 8, 7919) for i in range(8)]
    reference = teacher_logits(teacher, batches)
    heldout = PackedTokens(tokenizer, corpus, "heldout", 256).windows[:64]
    run = json.loads(Path(args.compare).read_text())["runs"][args.cell]
    specs = {m: ArchSpec.model_validate(next(s for s in run["methods"][m]["seeds"]
                                             if s["seed"] == args.seed)["arch"])
             for m in args.methods}
    out: dict = {"compare": args.compare, "cell": f"{run['preset']}@{run['budget_fraction']}",
                 "seed": args.seed, "importance": args.importance, "threads": 1, "picks": {}}
    for name, spec in specs.items():
        student = prune(teacher, importance, spec)
        out["picks"][name] = {"params": spec.num_params(), "pruned": {
            "kl": kl_to_teacher(student, batches, reference),
            "heldout": heldout_loss(student, heldout)}}
    for key in args.settings:
        for name, spec in specs.items():
            cfg = SETTINGS[key]
            steps = -(-cfg["tokens"] // (cfg.get("seq_len", 256) * cfg.get("batch_size", 16)))
            config = DistillConfig(**cfg, ckpt_every=steps, seed=0,
                                   warmup_steps=max(1, steps // 10))
            student = prune(teacher, importance, spec)
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                train = PackedTokens(tokenizer, corpus, "train", config.seq_len)
                distill(teacher, student, DistillData(train=train), config, Path(tmp) / "o",
                        work_dir=Path(tmp) / "w")
            out["picks"][name][key] = {"kl": kl_to_teacher(student, batches, reference),
                                       "heldout": heldout_loss(student, heldout),
                                       "seconds": time.perf_counter() - started}
            Path(args.out).write_text(json.dumps(out, indent=1))
    a, b = args.methods
    print(f"| stage | {a} KL | {b} KL | {a} held-out | {b} held-out | Δ held-out |")
    print("|---|---|---|---|---|---|")
    for key in ["pruned", *args.settings]:
        x, y = out["picks"][a][key], out["picks"][b][key]
        print(f"| {key} | {x['kl']:.3f} | {y['kl']:.3f} | {x['heldout']:.3f} | "
              f"{y['heldout']:.3f} | {x['heldout'] - y['heldout']:+.3f} |")


if __name__ == "__main__":
    main()
