"""Does block-local distillation make KL right after pruning predict recovery?

On SmolLM2 the search's own candidates have a lower KL right after pruning than
the teacher side's and end worse after the short distillation
(``lab/recovery_predictors.py``). Puzzle (Bercovich et al., 2024) scores each
block variant only after *block-local distillation* (BLD): the pruned block is
trained to reproduce the teacher block's output from the teacher's own input, so a
variant is judged by what it can recover, not by its damage untrained. This probe
asks whether that would fix the ranking, on a short list the search recorded: for
each candidate every partial block (an attention or FFN block narrower than the
teacher's; removed blocks have nothing to train) is trained for ``--steps`` Adam
steps on normalised MSE to the teacher block's output, on train-split windows
(the teacher's residual stream as input), and the candidate's KL is measured on
the short list's score batches. A block variant (layer, kind, option) is trained
once and reused by every candidate that has it. Where the candidates' rank by this
KL matches their rank after the short distillation, BLD would be the search's
objective to build (the block scores measured after BLD); where it does not, the
recovery the distillation finds is not block-local.

    .venv/bin/python -m lab.block_local_probe \\
        --report lab/results/diagnostics/smollm2_50_seed0_fixed_hidden.search.json \\
        --teacher DIR --importance FILE --corpus DIR --steps 40 --lr 3e-4 \\
        --out lab/results/block_local_probe.json

The teacher and the candidates must share the teacher's hidden size (the search's
``dnas.search_hidden=False`` reports, or any whose candidates kept it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import short_list_side
from bench.stats import spearman
from lab.pruned_kl_by_split import (
    BATCH,
    load_short_list,
    read_report,
    short_list_arguments,
)

SCORE_SEED = 7919  # the search's score stream: seed + 7919 (``SearchContext.score_batches``)


class TeacherBlocks:
    """The teacher's residual stream entering each layer and after its attention, on the
    training windows (fp16), and each block's output from it."""

    def __init__(self, teacher, batches):
        import torch

        self.layers = teacher.model.layers
        self.entering: dict[int, list] = {i: [] for i in range(len(self.layers))}
        # Per layer and batch: what its attention was called with (masks differ between
        # full and sliding-window layers).
        self.call: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(self.layers))}
        hooks = [layer.register_forward_pre_hook(self._grab(i), with_kwargs=True)
                 for i, layer in enumerate(self.layers)]
        try:
            with torch.no_grad():
                for batch in batches:
                    teacher(input_ids=batch)
        finally:
            for hook in hooks:
                hook.remove()
        with torch.no_grad():
            self.after_attention = {
                i: [(x.float() + self.output(layer, "attention", x.float(), j)).half()
                    for j, x in enumerate(self.entering[i])]
                for i, layer in enumerate(self.layers)}

    def _grab(self, index: int):
        def hook(module, args, kwargs):
            self.entering[index].append(args[0].detach().half())
            self.call[index].append({"position_embeddings": kwargs["position_embeddings"],
                                     "attention_mask": kwargs.get("attention_mask")})
        return hook

    def output(self, layer, kind: str, x, batch: int):
        """What ``layer``'s ``kind`` block adds to the residual stream ``x`` (a student's
        layer is called as the teacher's layer of the same index was)."""
        if kind == "attention":
            return layer.self_attn(layer.input_layernorm(x),
                                   **self.call[layer.layer_idx][batch])[0]
        return layer.mlp(layer.post_attention_layernorm(x))

    def example(self, layer: int, kind: str, batch: int):
        """(input, target) of one block on one training batch."""
        import torch

        stream = self.entering if kind == "attention" else self.after_attention
        x = stream[layer][batch].float()
        with torch.no_grad():
            return x, self.output(self.layers[layer], kind, x, batch)


def block_modules(layer, kind: str) -> list:
    """A block's weights with its own norm: what block-local training changes."""
    return ([layer.input_layernorm, layer.self_attn] if kind == "attention"
            else [layer.post_attention_layernorm, layer.mlp])


