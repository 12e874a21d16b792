"""Run one flow step on another work pool: the ``stage`` flow and its dispatch.

A served flow can place a step on a pool (``placement={"model": "accelerator"}``):
the step then runs as a flow run of the ``stage/<pool>`` deployment (this
module's ``run_stage``, deployed once per pool in prefect.yaml), in a worker of
that pool — another process, another machine in a cluster. Nothing local is
shared: the step's inputs are ``ArtifactRef``s and plain values (parameters of
the run), the worker fetches artifacts from the store, and the step's result
comes back through Prefect's result storage (S3 when the store is S3).

The stage keeps its cache key wherever it runs, so a placed step that already
finished (on any worker) comes back as a cache hit, and a retried flow run
re-runs only what failed. A step whose result is already in the cache is not placed
at all (``cache_hit``): the flow reads it from the shared result storage as it reads
an unplaced step's, so no flow run, worker or process is started for it (and no
worker is named for it in the lineage: none ran it).

A placed step that no worker of its pool takes within ``placement_timeout_s()``
(``AUTOCOMPRESS_PLACEMENT_TIMEOUT_S``, default 30 minutes: time for a cluster to
bring up a GPU node) is cancelled and fails its parent with one line naming the
pool; once a worker is there, retrying the parent resumes from the cached stages.
A step that a worker took is never timed out here: distillation may take hours.
"""

from __future__ import annotations

import importlib
import os
import socket
import time
import typing
from typing import Any

from prefect import flow
from prefect.results import get_result_store
from prefect.settings import PREFECT_TASKS_REFRESH_CACHE
from prefect.utilities.callables import get_call_parameters
from pydantic import TypeAdapter

from autocompress.errors import AutoCompressError
from autocompress.serving import WORKER_NAME_ENV
from tasks.stage import RunInfo, Stage, StageCachePolicy

STAGE_FLOW = "stage"
# Stages are looked up by module path in these packages only: a flow-run
# parameter never makes a worker import arbitrary code.
STAGE_PACKAGES = ("tasks.", "flows.")
POLL_SECONDS = 1.0
TIMEOUT_ENV = "AUTOCOMPRESS_PLACEMENT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0


def placement_timeout_s() -> float:
    """How long a placed step may wait for a worker of its pool to take it."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if value <= 0:
        raise AutoCompressError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds",
                                f"set e.g. {TIMEOUT_ENV}=600, or unset it for "
                                f"{DEFAULT_TIMEOUT_S:.0f} s")
    return value


def stage_path(stage: Stage) -> str:
    """``module:name`` of a stage object (what ``run_stage`` imports)."""
    return f"{stage.__module__}:{stage.__name__}"


def load_stage(path: str) -> Stage:
    module_name, _, attr = path.partition(":")
    if not module_name.startswith(STAGE_PACKAGES) or not attr:
        raise AutoCompressError(f"{path!r} is not a stage of this project",
                                "placed steps must be stages defined in tasks/ or flows/")
    found = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(found, Stage):
        raise AutoCompressError(f"{path!r} is not a stage", "name a @stage-decorated function")
    return found


def typed_inputs(stage: Stage, inputs: dict[str, Any]) -> dict[str, Any]:
    """Flow-run parameters arrive as JSON: rebuild each input as the stage's type.

    ``Limits`` must arrive as ``Limits`` and an ``ArtifactRef`` as an ``ArtifactRef``,
    or the stage's cache key (content digests of typed inputs) would differ from
    the one computed where the step runs in-process.
    """
    hints = typing.get_type_hints(stage.fn)
    return {name: TypeAdapter(hints[name]).validate_python(value) if name in hints else value
            for name, value in inputs.items()}


def worker_name() -> str | None:
    """The name of the served worker this process runs under (None: not served)."""
    return os.environ.get(WORKER_NAME_ENV) or None


def worker_facts() -> dict[str, str]:
    """Where a placed step ran: worker name, host, process, the worker's own home."""
    return {"name": worker_name() or "", "host": socket.gethostname(),
            "pid": str(os.getpid()), "home": os.environ.get("AUTOCOMPRESS_HOME", ""),
            "cwd": os.getcwd()}


