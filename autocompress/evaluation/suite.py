"""The benchmark suite: local code tasks + held-out metrics + optional lm-eval benchmarks.

``evaluate(model, tokenizer)`` returns one JSON-ready dict that other tools read:

    {"model": str,
     "tasks": {NAME: {"score", "stderr", "chance", "metric", "n", "kind", ...}},
     "mc_mean", "mc_mean_stderr", "mc_chance_mean",
     "bits_per_byte", "bits_per_byte_stderr",
     "next_token_acc", "next_token_acc_stderr", "heldout_loss", "heldout_loss_stderr",
     "per_item": {TASK: {ITEM_ID: score}, "heldout_loss": {WINDOW: loss}},
     "details": {...inputs, fingerprints, timings...}}

``per_item`` holds every local multiple-choice item's score (the task's metric, by
the item's id) and every held-out window's loss (by its index in the seeded order),
so two models evaluated with the same settings can be compared item by item
(``bench.stats``). lm-eval's own benchmarks record no per-item scores yet.

``mc_mean`` is the unweighted mean score of the multiple-choice tasks that ran
(local and standard); its stderr combines the tasks' stderrs as independent.
Keys whose part of the suite did not run are ``null``.

Task names accepted in ``tasks``: the local tasks (``next_line``,
``identifier``, ``docstring``, ``indent``), ``heldout`` (bits per byte +
next-token metrics), the set ``local`` (all of those, the default), lm-eval
task names (``hellaswag``...) and the set ``minitron``; and, only when named,
``humaneval_bpb`` (HumanEval canonical solutions' bits per byte, no code runs) and
``humaneval_pass`` (pass@k; needs ``allow_code_execution``), see ``humaneval``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from autocompress.atomic import write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.evaluation import harness, heldout, humaneval, mc_tasks, standard
from autocompress.evaluation.standard import STANDARD_SETS

LOCAL_SET: tuple[str, ...] = (*mc_tasks.LOCAL_TASKS, "heldout")
TASK_SETS: dict[str, tuple[str, ...]] = {"local": LOCAL_SET, **STANDARD_SETS}
_LM_EVAL_PREFIX = "autocompress_"  # lm-eval names of our local tasks
HUMANEVAL_TASKS = ("humaneval_bpb", "humaneval_pass")  # ours, offline (lm-eval's is `humaneval`)


class EvalConfig(BaseModel):
    """Sizes of the suite. Defaults keep the default teacher's run within minutes on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid")

    num_items: int = Field(300, ge=1, description="items per local multiple-choice task")
    seed: int = 0
    seq_len: int = Field(256, ge=8, description="context (tokens) for local tasks, "
                         "bits-per-byte windows and next-token windows")
    bpb_bytes: int = Field(120_000, ge=1, description="held-out bytes scored for bits/byte")
    next_token_windows: int = Field(96, ge=1, description="held-out windows for next-token "
                                    "accuracy and loss")
    batch_size: int = Field(16, ge=1)
    reuse_context: bool = Field(True, description="score a multiple-choice item's context "
                                "once for all its choices (same scores, ~choices x fewer "
                                "context tokens)")
    allow_code_execution: bool = False


def expand_tasks(tasks: Iterable[str] | str | None) -> tuple[list[str], bool, list[str]]:
    """Split requested names into (local MC tasks, run held-out metrics, lm-eval tasks)."""
    if tasks is None:
        names = list(LOCAL_SET)
    elif isinstance(tasks, str):
        names = tasks.split(",")
    else:
        names = list(tasks)
    flat: list[str] = []
    for name in (n.strip() for n in names):
        if not name:
            continue
        for member in TASK_SETS.get(name, (name,)):
            if member not in flat:
                flat.append(member)
    local = [n for n in flat if n in mc_tasks.LOCAL_TASKS]
    return local, "heldout" in flat, [n for n in flat if n not in LOCAL_SET]


def _model_name(model: torch.nn.Module) -> str:
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return str(name) or type(model).__name__


