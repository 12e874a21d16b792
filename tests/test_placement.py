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
    with get_client(sync_client=True) as client:
        (placed,) = [
            r for r in client.read_flow_runs() if r.name == f"probe@{pool}"]
    assert placed.state.is_cancelled()

    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(AutoCompressError, match=TIMEOUT_ENV):
        placement_timeout_s()