# The result persists as JSON (Prefect's encoder keeps pydantic types), in the
# default result storage workers are given: S3 when the store is S3.
@flow(name=STAGE_FLOW, persist_result=True, result_serializer="json")
def run_stage(stage: str, inputs: dict[str, Any], run: RunInfo) -> dict[str, Any]:
    """Run the stage at ``stage`` (``tasks.surgery:prune_model``) on ``inputs``.

    Returns ``{"state": "Completed" | "Cached", "result": ..., "worker": {...}}``.
    """
    target = load_stage(stage)
    state = target(**typed_inputs(target, inputs), run=run, return_state=True)
    return {"state": state.name, "result": state.result(), "worker": worker_facts()}


def cache_hit(stage: Stage, kwargs: dict[str, Any], run: RunInfo) -> bool:
    """Whether ``stage(**kwargs)`` would come back from the cache, read where it would run.

    The key is the one the stage's task computes (its parameters with their defaults, as
    Prefect binds them), looked up in the result storage the task would read and write
    (the shared store's when served). False for a stage that is not cached, or when the
    cache is being refreshed: then the step is placed as usual.
    """
    task = stage._configured()
    policy = task.cache_policy
    refresh = task.refresh_cache if task.refresh_cache is not None \
        else PREFECT_TASKS_REFRESH_CACHE.value()
    if not isinstance(policy, StageCachePolicy) or refresh:
        return False
    parameters = get_call_parameters(task.fn, (), {**kwargs, "run": run})
    key = policy.compute_key(None, parameters, {})
    return get_result_store().update_for_task(task).exists(key)


def run_placed(stage: Stage, kwargs: dict[str, Any], run: RunInfo, pool: str,
               step: str) -> tuple[str, Any, dict[str, str]]:
    """Run ``stage(**kwargs)`` as a ``stage/<pool>`` flow run; wait; return its outcome.

    Returns (state name, result, worker facts). A failed or crashed placed run
    raises, which fails the calling flow run like a failed in-process stage; so
    does a placed run that no worker takes in time (``placement_timeout_s``).
    """
    from prefect.deployments import run_deployment

    timeout = placement_timeout_s()
    flow_run = run_deployment(
        f"{STAGE_FLOW}/{pool}",
        parameters={"stage": stage_path(stage), "inputs": kwargs, "run": run},
        flow_run_name=f"{step}@{pool}", as_subflow=True, timeout=0,
    )
    state = wait_for_placed(flow_run.id, pool, step, timeout)
    if not state.is_completed():
        raise RuntimeError(f"step {step!r} on pool {pool!r} ended {state.name} "
                           f"(flow run {flow_run.id}): {state.message or ''}")
    outcome = state.result()
    return outcome["state"], outcome["result"], outcome["worker"]


def wait_for_placed(flow_run_id, pool: str, step: str, timeout: float):
    """The final state of a placed flow run; cancel it if no worker took it in ``timeout`` s.

    A run is taken once a worker moves it out of Scheduled (to Pending). An untaken run
    is cancelled before raising, so that a worker joining later does not run a step
    whose parent has given up on it (the retried parent places the step anew).
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(flow_run_id).state
            if state is not None and state.is_final():
                return state
            untaken = state is None or state.is_scheduled()
            if untaken and time.monotonic() > deadline:
                why = f"no worker of pool {pool!r} took step {step!r} in {timeout:.0f} s"
                client.set_flow_run_state(flow_run_id, Cancelled(message=why), force=True)
                raise AutoCompressError(
                    why, f"start one (`prefect worker start --pool {pool}`, see "
                    f"docs/served.md), then retry this flow run; or raise {TIMEOUT_ENV}")
            time.sleep(POLL_SECONDS)