def _mc_entry(results: dict, lm_name: str, chance: float | None, metric: str,
              kind: str = "multiple_choice") -> dict[str, Any]:
    score, stderr = harness.metric(results, lm_name, metric)
    entry: dict[str, Any] = {"score": score, "stderr": stderr, "chance": chance,
                             "metric": metric, "kind": kind,
                             "n": results.get("n-samples", {}).get(lm_name, {}).get("effective")}
    for extra in ("acc", "acc_norm"):
        if extra != metric:
            with contextlib.suppress(KeyError):
                entry[extra], entry[f"{extra}_stderr"] = harness.metric(results, lm_name, extra)
    return entry


def _mean_with_stderr(entries: list[dict]) -> tuple[float | None, float | None, float | None]:
    if not entries:
        return None, None, None
    mean = sum(e["score"] for e in entries) / len(entries)
    errs = [e["stderr"] for e in entries]
    stderr = (math.sqrt(sum(s * s for s in errs)) / len(entries)
              if all(s is not None for s in errs) else None)
    chances = [e["chance"] for e in entries]
    chance = sum(chances) / len(chances) if all(c is not None for c in chances) else None
    return mean, stderr, chance


class _Stages:
    """One progress step per stage (``progress.Bar``; quiet in tests), timing each."""

    def __init__(self, total: int, quiet: bool):
        from autocompress.progress import Bar

        self.bar = Bar("evaluating", total, enabled=not quiet)
        self.timings: dict[str, float] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()

    def run(self, label: str, fn, *args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        self.timings[label] = round(time.perf_counter() - start, 2)
        self.bar.advance(info=label)
        return out


def evaluate(model: torch.nn.Module, tokenizer, tasks: Iterable[str] | str | None = None,
             limit: int | None = None, corpus_dir: Path | None = None, *,
             config: EvalConfig | None = None, model_name: str | None = None,
             work_dir: Path | None = None, quiet: bool = True) -> dict[str, Any]:
    """Run the benchmark suite on an in-memory causal LM; see the module doc for the result.

    ``limit`` caps items per task (and held-out chunks) for quick checks.
    ``corpus_dir`` defaults to the standard corpus (built on first use).
    ``work_dir`` holds generated task files (default ``$AUTOCOMPRESS_HOME/eval``).
    Works for any ``PreTrainedModel`` whose forward returns ``.logits``; the
    model's train/eval mode is restored afterwards.
    """
    from autocompress.data.corpus import ensure_corpus, load_documents, load_manifest
    from autocompress.paths import home

    if limit is not None and limit < 1:
        raise AutoCompressError(f"eval limit {limit} leaves no items to score",
                                hint="give a positive limit, or none for every item")
    cfg = config or EvalConfig()
    local, run_heldout, std_names = expand_tasks(tasks)
    human = [n for n in std_names if n in HUMANEVAL_TASKS]
    std_names = [n for n in std_names if n not in HUMANEVAL_TASKS]
    problems = _humaneval_problems(human, cfg)  # before any work: a missing package fails fast
    needs_corpus = bool(local) or run_heldout
    corpus = (Path(corpus_dir) if corpus_dir else ensure_corpus()) if needs_corpus else None
    # Standard benchmarks are loaded first: a missing dataset fails in seconds,
    # not after the local suite has run.
    std_loaded = (standard.load_standard(std_names, cfg.allow_code_execution, mc_tasks.LOCAL_TASKS)
                  if std_names else None)
    docs = load_documents(corpus, "heldout") if needs_corpus else []
    run = _SuiteRun(model=model, tokenizer=tokenizer, cfg=cfg, limit=limit,
                    work_dir=Path(work_dir or home() / "eval"))
    run.result["model"] = model_name or _model_name(model)
    run.details.update({
        "seed": cfg.seed, "num_items": cfg.num_items, "seq_len": run.context_len, "limit": limit,
        "lm_eval_version": harness.lm_eval_version(),
        "num_params": sum(p.numel() for p in model.parameters()),
        "corpus_fingerprint": load_manifest(corpus).fingerprint if docs else None,
    })
    was_training = model.training
    n_stages = len(local) + bool(local) + 3 * run_heldout + bool(std_names) + len(human)
    try:
        with _Stages(n_stages, quiet) as run.stages:
            if local:
                run.local_tasks(local, docs)
            if run_heldout:
                run.heldout_metrics(corpus, docs)
            if std_loaded is not None:
                run.standard_tasks(std_names, std_loaded)
            for name in human:
                run.humaneval_task(name, problems[:limit])
    finally:
        model.train(was_training)
    return run.finish()


@dataclasses.dataclass
class _SuiteRun:
    """State of one ``evaluate`` call; each method fills part of ``result``."""

    model: torch.nn.Module
    tokenizer: Any
    cfg: EvalConfig
    limit: int | None
    work_dir: Path
    stages: Any = None
    result: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"model": None, "tasks": {}})
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    per_item: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def context_len(self) -> int:
        """``seq_len``, or less if the model's positions end earlier."""
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return min(self.cfg.seq_len, limit) if isinstance(limit, int) else self.cfg.seq_len

    def local_tasks(self, names: list[str], docs) -> None:
        """Build (or reuse) the local task files and score them through lm-eval."""
        cfg, files = self.cfg, {}
        for name in names:
            files[name] = self.stages.run(f"building {name} items", mc_tasks.write_task_file,
                                          name, docs, self.work_dir / "tasks", cfg.num_items,
                                          cfg.seed)
        self.details["task_files"] = {n: str(p) for n, p in files.items()}
        lm = harness.make_lm(self.model, self.tokenizer, batch_size=cfg.batch_size,
                             max_length=self.context_len, reuse_context=cfg.reuse_context)
        loaded = harness.load_tasks([
            harness.multiple_choice_config(_LM_EVAL_PREFIX + n, p, self.work_dir / "hf-datasets")
            for n, p in files.items()])
        out = self.stages.run("multiple choice (lm-eval)", harness.run, lm, loaded,
                              limit=self.limit, log_samples=True)
        for name in names:
            spec = mc_tasks.TASKS[name]
            self.result["tasks"][name] = _mc_entry(out, _LM_EVAL_PREFIX + name, spec.chance,
                                                   spec.metric)
            self.per_item[name] = _item_scores(out["samples"][_LM_EVAL_PREFIX + name],
                                               spec.metric)

    def heldout_metrics(self, corpus: Path, docs) -> None:
        """Bits per byte through lm-eval; next-token accuracy and loss with torch."""
        cfg = self.cfg
        chunks = heldout.heldout_chunks(docs, cfg.bpb_bytes, seed=cfg.seed)[:self.limit]
        if not chunks:
            raise AutoCompressError(f"the held-out split of {corpus} is empty",
                                    "rebuild the corpus with `autocompress data prepare`")
        path = heldout.write_chunks(chunks, self.work_dir / "tasks")
        # No BOS added to documents: lm-eval conditions on the prefix token already.
        lm = harness.make_lm(self.model, self.tokenizer, batch_size=cfg.batch_size,
                             max_length=self.context_len, add_bos_token=False)
        name = _LM_EVAL_PREFIX + "heldout_bpb"
        loaded = harness.load_tasks([harness.rolling_config(name, path,
                                                            self.work_dir / "hf-datasets")])
        out = self.stages.run("bits per byte (lm-eval rolling)", harness.run, lm, loaded,
                              log_samples=True)
        bpb, bpb_err, nbytes = heldout.bits_per_byte_from_samples(out["samples"][name])
        self.result["bits_per_byte"], self.result["bits_per_byte_stderr"] = bpb, bpb_err
        self.details["bits_per_byte"] = {"chunks": len(chunks), "bytes": nbytes,
                                         "file": str(path)}

        windows = self.stages.run("held-out tokens", _quietly, heldout.heldout_windows,
                                  self.tokenizer, corpus, self.context_len,
                                  cfg.next_token_windows, cfg.seed)
        tm = self.stages.run("next-token accuracy", heldout.token_metrics, self.model, windows,
                             max(1, cfg.batch_size // 2))
        self.result["next_token_acc"] = tm.accuracy
        self.result["next_token_acc_stderr"] = tm.accuracy_stderr
        self.result["heldout_loss"], self.result["heldout_loss_stderr"] = tm.loss, tm.loss_stderr
        self.per_item["heldout_loss"] = {str(i): x for i, x in enumerate(tm.window_loss)}
        self.details["next_token"] = {"tokens": tm.tokens, "windows": tm.windows}

    def standard_tasks(self, names: list[str], loaded: dict[str, Any]) -> None:
        """lm-eval's own benchmarks, with the model's full context length."""
        cfg = self.cfg
        lm = harness.make_lm(self.model, self.tokenizer, batch_size=cfg.batch_size,
                             reuse_context=cfg.reuse_context)
        with _env({"HF_ALLOW_CODE_EVAL": "1"} if cfg.allow_code_execution else {}):
            out = self.stages.run("standard benchmarks (lm-eval)", harness.run, lm, loaded,
                                  limit=self.limit,
                                  allow_code_execution=cfg.allow_code_execution)
        for name in names:
            members = _members(name, loaded)
            kind = ("multiple_choice"
                    if all(t.OUTPUT_TYPE == "multiple_choice" for t in members) else "generate")
            self.result["tasks"][name] = _mc_entry(
                out, name, standard.chance_level(members, self.limit),
                standard.score_metric(name, members), kind)

    def humaneval_task(self, name: str, problems: list[humaneval.Problem]) -> None:
        """HumanEval's solutions' bits per byte (paired per problem), or pass@k."""
        if name == "humaneval_bpb":
            out = self.stages.run("HumanEval bits per byte", humaneval.likelihood, self.model,
                                  self.tokenizer, problems)
            self.result["tasks"][name] = {
                "score": out.mean, "stderr": out.stderr, "chance": None,
                "metric": "bits_per_byte", "kind": "likelihood", "n": len(problems),
                "pooled_bits_per_byte": out.pooled, "truncated": out.truncated}
            self.per_item[name] = out.per_problem
            return
        out = self.stages.run("HumanEval pass@k (sandboxed)", humaneval.pass_at_ks, self.model,
                              self.tokenizer, problems,
                              allow_code_execution=self.cfg.allow_code_execution)
        self.result["tasks"][name] = {
            "score": out["pass_at"][1], "stderr": None, "chance": None, "metric": "pass@1",
            "kind": "generate", "n": len(problems), "samples": out["samples"],
            **{f"pass@{k}": v for k, v in out["pass_at"].items()}}
        self.per_item[name] = {t: float(c) for t, c in out["passed"].items()}

    def finish(self) -> dict[str, Any]:
        result = self.result
        mc = [e for e in result["tasks"].values() if e["kind"] == "multiple_choice"]
        result["mc_mean"], result["mc_mean_stderr"], result["mc_chance_mean"] = (
            _mean_with_stderr(mc))
        for key in ("bits_per_byte", "bits_per_byte_stderr", "next_token_acc",
                    "next_token_acc_stderr", "heldout_loss", "heldout_loss_stderr"):
            result.setdefault(key, None)
        self.details["timings_s"] = self.stages.timings if self.stages else {}
        result["per_item"] = self.per_item
        result["details"] = self.details
        return result


def _humaneval_problems(names: list[str], cfg: EvalConfig) -> list[humaneval.Problem]:
    """HumanEval's problems when a HumanEval task is asked for (checked before any work)."""
    if "humaneval_pass" in names:
        humaneval.require_code_execution(cfg.allow_code_execution)
    return humaneval.load_problems() if names else []


def _item_scores(samples: list[dict], metric: str) -> dict[str, float]:
    """Per item of lm-eval's logged samples: its ``metric``, keyed by the item's own id."""
    return {str(s["doc"]["id"]): float(s[metric]) for s in samples}


def _quietly(fn, *args):
    with harness.quiet_lm_eval():  # e.g. the first call tokenizes and caches the split
        return fn(*args)


@contextlib.contextmanager
def _env(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _members(name: str, loaded: dict[str, Any]) -> list[Any]:
    """The leaf task objects behind a task or group name."""
    if name in loaded["tasks"]:
        return [loaded["tasks"][name]]
    out, todo = [], list(loaded.get("group_map", {}).get(name, []))
    while todo:
        child = todo.pop()
        if child in loaded["tasks"]:
            out.append(loaded["tasks"][child])
        else:
            todo.extend(loaded.get("group_map", {}).get(child, []))
    return out


def write_json(result: dict[str, Any], path: Path) -> Path:
    """Write the result atomically (a temp file renamed into place)."""
    return write_json_atomic(path, result)
