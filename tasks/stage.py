"""``@stage``: turn one library call into a uniform Prefect task.

Every pipeline box (profile, fit cost model, prune, distill, ...) is written as a
plain function ``fn(ctx: StageContext, **inputs) -> ArtifactRef | dict | model``
and decorated with ``@stage("name")``. The decorator adds, in one place for all
stages:

* **Retries**: ``retries`` / ``retry_delay_seconds`` (transient faults).
* **Caching** keyed on the *content* of the inputs plus a code version:
  ``ArtifactRef`` inputs count by their sha256, configs by their JSON, paths by
  the hash of what they contain; the code version is a hash of the module that
  defines the stage and of every module it imports from our packages, followed
  transitively (``tasks.code_key``: derived, never a hand-kept list). Results are persisted
  (JSON), so a new flow run with the same inputs gets every finished stage back
  as a cache hit. Results are references (URI + sha256 + metrics), never models
  or tensors: a pickled module hashes differently in every process.
* **Resume** for long stages: ``ctx.workdir`` is derived from the same key, so a
  retried or re-run stage finds its own checkpoints there.
* **MLflow**: one nested run per executed stage, a child of the flow's run via
  ``parent_run_id`` (never the thread-local "active run"); every returned
  ``ArtifactRef`` is logged (URI + hash tags, metrics, JSON copy).
* **Timing**: the time spent in the stage body, in MLflow calls and in total,
  so a flow can report the share of orchestration overhead.
* **Fault injection** for tests and demos: ``AUTOCOMPRESS_FAULTS="prune:1"`` makes
  the first attempt of stage ``prune`` in this process raise ``InjectedFault``.

A stage task is called like the function minus ``ctx``, plus ``run=RunInfo``
(the flow's MLflow run, store and work dir; not part of the cache key)::

    @stage("fingerprint")
    def fingerprint(ctx, corpus: ArtifactRef) -> ArtifactRef: ...

    ref = fingerprint(corpus=corpus_ref, run=run_info)       # inside a flow
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from pydantic import BaseModel

from autocompress.artifacts import ArtifactRef, Store, sha256_path
from autocompress.atomic import write_json_atomic
from autocompress.tracking import Tracker, get_tracker
from tasks.code_key import code_key
from tasks.storage import result_storage


class InjectedFault(RuntimeError):
    """Raised by a stage named in ``AUTOCOMPRESS_FAULTS`` (tests, resume demos)."""


class RunInfo(BaseModel):
    """What a stage needs from its flow run. Passed as ``run=``; not in the cache key."""

    parent_run_id: str | None = None
    experiment: str = "autocompress"
    tracking_uri: str | None = None
    store_uri: str | None = None
    workdir: str | None = None
    flow_run_id: str | None = None
    track: bool = True
    step: str | None = None  # the flow step calling the stage (names its MLflow run)

    def store(self) -> Store:
        return Store.from_uri(self.store_uri)

    def tracker(self) -> Tracker | None:
        if not self.track:
            return None
        return get_tracker(self.experiment, self.tracking_uri)

    def work_root(self) -> Path:
        if self.workdir:
            return Path(self.workdir)
        from autocompress.paths import home

        return home() / "work"


# ---------------------------------------------------------------------------
# Timing ledger: what each executed stage spent, per flow run, in this process.


@dataclass
class StageTiming:
    stage: str
    total_s: float
    body_s: float  # the library's work, publishing included
    tracking_s: float  # MLflow calls
    publish_s: float  # writing artifacts to the store (part of body_s)
    flow_run_id: str | None = None


_TIMINGS: list[StageTiming] = []
_TIMINGS_LOCK = threading.Lock()


def stage_timings(flow_run_id: str | None = None) -> list[StageTiming]:
    """Timings of executed (not cached) stages, optionally of one flow run."""
    with _TIMINGS_LOCK:
        return [t for t in _TIMINGS if flow_run_id is None or t.flow_run_id == flow_run_id]


# ---------------------------------------------------------------------------
# Fault injection

_FAULTS_SEEN: dict[str, int] = {}
_FAULTS_LOCK = threading.Lock()


def reset_faults() -> None:
    """Forget how many injected faults were raised (tests)."""
    with _FAULTS_LOCK:
        _FAULTS_SEEN.clear()


def _maybe_inject_fault(stage_name: str) -> None:
    spec = os.environ.get("AUTOCOMPRESS_FAULTS", "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, count = item.partition(":")
        if name != stage_name:
            continue
        with _FAULTS_LOCK:
            seen = _FAULTS_SEEN.get(name, 0)
            if seen < int(count or 1):
                _FAULTS_SEEN[name] = seen + 1
                raise InjectedFault(f"injected fault {seen + 1} in stage {name!r}")


# ---------------------------------------------------------------------------
# Cache keys from content digests


def digest_value(value: Any) -> Any:
    """A JSON-able stand-in for ``value`` that changes iff its content does."""
    if isinstance(value, ArtifactRef):
        return {"ref": value.sha256, "kind": value.kind}
    if isinstance(value, BaseModel):
        return {"model": type(value).__name__, "data": value.model_dump(mode="json")}
    if isinstance(value, Path):
        return {"path_sha256": sha256_path(value)} if value.exists() else {"path": str(value)}
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return {str(k): digest_value(v) for k, v in items}
    if isinstance(value, list | tuple):
        return [digest_value(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(
        f"stage inputs must be ArtifactRefs, pydantic configs, paths or plain values, "
        f"not {type(value).__name__}: publish models/tensors and pass their ArtifactRef"
    )


def inputs_digest(inputs: dict[str, Any]) -> str:
    text = json.dumps(digest_value(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class StageCachePolicy(CachePolicy):
    """Key = stage name + code version + content digests of the inputs (minus ``run``)."""

    stage_name: str = ""
    stage_fn: Callable | None = None
    version: str = "1"
    exclude: list[str] = field(default_factory=lambda: ["run"])

    def code_version(self) -> str:
        """Hash of the stage's source, of what its module imports from our packages
        (transitively) and of ``version``.

        Computed once per stage object: code does not change under a running process.
        """
        cached = self.__dict__.get("_code_version")
        if cached is None:
            source = inspect.getsource(self.stage_fn) if self.stage_fn else ""
            module = self.stage_fn.__module__ if self.stage_fn else None
            parts = [self.version, hashlib.sha256(source.encode()).hexdigest(),
                     code_key(module) if module else ""]
            cached = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
            self.__dict__["_code_version"] = cached
        return cached

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any],
                    flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        kept = {k: v for k, v in (inputs or {}).items() if k not in self.exclude}
        return f"{self.stage_name}-{self.code_version()}-{inputs_digest(kept)[:32]}"


# ---------------------------------------------------------------------------
# What a stage body sees


@dataclass
class StageContext:
    """Handed to every stage body: where to work, where to publish, what to log."""

    name: str
    run: RunInfo
    key: str
    workdir: Path
    mlflow_run_id: str | None = None
    tracker: Tracker | None = None
    tracking_s: float = 0.0
    publish_s: float = 0.0
    published: list[ArtifactRef] = field(default_factory=list)
    scratch_dirs: list[Path] = field(default_factory=list)

    @functools.cached_property
    def store(self) -> Store:
        return self.run.store()

    def checkpoint_dir(self) -> Path:
        """Stable across retries and re-runs with the same inputs: resume from here."""
        path = self.workdir / "checkpoints"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def scratch(self) -> Path:
        """A fresh directory for this attempt's outputs, removed when the stage ends
        (publish what must survive; keep resumable state in ``checkpoint_dir``)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="scratch-", dir=self.workdir))
        self.scratch_dirs.append(path)
        return path

    def fetch(self, ref: ArtifactRef) -> Path:
        """A hash-checked local path for an input artifact. Treat it as read-only:
        it may be the published copy itself."""
        return Store.for_ref(ref).fetch(ref)

    def working_copy(self, ref: ArtifactRef) -> Path:
        """A private, writable copy of an input (made once per content hash).

        For library code that writes caches beside its input (the corpus gets
        ``tokens/`` caches): writing into a published artifact would change its
        hash and break every later check.
        """
        from autocompress.paths import home

        dest = home() / "cache" / "working-copies" / ref.sha256[:16] / ref.name
        if not dest.exists():
            Store.for_ref(ref).fetch(ref, dest)  # hash-checked, atomic
        return dest

    def publish(self, path: str | Path, kind: str, name: str | None = None,
                metrics: dict[str, float] | None = None, meta: dict[str, Any] | None = None,
                move: bool = False) -> ArtifactRef:
        """Publish a file/dir to the run's store (atomically) and return its reference."""
        started = time.perf_counter()
        ref = self.store.publish(path, kind, name=name, metrics=metrics, meta=meta, move=move)
        self.publish_s += time.perf_counter() - started
        self.published.append(ref)
        return ref

    def publish_json(self, name: str, data: Any, kind: str = "report",
                     metrics: dict[str, float] | None = None) -> ArtifactRef:
        """Write ``data`` as ``name`` (JSON) and publish it."""
        path = write_json_atomic(self.scratch() / name, data)
        return self.publish(path, kind, metrics=metrics, move=True)

    # MLflow, timed so the overhead can be reported; no-ops when tracking is off.
    def _track(self, method: str, *args) -> None:
        if self.tracker is None or self.mlflow_run_id is None:
            return
        started = time.perf_counter()
        getattr(self.tracker, method)(self.mlflow_run_id, *args)
        self.tracking_s += time.perf_counter() - started

    def log_params(self, params: dict[str, Any]) -> None:
        self._track("log_params", params)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self._track("log_metrics", metrics, step)

    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._track("log_file", path, artifact_path)

    def log_json(self, name: str, data: Any, artifact_path: str | None = None) -> None:
        self._track("log_json", name, data, artifact_path)


