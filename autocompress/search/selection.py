"""Ranking candidate architectures after a short distillation (Minitron's selection).

The Minitron papers choose among their pruned candidates after a light retraining
of each: right after pruning, the ranking mostly says which candidate lost least,
not which one recovers best. Each candidate here is cut from the teacher
(``prune``), distilled for the same token budget with the same data order and
seed (``distill``, reusing the teacher's cached outputs across candidates), and
scored by KL(teacher ‖ student) on fixed calibration batches, which neither the
training stream (train split) nor the benchmarks (held-out split) use.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from autocompress.arch import ArchSpec
from autocompress.losses import kd_loss
from autocompress.search.discretize import teacher_logits


@torch.no_grad()
def kl_to_teacher(student, batches: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Mean KL(teacher ‖ student) per token over ``batches`` (nats), given the teacher's
    logits on them (``reference``, computed once for all candidates)."""
    student.eval()
    total = 0.0
    for batch, ref in zip(batches, reference, strict=True):
        total += float(kd_loss(student(input_ids=batch).logits[:, :-1], ref[:, :-1]))
    return total / max(1, len(batches))


def short_distill_kl(teacher, importance, specs: list[ArchSpec], train, batches: list[torch.Tensor],
                     tokens: int, seq_len: int, batch_size: int, lr: float, seed: int,
                     progress: Callable[[int, int], None] | None = None) -> list[float]:
    """For each spec: prune, distil ``tokens`` tokens from ``train`` (a ``BatchSource``),
    return KL to the teacher on ``batches``. ``tokens == 0``: KL right after pruning."""
    from autocompress.distill import DistillConfig, DistillData, distill
    from autocompress.prune import prune

    was_training = teacher.training
    teacher.eval()
    config = None
    if tokens > 0:
        steps = max(1, -(-tokens // (seq_len * batch_size)))
        config = DistillConfig(tokens=tokens, seq_len=seq_len, batch_size=batch_size, lr=lr,
                               warmup_steps=max(1, steps // 10), ckpt_every=steps, seed=seed)
    values = []
    try:
        with torch.no_grad():
            reference = teacher_logits(teacher, batches)
        with tempfile.TemporaryDirectory(prefix="ac-selection-") as tmp:
            for i, spec in enumerate(specs):
                student = prune(teacher, importance, spec)
                if config is not None:
                    out = Path(tmp) / f"candidate-{i}"
                    distill(teacher, student, DistillData(train=train), config, out,
                            work_dir=Path(tmp) / f"candidate-{i}.work")
                values.append(kl_to_teacher(student, batches, reference))
                if progress is not None:
                    progress(i + 1, len(specs))
    finally:
        teacher.train(was_training)
    return values
