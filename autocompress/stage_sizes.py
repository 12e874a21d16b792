"""Default stage sizes that follow the teacher's size.

The defaults of importance, the search and the evaluation suite were sized for
the bundled 7M-parameter teacher on 2 CPU cores. Their cost is about
parameters × tokens, so a 135M teacher at the same sizes runs about 20× longer:
importance alone (a forward pass per removed block) took over 45 minutes on
SmolLM2-135M. Above ``REFERENCE_PARAMS`` the tokens these stages read shrink by
``sqrt(REFERENCE_PARAMS / params)`` (floors keep each statistic usable), so
their time grows with the square root of the teacher's size instead of
linearly. The distillation budget is left alone: it is the accuracy knob the
user sets, and its teacher pass is cached once (``teacher_outputs``); only the
held-out windows distillation scores before and after training shrink.

Explicit options always win; each stage records the sizes it used. A teacher at
or below the reference keeps every default exactly (so its cache keys do not
change).
"""

from __future__ import annotations

import math
from typing import Any

REFERENCE_PARAMS = 8_000_000


def token_scale(teacher_params: float | None) -> float:
    """1 up to ``REFERENCE_PARAMS``, then ``sqrt(REFERENCE_PARAMS / teacher_params)``."""
    if not teacher_params or teacher_params <= REFERENCE_PARAMS:
        return 1.0
    return math.sqrt(REFERENCE_PARAMS / teacher_params)


def _scaled(default: int, scale: float, floor: int) -> int:
    return max(min(floor, default), round(default * scale))


def importance_sizes(teacher_params: float | None) -> dict[str, Any]:
    """``CalibrationConfig`` fields: fewer sequences per batch (8 at the reference).

    The batch count is kept, so the activation and Taylor passes still average over
    16 batches, and loss-on-removal (one forward per block) reads 2 smaller batches.
    """
    scale = token_scale(teacher_params)
    return {} if scale == 1.0 else {"batch_size": _scaled(8, scale, 2)}


def search_sizes(teacher_params: float | None) -> dict[str, Any]:
    """``SearchConfig`` fields: sequences per DNAS step and per measured score (4 at the
    reference), and the short distillation each short-listed candidate gets before the
    final pick (the search's and the Minitron baseline's alike: fewer sequences per step,
    as many steps). (The flow always hands the search its importance stage's scores.)"""
    scale = token_scale(teacher_params)
    if scale == 1.0:
        return {}
    return {"dnas": {"batch_size": _scaled(4, scale, 2)},
            "minitron": {"distill_tokens": _scaled(32_768, scale, 4_096),
                         "distill_batch_size": _scaled(8, scale, 2)}}


def eval_sizes(teacher_params: float | None) -> dict[str, Any]:
    """``EvalConfig`` fields: items per multiple-choice task, held-out bytes and windows.

    Scaled by the *teacher's* size, so the teacher and its students answer the same items.
    """
    scale = token_scale(teacher_params)
    if scale == 1.0:
        return {}
    return {"num_items": _scaled(300, scale, 60), "bpb_bytes": _scaled(120_000, scale, 20_000),
            "next_token_windows": _scaled(96, scale, 24)}


def distill_sizes(teacher_params: float | None) -> dict[str, Any]:
    """``DistillConfig`` fields: held-out batches scored before and after training (8 at
    the reference; on SmolLM2 the teacher and the student spent ~3 of 32 min on them)."""
    scale = token_scale(teacher_params)
    return {} if scale == 1.0 else {"eval_batches": _scaled(8, scale, 2)}


def with_defaults(options: dict[str, Any] | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by ``options`` (nested dicts merged, options win)."""
    merged = dict(defaults)
    for key, value in (options or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = with_defaults(value, merged[key])
        else:
            merged[key] = value
    return merged
