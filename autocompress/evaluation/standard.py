"""lm-eval's standard benchmarks by name, for machines that can reach their data.

``--tasks hellaswag,arc_challenge`` (or a named set such as ``minitron``) loads
lm-eval's own task configs. Their datasets come from the Hugging Face Hub or the
local Hugging Face cache; when neither is reachable the user gets one line
saying which benchmark is unavailable and why, before any evaluation starts.

Named sets:

- ``minitron``: the eight benchmarks reported by the Minitron papers
  (arXiv 2407.14679, 2408.11796): MMLU, HellaSwag, ARC-Challenge, Winogrande,
  GSM8K, TruthfulQA (MC2), HumanEval, MBPP. HumanEval and MBPP run model-written
  code, so they need ``allow_code_execution`` (``--allow-code-execution``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from autocompress.errors import AutoCompressError

MINITRON_TASKS: tuple[str, ...] = (
    "mmlu", "hellaswag", "arc_challenge", "winogrande", "gsm8k", "truthfulqa_mc2",
    "humaneval", "mbpp",
)
STANDARD_SETS: dict[str, tuple[str, ...]] = {"minitron": MINITRON_TASKS}

# The metric each benchmark is usually reported with; others take their first metric.
PREFERRED_METRIC: dict[str, str] = {
    "hellaswag": "acc_norm", "arc_challenge": "acc_norm", "arc_easy": "acc_norm",
    "piqa": "acc_norm", "openbookqa": "acc_norm", "winogrande": "acc", "mmlu": "acc",
    "truthfulqa_mc2": "acc", "gsm8k": "exact_match", "humaneval": "pass@1",
    "mbpp": "pass_at_1",
}


def _offline_env() -> bool:
    return any(os.environ.get(v, "").upper() in {"1", "ON", "YES", "TRUE"}
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hugging Face Hub opens within ``timeout``."""
    if _offline_env():
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        with socket.create_connection((host or "huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def offline_unless_reachable() -> Iterator[bool]:
    """Use only the local cache when the Hub cannot be reached; yields "online".

    Without this, ``datasets`` retries every unreachable dataset for ~25 s
    (MMLU alone has 57) before failing. The offline flags are set in-process
    too, because ``datasets`` reads the environment only when first imported;
    both libraries read these flags at call time.
    """
    online = hub_reachable()
    if online:
        yield True
        return
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield False
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


@functools.lru_cache(maxsize=1)
def _builtin_yaml() -> tuple[Path, tuple[tuple[Path, bytes], ...]]:
    """lm-eval's task folder and the raw text of every task config in it (read once)."""
    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    return root, tuple((p, p.read_bytes()) for p in sorted(root.rglob("*.yaml")))


def task_manager_for(names: list[str]):
    """A TaskManager that indexes only the lm-eval task folders mentioning ``names``.

    Indexing all ~14k built-in configs parses every YAML file (seconds, much
    more on a busy machine); a plain-text search finds the few top-level folders
    that can define a name (a task, group or tag is always spelled out in some
    YAML file there), and includes resolve by path, so indexing those is enough.
    A name that no file mentions is not an lm-eval task.
    """
    from lm_eval.tasks import TaskManager

    root, files = _builtin_yaml()
    dirs: set[Path] = set()
    wanted, searched = set(names), set()
    while True:
        for name in wanted - searched:
            pattern = re.compile(rb"(?<![\w-])" + re.escape(name.encode()) + rb"(?![\w-])")
            for path, text in files:
                if pattern.search(text):
                    dirs.add(root / path.relative_to(root).parts[0])
        searched |= wanted
        tm = TaskManager(include_path=sorted(map(str, dirs)), include_defaults=False)
        # A group may list tasks defined in other folders: look those up too.
        missing = {c for n in wanted if n in tm.task_index
                   for c in _children(tm.task_index[n]) if c not in tm.task_index}
        if not missing - searched:
            return tm
        wanted |= missing


def _children(entry) -> list[str]:
    tasks = (getattr(entry, "cfg", None) or {}).get("task")
    if not isinstance(tasks, list):
        return []
    return [t if isinstance(t, str) else t.get("task") for t in tasks
            if isinstance(t, str) or (isinstance(t, dict) and isinstance(t.get("task"), str))]


def _dataset_of(entry) -> str | None:
    cfg = getattr(entry, "cfg", None) or {}
    return cfg.get("dataset_path")


def load_standard(names: list[str], allow_code_execution: bool = False,
                  known_local: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load lm-eval tasks by name; one-line AutoCompressError for the first that fails.

    Returns lm-eval's loaded-task dict (``tasks``, ``groups``, ``group_map``)
    covering all ``names``.
    """
    from autocompress.evaluation.harness import load_tasks

    tm = task_manager_for(names)
    for name in names:
        entry = tm.task_index.get(name)
        if entry is None:
            raise AutoCompressError(
                f"unknown benchmark '{name}'",
                f"local tasks: {', '.join(known_local)}; sets: local, heldout, "
                f"{', '.join(STANDARD_SETS)}; lm-eval's own names are listed by "
                "`lm_eval ls tasks`",
            )
        if (getattr(entry, "cfg", None) or {}).get("unsafe_code") and not allow_code_execution:
            raise AutoCompressError(
                f"benchmark '{name}' executes code written by the model",
                "pass --allow-code-execution (preferably inside a sandbox) or drop it from --tasks",
            )
    merged: dict[str, Any] = {"tasks": {}, "groups": {}, "group_map": {}}
    with offline_unless_reachable() as online:
        for name in names:
            try:
                loaded = load_tasks([name], task_manager=tm)
            except Exception as err:  # datasets raises many types; all mean "no data"
                raise _unavailable(name, _dataset_of(tm.task_index[name]), online, err) from err
            for key in merged:
                merged[key].update(loaded.get(key, {}))
    return merged


def _unavailable(name: str, dataset: str | None, online: bool,
                 err: Exception) -> AutoCompressError:
    what = f"its dataset {dataset}" if dataset else "its data"
    if not online:
        return AutoCompressError(
            f"benchmark '{name}' is unavailable: {what} is not in the local Hugging Face "
            "cache and the Hub cannot be reached",
            "run it once on a machine with network access (or copy its HF_HOME cache here), "
            "or drop it from --tasks",
        )
    first_line = (str(err).strip().splitlines() or [""])[0][:200]
    return AutoCompressError(
        f"benchmark '{name}' could not be loaded ({type(err).__name__}: {first_line})",
        "check the task name and your network access, or drop it from --tasks",
    )


def score_metric(name: str, task_objs: list[Any]) -> str:
    """The metric to report for ``name`` (a task or a group of tasks)."""
    if name in PREFERRED_METRIC:
        return PREFERRED_METRIC[name]
    metrics = list(getattr(task_objs[0], "_metric_fn_list", {}) or ["acc"])
    return "acc" if "acc" in metrics else metrics[0]


def chance_level(task_objs: list[Any], limit: int | None = None) -> float | None:
    """Expected score of a uniform random guess, from the documents themselves.

    Exact for accuracy on multiple-choice tasks (mean of 1/number of choices,
    weighted by documents, as lm-eval weights groups); TruthfulQA-MC2 scores
    the probability mass on true answers, so chance is the share of true
    answers. Generation tasks (GSM8K, HumanEval, MBPP) get 0.
    """
    total, count = 0.0, 0
    for task in task_objs:
        if task.OUTPUT_TYPE != "multiple_choice":
            return 0.0
        docs = list(task.eval_docs)[:limit] if limit else list(task.eval_docs)
        for doc in docs:
            if "mc2_targets" in doc:
                labels = doc["mc2_targets"]["labels"]
                total += sum(labels) / len(labels)
            else:
                total += 1.0 / max(1, len(task.doc_to_choice(doc)))
            count += 1
    return total / count if count else None
