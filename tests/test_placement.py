"""Placing a step on another work pool (``flows.placement``), without a served stack: the
step's inputs as a worker rebuilds them, which stages may be placed, and a pool that no
worker serves (on Prefect's test server). The served story is ``tests/test_served.py``."""

from __future__ import annotations

import json
import time

import pytest


def test_a_placed_step_gets_its_inputs_back_as_the_stages_types():
    """Parameters arrive as JSON; rebuilt inputs must give the in-process cache key."""
    from autocompress.artifacts import ArtifactRef
    from autocompress.limits import Limits
    from flows.placement import load_stage, stage_path, typed_inputs
    from tasks.search import search_arch
    from tasks.stage import inputs_digest

    ref = ArtifactRef(kind="teacher", uri="s3://b/teacher/x", sha256="ab" * 32)
    inputs = {"teacher": ref, "corpus": ref, "importance": ref, "costmodel": ref,
              "validation": ref, "target": "cpu-local/hf-eager/fp32", "workload": "w",
              "limits": Limits(max_tpot_ms=3.0), "options": {"steps": 2}}
    as_json = json.loads(json.dumps({k: v.model_dump(mode="json") if hasattr(v, "model_dump")
                                     else v for k, v in inputs.items()}))
    stage = load_stage(stage_path(search_arch))
    assert stage is search_arch
    rebuilt = typed_inputs(stage, as_json)
    assert isinstance(rebuilt["limits"], Limits) and isinstance(rebuilt["teacher"], ArtifactRef)
    assert inputs_digest(rebuilt) == inputs_digest(inputs)


def test_only_stages_of_this_project_can_be_placed():
    from autocompress.errors import AutoCompressError
    from flows.placement import load_stage

    for path in ("os:system", "tasks.search:SEARCH_CODE", "tasks.search"):
        with pytest.raises(AutoCompressError):
            load_stage(path)


def flow_runs_named(name: str) -> list:
    """The flow runs called ``name`` (the server may hold other tests' runs too)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


def test_a_placed_step_no_worker_takes_fails_its_parent_naming_the_pool(prefect_server,
                                                                        monkeypatch):
    """A pool with a deployment but no worker: the placed step is cancelled after the
    timeout and the parent fails with one line naming the pool (Prefect's test server)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from autocompress.artifacts import ArtifactRef
    from autocompress.errors import AutoCompressError
    from flows.placement import STAGE_FLOW, TIMEOUT_ENV, placement_timeout_s, run_placed
    from tasks.smoke import forward_probe
    from tasks.stage import RunInfo

    pool = "nobody-home"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        client.create_deployment(client.create_flow_from_name(STAGE_FLOW), name=pool,
                                 work_pool_name=pool, entrypoint="flows.placement:run_stage")

    @flow(name="placing-parent")
    def placing_parent():
        model = ArtifactRef(kind="teacher", uri="s3://nowhere/teacher", sha256="ab" * 32)
        return run_placed(forward_probe, {"model": model}, RunInfo(track=False), pool, "probe")

    monkeypatch.setenv(TIMEOUT_ENV, "3")
    started = time.monotonic()
    state = placing_parent(return_state=True)
    assert state.is_failed()
    assert f"no worker of pool {pool!r} took step 'probe' in 3 s" in state.message
    assert time.monotonic() - started < 60
    # The untaken run is cancelled: a worker that joins later does not run it.
    (placed,) = flow_runs_named(f"probe@{pool}")
    assert placed.state.is_cancelled()

    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(AutoCompressError, match=TIMEOUT_ENV):
        placement_timeout_s()


CALLS: list[int] = []


def _echo_stage():
    """A cached stage defined here (its module is this test's): counts its runs."""
    from tasks.stage import StageContext, stage

    @stage("placement_echo", retries=0)
    def placement_echo(ctx: StageContext, value: int, scale: int = 1) -> dict:
        CALLS.append(value)
        return {"value": value * scale}

    return placement_echo


ECHO = _echo_stage()


def test_a_placed_step_already_in_the_cache_is_read_without_placing_it(
        prefect_server, autocompress_home, monkeypatch):
    """A step placed on a pool nobody serves: a cache hit comes back at once (no flow run on
    the pool), the same step with other inputs is still placed (and times out there)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.common import Steps, new_report
    from flows.placement import STAGE_FLOW, TIMEOUT_ENV, cache_hit
    from tasks.stage import RunInfo

    pool = "nobody-serves-the-cached"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        client.create_deployment(client.create_flow_from_name(STAGE_FLOW), name=pool,
                                 work_pool_name=pool, entrypoint="flows.placement:run_stage")
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    CALLS.clear()

    @flow(name="placing-cached")
    def placing(value: int, placement: dict[str, str]) -> tuple:
        run = RunInfo(track=False)
        report = new_report("placing-cached", run)
        hit = cache_hit(ECHO, {"value": value}, run)
        result = Steps(run, report, placement)("echo", ECHO, value=value)
        return hit, result, report.steps[0]

    hit, result, outcome = placing(7, {})  # in this process: runs, and is cached
    assert (hit, result, outcome.state, CALLS) == (False, {"value": 7}, "Completed", [7])
    # The default (scale=1) is part of the key, as Prefect binds it: the same key is found.
    hit, result, outcome = placing(7, {"echo": pool})
    assert (hit, result, outcome.state, CALLS) == (True, {"value": 7}, "Cached", [7])
    assert outcome.pool is None and outcome.worker == {}
    assert flow_runs_named(f"echo@{pool}") == []

    state = placing(8, {"echo": pool}, return_state=True)  # not cached: placed, untaken
    assert state.is_failed() and f"no worker of pool {pool!r} took step 'echo'" in state.message
    assert CALLS == [7]
    (placed,) = flow_runs_named(f"echo@{pool}")
    assert placed.state.is_cancelled()
