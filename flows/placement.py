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
re-runs only what failed.
"""

from __future__ import annotations

import importlib
import os
import socket
import typing
from typing import Any

from prefect import flow
from pydantic import TypeAdapter

from autocompress.errors import AutoCompressError
from tasks.stage import RunInfo, Stage

STAGE_FLOW = "stage"
# Stages are looked up by module path in these packages only: a flow-run
# parameter never makes a worker import arbitrary code.
STAGE_PACKAGES = ("tasks.", "flows.")
POLL_SECONDS = 1.0


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


def worker_facts() -> dict[str, str]:
    """Where a placed step ran: host, process, the worker's own home."""
    return {"host": socket.gethostname(), "pid": str(os.getpid()),
            "home": os.environ.get("AUTOCOMPRESS_HOME", ""), "cwd": os.getcwd()}


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


def run_placed(stage: Stage, kwargs: dict[str, Any], run: RunInfo, pool: str,
               step: str) -> tuple[str, Any, dict[str, str]]:
    """Run ``stage(**kwargs)`` as a ``stage/<pool>`` flow run; wait; return its outcome.

    Returns (state name, result, worker facts). A failed or crashed placed run
    raises, which fails the calling flow run like a failed in-process stage.
    """
    from prefect.deployments import run_deployment

    flow_run = run_deployment(
        f"{STAGE_FLOW}/{pool}",
        parameters={"stage": stage_path(stage), "inputs": kwargs, "run": run},
        flow_run_name=f"{step}@{pool}", poll_interval=POLL_SECONDS, as_subflow=True,
    )
    state = flow_run.state
    if state is None or not state.is_completed():
        name = state.name if state is not None else "unknown"
        raise RuntimeError(f"step {step!r} on pool {pool!r} ended {name} "
                           f"(flow run {flow_run.id}): {state.message if state else ''}")
    outcome = state.result()
    return outcome["state"], outcome["result"], outcome["worker"]
