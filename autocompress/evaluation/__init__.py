"""Evaluation: a local code benchmark suite run through lm-eval, plus held-out metrics.

Public API:

- ``evaluate(model, tokenizer, tasks=None, limit=None, corpus_dir=None) -> dict``
  (the JSON documented in ``suite``), ``write_json(result, path)``.
- ``heldout_loss(model, tokenizer, corpus_dir, max_batches, seq_len) -> float``
  (fast, deterministic; used by the search and pruning comparisons).
- ``EvalConfig``, ``LOCAL_TASKS``, ``TASK_SETS``, ``MINITRON_TASKS``.

Imports of lm-eval happen only when a suite runs (they cost seconds).
"""

from autocompress.evaluation.heldout import heldout_loss
from autocompress.evaluation.mc_tasks import LOCAL_TASKS
from autocompress.evaluation.standard import MINITRON_TASKS
from autocompress.evaluation.suite import TASK_SETS, EvalConfig, evaluate, write_json

__all__ = [
    "EvalConfig",
    "LOCAL_TASKS",
    "MINITRON_TASKS",
    "TASK_SETS",
    "evaluate",
    "heldout_loss",
    "write_json",
]
