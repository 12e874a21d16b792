"""Glue to EleutherAI's lm-evaluation-harness (``lm_eval``).

Everything that touches lm-eval's API lives here, so a version change is fixed
in one place. We wrap an *in-memory* model with ``HFLM`` (no reloading from a
path, no assumption about ``model_type``: our heterogeneous models work like
stock Llama ones), describe local tasks as inline config dicts (so lm-eval's
~15k built-in task configs are never indexed for the local suite) and call
``lm_eval.evaluator.evaluate`` directly.

lm-eval is imported lazily: importing it costs several seconds.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """Silence lm-eval's per-request warnings and its tqdm bars (we show our own progress).

    lm-eval passes ``disable=False`` to tqdm explicitly, so the bars can only be
    hidden by catching stderr; warnings worth seeing surface as exceptions.
    """
    loggers = [logging.getLogger(name) for name in ("lm_eval", "lm-eval", "datasets")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def make_lm(model: torch.nn.Module, tokenizer, *, batch_size: int = 16,
            max_length: int | None = None, add_bos_token: bool | None = None,
            reuse_context: bool = True):
    """An lm-eval ``HFLM`` around an already-loaded model and tokenizer.

    ``backend="causal"`` is explicit so that lm-eval never looks the model type
    up in transformers' registries (``autocompress_hetero`` is not in them).
    ``add_bos_token=False`` is what rolling log-likelihood needs: lm-eval
    already conditions the first token on the BOS/EOS prefix, so a tokenizer that
    also prepends BOS would count it twice.
    ``reuse_context``: score a context shared by several continuations (the choices of
    a multiple-choice item) once (``context_cache.ContextCachedLM``).
    """
    from lm_eval.models.huggingface import HFLM

    if reuse_context:
        from autocompress.evaluation.context_cache import ContextCachedLM as HFLM  # noqa: N814

    device = next(model.parameters()).device
    with quiet_lm_eval():
        return HFLM(
            pretrained=model,
            tokenizer=tokenizer,
            backend="causal",
            batch_size=batch_size,
            max_length=max_length,
            add_bos_token=add_bos_token,
            device=str(device),
        )


def _json_dataset(data_file: Path, cache_dir: Path) -> dict[str, Any]:
    # lm-eval passes these to datasets.load_dataset("json", ...). The path must
    # be absolute (it is resolved relative to lm-eval's task folder otherwise);
    # the arrow cache goes under our home, not ~/.cache/huggingface.
    return {
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": str(Path(data_file).resolve())},
            "cache_dir": str(Path(cache_dir).resolve()),
        },
        "test_split": "test",
    }


def multiple_choice_config(task: str, data_file: Path, cache_dir: Path) -> dict[str, Any]:
    """An lm-eval task config for rows ``{context, choices, label}``.

    Fields are referenced by name (not Jinja templates): a template would drop
    the context's trailing newline and could mangle code. ``target_delimiter``
    is empty because the choices are code that follows the context directly.
    """
    return {
        "task": task,
        **_json_dataset(data_file, cache_dir),
        "output_type": "multiple_choice",
        "doc_to_text": "context",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "target_delimiter": "",
        "num_fewshot": 0,
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": 1},
    }


def rolling_config(task: str, data_file: Path, cache_dir: Path) -> dict[str, Any]:
    """An lm-eval ``loglikelihood_rolling`` task over rows ``{text}``."""
    return {
        "task": task,
        **_json_dataset(data_file, cache_dir),
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "text",
        "num_fewshot": 0,
        "metric_list": [
            {"metric": "bits_per_byte", "aggregation": "bits_per_byte",
             "higher_is_better": False},
        ],
        "metadata": {"version": 1},
    }


def local_task_manager():
    """A TaskManager that knows no built-in tasks (instant; local configs are dicts)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=False)


def load_tasks(specs: list[str | dict[str, Any]], task_manager=None) -> dict[str, Any]:
    """Build lm-eval task objects (this is where datasets are loaded)."""
    tm = task_manager or local_task_manager()
    with quiet_lm_eval():
        loaded = tm.load(specs)
    for task in loaded["tasks"].values():
        # What simple_evaluate does: zero-shot unless the task says otherwise.
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=1234)
    return loaded


def run(lm, loaded: dict[str, Any], *, limit: int | None = None, log_samples: bool = False,
        allow_code_execution: bool = False) -> dict[str, Any]:
    """Evaluate loaded tasks; returns lm-eval's result dict (``results``, ``samples``...)."""
    from lm_eval.evaluator import evaluate

    with quiet_lm_eval(), torch.inference_mode():
        out = evaluate(
            lm=lm,
            task_dict=loaded,
            limit=limit,
            bootstrap_iters=1000,  # closed-form stderr for means; bootstrap elsewhere
            log_samples=log_samples,
            confirm_run_unsafe_code=allow_code_execution,
        )
    assert out is not None  # None only on non-zero ranks of a distributed run
    return out


def metric(results: dict[str, Any], task: str, name: str) -> tuple[float, float | None]:
    """``(value, stderr)`` of metric ``name`` (any filter) of ``task`` in lm-eval results."""
    entry = results["results"][task]
    for key, value in entry.items():
        metric_name, _, filt = key.partition(",")
        if metric_name == name:
            stderr = entry.get(f"{name}_stderr,{filt}")
            return float(value), (float(stderr) if isinstance(stderr, int | float) else None)
    raise KeyError(f"{task} has no metric {name}: {sorted(entry)}")


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