# ---------------------------------------------------------------------------
# The decorator


def refs_in(result: Any, prefix: str = "") -> dict[str, ArtifactRef]:
    """Every ArtifactRef inside a stage result, by a dotted name."""
    if isinstance(result, ArtifactRef):
        return {prefix or "result": result}
    found: dict[str, ArtifactRef] = {}
    if isinstance(result, BaseModel):
        result = dict(result)
    if isinstance(result, dict):
        for key, value in result.items():
            found.update(refs_in(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


class Stage:
    """A stage task. Call it like the function (minus ``ctx``) with ``run=``.

    The Prefect task is rebuilt per call only to pick up the result storage
    configured *now* (environment), so S3/local switches need no re-import.
    """

    def __init__(self, fn: Callable, name: str, *, retries: int, retry_delay_seconds: float,
                 version: str, timeout_seconds: float | None, cache: bool, tags: Sequence[str]):
        self.fn = fn
        self.name = name
        self.cache_policy = StageCachePolicy(stage_name=name, stage_fn=fn, version=version)
        self.task = task(
            _task_body(fn, name, self.cache_policy),
            name=name,
            retries=retries,
            retry_delay_seconds=retry_delay_seconds,
            retry_condition_fn=_retry_unless_user_error,
            cache_policy=self.cache_policy if cache else None,
            persist_result=True,
            result_serializer="json",
            timeout_seconds=timeout_seconds,
            tags=list(tags) or None,
        )
        functools.update_wrapper(self, fn, updated=())

    def _configured(self):
        storage = result_storage()
        return self.task if storage is None else self.task.with_options(result_storage=storage)

    def __call__(self, *args, run: RunInfo | None = None, **kwargs):
        return self._configured()(*args, run=run or RunInfo(), **kwargs)

    def submit(self, *args, run: RunInfo | None = None, **kwargs):
        return self._configured().submit(*args, run=run or RunInfo(), **kwargs)

    def __repr__(self) -> str:
        return f"Stage({self.name!r})"


def stage(name: str, *, retries: int = 2, retry_delay_seconds: float = 2.0,
          version: str = "1", timeout_seconds: float | None = None, cache: bool = True,
          tags: Sequence[str] = ()) -> Callable[[Callable], Stage]:
    """Decorate ``fn(ctx, **inputs)`` into a cached, retried, tracked ``Stage``.

    The code part of the cache key is derived from what ``fn``'s module imports
    (``tasks.code_key``). ``version``: bump to invalidate cached results by hand
    (e.g. after upgrading a third-party package the stage depends on).
    """

    def decorate(fn: Callable) -> Stage:
        return Stage(fn, name, retries=retries, retry_delay_seconds=retry_delay_seconds,
                     version=version, timeout_seconds=timeout_seconds, cache=cache, tags=tags)

    return decorate


def _task_body(fn: Callable, name: str, policy: StageCachePolicy) -> Callable:
    """The function Prefect runs: ``fn``'s parameters minus ``ctx``, plus ``run``."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]  # drop ctx
    run_param = inspect.Parameter("run", inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=RunInfo | None)
    exposed = sig.replace(parameters=[*params, run_param])
    inner = inspect.Signature(params)

    def body(*args, run: RunInfo | None = None, **kwargs):
        run = run or RunInfo()
        bound = inner.bind(*args, **kwargs)
        bound.apply_defaults()
        return _execute(fn, name, policy, run, dict(bound.arguments))

    body.__signature__ = exposed
    body.__name__ = fn.__name__
    body.__qualname__ = fn.__qualname__
    body.__module__ = fn.__module__
    body.__doc__ = fn.__doc__
    return body


def _execute(fn: Callable, name: str, policy: StageCachePolicy, run: RunInfo,
             inputs: dict[str, Any]) -> Any:
    started = time.perf_counter()
    key = _current_cache_key(name) or policy.compute_key(None, inputs, {})
    # Same inputs and code -> same work dir: a retry or re-run finds its checkpoints.
    workdir = run.work_root() / name / key.removeprefix(f"{name}-")
    ctx = StageContext(name=name, run=run, key=key, workdir=workdir)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    ctx.tracker = run.tracker()
    attempt = _attempt()
    if ctx.tracker is not None:
        t0 = time.perf_counter()
        ctx.mlflow_run_id = ctx.tracker.start_run(
            run.step or name, parent_run_id=run.parent_run_id,
            tags={"autocompress.stage": name, "autocompress.step": run.step or name,
                  "autocompress.cache_key": key,
                  "autocompress.attempt": attempt, "prefect.flow_run_id": run.flow_run_id or ""},
            params={"inputs": digest_value(inputs)},
        )
        ctx.tracking_s += time.perf_counter() - t0
    ok = False
    body_started, tracking_before = time.perf_counter(), ctx.tracking_s
    try:
        _maybe_inject_fault(name)
        result = fn(ctx, **inputs)
        ok = True
    finally:
        # Work done by the library = body time minus MLflow calls made from it.
        body_s = time.perf_counter() - body_started - (ctx.tracking_s - tracking_before)
        if ctx.tracker is not None and ctx.mlflow_run_id is not None:
            t0 = time.perf_counter()
            if ok:
                for ref_name, ref in refs_in(result).items():
                    ctx.tracker.log_ref(ctx.mlflow_run_id, ref_name, ref)
            ctx.tracker.log_metrics(ctx.mlflow_run_id, {"stage_seconds": body_s,
                                                        "publish_seconds": ctx.publish_s})
            ctx.tracker.end_run(ctx.mlflow_run_id, ok=ok)
            ctx.tracking_s += time.perf_counter() - t0
        for path in ctx.scratch_dirs:
            shutil.rmtree(path, ignore_errors=True)
        with _TIMINGS_LOCK:
            _TIMINGS.append(StageTiming(stage=name, total_s=time.perf_counter() - started,
                                        body_s=body_s, tracking_s=ctx.tracking_s,
                                        publish_s=ctx.publish_s, flow_run_id=run.flow_run_id))
    return result


def _retry_unless_user_error(task, task_run, state) -> bool:
    """Retry transient failures, not user-fixable ones (they fail the same way again)."""
    from autocompress.errors import AutoCompressError

    try:
        error = state.result(raise_on_failure=False)
    except Exception:  # the result could not be read: treat as transient
        return True
    return not isinstance(error, AutoCompressError)


def _current_cache_key(name: str) -> str | None:
    """The key Prefect computed for this task run (saves hashing the inputs twice).

    The task engine runs the task inside a transaction whose key is the cache key.
    """
    from prefect.transactions import get_transaction

    txn = get_transaction()
    key = getattr(txn, "key", None)
    return key if isinstance(key, str) and key.startswith(f"{name}-") else None


def _attempt() -> int:
    ctx = TaskRunContext.get()
    if ctx is None or ctx.task_run is None:
        return 1
    return int(ctx.task_run.run_count or 1)
