"""What every flow shares: its MLflow parent run, calling its steps, timings.

A flow calls its stage tasks through a ``Steps`` caller, as plain calls whose values
live in Python variables::

    step = Steps(run, report, placement)
    pruned = step("pruned", prune_model, teacher=teacher, arch=arch, importance=importance)

The caller runs the task (in this process, or on a work pool the step is placed on),
notes whether it came back from the cache and how long it took, and logs its artifact
references on the flow's MLflow run. Flows that re-key one wiring for many targets
(``flows/targets.py``) list ``Step``s and call ``run_steps``, which uses the same caller.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from prefect import runtime
from prefect.logging import get_run_logger
from pydantic import BaseModel, Field

from autocompress.artifacts import ArtifactRef, Store
from autocompress.progress import stage_ended, stage_started
from autocompress.tracking import get_tracker, tracking_uri
from flows.placement import cache_hit, run_placed
from tasks.stage import RunInfo, Stage, refs_in, stage_timings


class Step:
    """One stage call: ``Step("pruned", prune_task, model="teacher", spec="arch")``.

    Keyword arguments map the stage's parameter names to names in the flow's
    ``values`` (flow parameters and earlier steps' outputs); the step's output
    is stored under ``name``.
    """

    def __init__(self, name: str, stage: Stage, /, **inputs: str):
        self.name = name
        self.stage = stage
        self.inputs = inputs

    def __repr__(self) -> str:
        return f"Step({self.name!r}, {self.stage.name!r}, {self.inputs})"


class StepOutcome(BaseModel):
    name: str
    state: str  # Completed | Cached | Failed ...
    seconds: float
    pool: str | None = None  # the work pool of a placed step (None: in the flow's process)
    worker: dict[str, str] = Field(default_factory=dict)  # where a placed step ran


class FlowReport(BaseModel):
    """What a flow run returns: outputs by step, cache hits, timings, where to look."""

    flow: str
    flow_run_id: str | None
    mlflow_run_id: str | None
    tracking_uri: str | None
    store_uri: str
    outputs: dict[str, Any] = Field(default_factory=dict)
    steps: list[StepOutcome] = Field(default_factory=list)
    wall_s: float = 0.0
    stage_work_s: float = 0.0
    tracking_s: float = 0.0
    publish_s: float = 0.0
    notes: list[str] = Field(default_factory=list)

    @property
    def cached(self) -> list[str]:
        return [s.name for s in self.steps if s.state == "Cached"]

    @property
    def executed(self) -> list[str]:
        return [s.name for s in self.steps if s.state != "Cached"]

    @property
    def overhead_s(self) -> float:
        """Flow time not spent in stage work: Prefect + MLflow + glue."""
        return max(0.0, self.wall_s - self.stage_work_s)


@contextmanager
def tracked_flow(flow: str, params: dict[str, Any], experiment: str = "autocompress",
                 store: str | None = None, track: bool = True,
                 tags: dict[str, str] | None = None) -> Iterator[RunInfo]:
    """The flow's MLflow parent run and the ``RunInfo`` handed to every stage.

    A retried flow run (``prefect flow-run retry``) re-opens its own parent run
    instead of starting another one. ``tags`` are added to the parent run (e.g.
    the event that triggered the flow run).
    """
    flow_run_id = _flow_run_id()
    store_uri = Store.from_uri(store).uri
    parent = None
    tracker = get_tracker(experiment) if track else None
    if tracker is not None:
        parent = _existing_parent(tracker, flow_run_id) or tracker.start_run(
            runtime.flow_run.name or flow,
            tags={"prefect.flow_run_id": flow_run_id or "", "autocompress.flow": flow,
                  "autocompress.store": store_uri, **(tags or {})},
            params=params,
        )
    info = RunInfo(parent_run_id=parent, experiment=experiment,
                   tracking_uri=tracker.uri if tracker else None, store_uri=store_uri,
                   flow_run_id=flow_run_id, track=track)
    ok = False
    try:
        yield info
        ok = True
    finally:
        if tracker is not None and parent is not None:
            tracker.end_run(parent, ok=ok)


def _flow_run_id() -> str | None:
    try:
        return runtime.flow_run.id
    except Exception:  # outside a flow run
        return None


def _existing_parent(tracker, flow_run_id: str | None) -> str | None:
    if not flow_run_id:
        return None
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.`prefect.flow_run_id` = '{flow_run_id}' "
                      f"and tags.`autocompress.flow` != ''",
        max_results=1,
    )
    if not runs:
        return None
    tracker.client.update_run(runs[0].info.run_id, status="RUNNING")
    return runs[0].info.run_id


class Steps:
    """Calls a flow's stage tasks: ``step(name, stage, **inputs)`` returns the stage's result.

    ``placement`` maps step names to work pools: those steps run on a worker of that pool
    (``flows.placement``), the others in this process, as do placed steps already in the
    cache (nothing to run: no flow run is started for them). Each result is kept in
    ``outputs`` under its step's name (the flow's report and the lineage read them).
    """

    def __init__(self, run: RunInfo, report: FlowReport,
                 placement: dict[str, str] | None = None):
        self.run = run
        self.report = report
        self.placement = placement or {}
        self.outputs: dict[str, Any] = {}
        self._logger = get_run_logger()
        self._tracker = run.tracker()

    def __call__(self, name: str, stage: Stage, /, **inputs: Any) -> Any:
        started = time.perf_counter()
        step_run = self.run.model_copy(update={"step": name})
        pool = self.placement.get(name)
        stage_started(name)
        if pool and not cache_hit(stage, inputs, step_run):
            state_name, result, worker = run_placed(stage, inputs, step_run, pool, name)
            self._record(name, state_name, started, pool, worker)
        else:  # in this process; a placed step already in the cache is read here too
            state = stage(**inputs, run=step_run, return_state=True)
            self._record(name, state.name, started)
            result = state.result()  # raises the stage's exception if it failed
        self.outputs[name] = result
        self._log_refs(name, result)
        return result

    def _record(self, name: str, state_name: str, started: float, pool: str | None = None,
                worker: dict[str, str] | None = None) -> None:
        seconds = time.perf_counter() - started
        self.report.steps.append(StepOutcome(name=name, state=state_name, pool=pool,
                                             worker=worker or {}, seconds=seconds))
        where = f" on pool {pool}" if pool else ""
        self._logger.info("%s: %s in %.1fs%s", name, state_name, seconds, where)
        stage_ended(name, state_name, seconds, where)

    def _log_refs(self, name: str, result: Any) -> None:
        if self._tracker is None or not self.run.parent_run_id:
            return
        started = time.perf_counter()
        for ref_name, ref in refs_in(result, name).items():
            self._tracker.log_ref(self.run.parent_run_id, ref_name, ref)
        self.report.tracking_s += time.perf_counter() - started


def run_steps(steps: Sequence[Step], values: dict[str, Any], run: RunInfo,
              report: FlowReport, placement: dict[str, str] | None = None) -> dict[str, Any]:
    """Call each step in order, its inputs taken from ``values`` by name; its output joins
    ``values`` under the step's name."""
    step = Steps(run, report, placement)
    for listed in steps:
        missing = [src for src in listed.inputs.values() if src not in values]
        if missing:
            raise KeyError(f"step {listed.name!r} needs {missing}, which no earlier step "
                           "produced")
        inputs = {param: values[src] for param, src in listed.inputs.items()}
        values[listed.name] = step(listed.name, listed.stage, **inputs)
    return values