def train_block(blocks: TeacherBlocks, student_layer, layer: int, kind: str, steps: int,
                lr: float) -> tuple[float, float]:
    """Adam on the block's weights (and its norm) toward the teacher block's output; the
    normalised MSE on the first training batch before and after."""
    import torch

    params = [p for m in block_modules(student_layer, kind) for p in m.parameters()]

    def error(batch: int):
        x, target = blocks.example(layer, kind, batch)
        return (blocks.output(student_layer, kind, x, batch) - target).pow(2).mean() \
            / target.pow(2).mean()

    with torch.no_grad():
        start = float(error(0))
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=lr)
    for step in range(steps):
        loss = error(step % len(blocks.call[layer]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    for p in params:
        p.requires_grad_(False)
    with torch.no_grad():
        return start, float(error(0))


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 5) if values else None


def _partial(spec_layer, teacher_layer) -> dict[str, bool]:
    return {"attention": spec_layer.attention is not None
            and spec_layer.attention != teacher_layer.attention,
            "ffn": spec_layer.ffn is not None and spec_layer.ffn != teacher_layer.ffn}


def probe(args: argparse.Namespace, report: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from autocompress.arch_search.discretize import teacher_logits
    from autocompress.arch_search.selection import kl_to_teacher
    from autocompress.data.tokens import PackedTokens
    from autocompress.prune import prune

    model, tokenizer, importance, space, candidates = load_short_list(args, report)
    if any(spec.hidden_size != space.teacher.hidden_size for _, _, spec in candidates):
        print("error: block-local training needs the teacher's hidden size in every candidate; "
              "use a report searched with dnas.search_hidden=False", file=sys.stderr)
        raise SystemExit(2)
    calibration = PackedTokens(tokenizer, args.corpus, "calibration", args.seq_len)
    score = [calibration.batch_at(i, BATCH, args.seed + SCORE_SEED)
             for i in range(-(-args.windows // BATCH))]
    train = PackedTokens(tokenizer, args.corpus, "train", args.seq_len)
    teacher = prune(model, importance, space.spec_of(space.full_choice()))
    blocks = TeacherBlocks(teacher, [train.batch_at(i, BATCH, args.seed + 1)
                                     for i in range(args.train_batches)])
    with torch.no_grad():
        reference = teacher_logits(model, score)
    trained: dict[tuple, tuple[list[dict], tuple[float, float]]] = {}
    rows = []
    for row, choice, spec in candidates:
        started = time.perf_counter()
        student = prune(model, importance, spec).eval()
        for p in student.parameters():
            p.requires_grad_(False)
        with torch.no_grad():
            pruned = kl_to_teacher(student, score, reference)
        losses = []
        for i, (layer, spec_layer) in enumerate(zip(student.model.layers, spec.layers,
                                                    strict=True)):
            for kind, partial in _partial(spec_layer, space.teacher.layers[i]).items():
                if not partial:
                    continue
                modules = block_modules(layer, kind)
                key = (i, kind, getattr(choice, kind)[i])
                if key not in trained:
                    errors = train_block(blocks, layer, i, kind, args.steps, args.lr)
                    trained[key] = ([{k: v.clone() for k, v in m.state_dict().items()}
                                     for m in modules], errors)
                for module, state in zip(modules, trained[key][0], strict=True):
                    module.load_state_dict(state)
                losses.append(trained[key][1])
        with torch.no_grad():
            after = kl_to_teacher(student, score, reference)
        rows.append({"origin": row["origin"], "params": row["params"],
                     "reported_pruned_kl": row["pruned_kl"], "pruned_kl": round(pruned, 4),
                     "block_local_kl": round(after, 4), "short_distill_kl": row["kl"],
                     "partial_blocks": len(losses),
                     "block_mse_before": _mean([e[0] for e in losses]),
                     "block_mse_after": _mean([e[1] for e in losses]),
                     "seconds": round(time.perf_counter() - started, 1)})
        print(f"{row['origin'][:30]:<30} {pruned:>9.3f} {after:>11.3f} {row['kl']:>9.3f}"
              f" {len(losses):>8}", flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side of the short list, the mean KL gained by block-local training; and how each KL
    ranks the candidates against the short distillation (Spearman)."""

    short = [r["short_distill_kl"] for r in rows]
    out: dict[str, Any] = {
        "spearman_pruned": round(spearman([r["pruned_kl"] for r in rows], short), 4),
        "spearman_block_local": round(spearman([r["block_local_kl"] for r in rows], short), 4)}
    for side in ("search", "teacher"):
        mine = [r for r in rows if short_list_side(r) == side]
        if mine:
            out[f"{side}_side_gain"] = round(sum(r["pruned_kl"] - r["block_local_kl"]
                                                 for r in mine) / len(mine), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    short_list_arguments(parser)
    parser.add_argument("--steps", type=int, default=40, help="Adam steps per block variant")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--train-batches", type=int, default=16,
                        help="training batches of 4 windows (cycled)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results/block_local_probe.json")
    args = parser.parse_args(argv)
    report = read_report(parser, args)
    print(f"{'candidate':<30} {'pruned KL':>9} {'after BLD':>11} {'short KL':>9} {'blocks':>8}")
    started = time.perf_counter()
    rows = probe(args, report)
    from autocompress.atomic import write_json_atomic
    from autocompress.hardware import machine_summary

    result = summary(rows)
    print("Spearman against the short distillation: right after pruning "
          f"{result['spearman_pruned']:+.2f}, after BLD {result['spearman_block_local']:+.2f}; "
          "KL gained by BLD, mean per side: " + ", ".join(
              f"{k.removesuffix('_side_gain')} {v:.3f}" for k, v in result.items()
              if k.endswith("_side_gain")))
    write_json_atomic(args.out, {"report": str(args.report), "steps": args.steps, "lr": args.lr,
                                 "train_batches": args.train_batches, "windows": args.windows,
                                 "seq_len": args.seq_len, "seed": args.seed, "rows": rows,
                                 "summary": result,
                                 "seconds": round(time.perf_counter() - started, 1),
                                 "machine": machine_summary()})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
