"""KL(teacher ‖ student): the one divergence the search and distillation both minimise.

The DNAS trains its architecture logits on it, repair and the Minitron baseline
score candidates by it, and distillation trains the student on it, so "closer to
the teacher" means the same number everywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
            temperature: float = 1.0) -> torch.Tensor:
    """Forward KL(teacher ‖ student) in nats, the mean over tokens; softened by the
    temperature T and scaled by T² (Hinton et al.; T = 1 is the plain KL).

    Computed in fp32 (bf16 softmax over a large vocabulary loses the tail).
    """
    t = temperature
    vocab = student_logits.shape[-1]
    log_q = F.log_softmax(student_logits.float().reshape(-1, vocab) / t, dim=-1)
    log_p = F.log_softmax(teacher_logits.float().reshape(-1, vocab) / t, dim=-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    return kl * (t * t)