def finish_report(report: FlowReport, run: RunInfo, started: float) -> FlowReport:
    """Fill in timings and log the summary metrics on the flow's parent run."""
    report.wall_s = time.perf_counter() - started
    timings = stage_timings(run.flow_run_id) if run.flow_run_id else []
    report.stage_work_s = sum(t.body_s for t in timings)
    report.tracking_s += sum(t.tracking_s for t in timings)
    report.publish_s = sum(t.publish_s for t in timings)
    tracker = run.tracker()
    if tracker is not None and run.parent_run_id:
        tracker.log_metrics(run.parent_run_id, {
            "flow.wall_seconds": report.wall_s,
            "flow.stage_work_seconds": report.stage_work_s,
            "flow.tracking_seconds": report.tracking_s,
            "flow.overhead_share": report.overhead_s / report.wall_s if report.wall_s else 0.0,
            "flow.cached_steps": len(report.cached),
            "flow.executed_steps": len(report.executed),
        })
        for t in timings:
            tracker.log_metrics(run.parent_run_id, {f"stage_seconds.{t.stage}": t.body_s})
    return report


def new_report(flow: str, run: RunInfo) -> FlowReport:
    return FlowReport(flow=flow, flow_run_id=run.flow_run_id, mlflow_run_id=run.parent_run_id,
                      tracking_uri=run.tracking_uri or (tracking_uri() if run.track else None),
                      store_uri=run.store_uri or Store.from_uri().uri)


def refs_of(values: dict[str, Any], names: Sequence[str]) -> dict[str, ArtifactRef]:
    """The ArtifactRefs among ``values[name]`` for ``names`` (in that order)."""
    out: dict[str, ArtifactRef] = {}
    for name in names:
        if name in values:
            found = refs_in(values[name], name)
            out.update(found)
    return out


