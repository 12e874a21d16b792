"""Served for real: `autocompress serve`, an event, a failed and retried run, two workers.

Everything runs on 127.0.0.1 and is started and stopped here: moto's S3 server,
`autocompress serve` (Prefect server, MLflow server, work pools, the deployments
of prefect.yaml, a `cpu` worker) and `accelerator` workers started the way a
second machine would start one (its own home, joined through serve's worker.env).

The story, in one run of the event-triggered deployment:

1. the cron schedule of `nightly-cpu` is on the server (read back through the API);
2. `autocompress teacher register` registers a tiny teacher and emits
   `autocompress.teacher.registered`; the `on-new-teacher` trigger from prefect.yaml
   starts a flow run with the teacher and the event id as parameters;
3. its `accelerated` step is placed on the `accelerator` pool, whose first worker is
   broken (AUTOCOMPRESS_FAULTS fails that stage there): the flow run ends Failed;
4. the broken worker is replaced and `prefect flow-run retry` re-runs the flow run:
   the stages that finished come back from the cache (in S3), the placed step runs
   on the new worker, the result is registered with lineage naming the event;
5. the two workers shared no directory: each has its own home, artifacts and
   results are in S3, and each stage's work dir is only on the worker that ran it;
6. headless Chromium renders the MLflow UI's model page (the lineage tags are in
   the DOM); with AUTOCOMPRESS_SCREENSHOTS=DIR it also screenshots that page and the
   Prefect flow-run graph into DIR (the README's images come from docs/).

To keep this to about two minutes on 2 cores, the triggered deployment runs the
`smoke` flow (teacher → forward pass here → forward pass on the accelerator pool →
register) instead of a full compression: same trigger, parameters, placement,
store, cache and registry code paths, tiny stages.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from autocompress.serving import (
    PrefectAPI,
    Stack,
    free_port,
    venv_program,
    worker_argv,
    worker_env,
)

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TEACHER_NAME = "served-teacher"
RESULT_NAME = "served-smoke"
EXPERIMENT = "served"


# ---------------------------------------------------------------- helpers


def status_of(url: str, body: dict, headers: dict[str, str]) -> int:
    """The HTTP status a POST of ``body`` to ``url`` with ``headers`` gets."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def wait_for(check, timeout: float, what: str, diagnose=lambda: ""):
    """Poll ``check()`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1.0)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}")


def run_cli(argv: list[str], env: dict[str, str], timeout: float = 240) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def served_spec(tmp: Path) -> Path:
    """prefect.yaml with the triggered deployment pointed at the quick `smoke` flow.

    The trigger (event, match, parameters) and the cron schedule are the file's own (the
    schedule paused).
    Deployments the test does not start are left out (fewer entrypoints to load).
    """
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    keep = []
    for dep in spec["deployments"]:
        if dep["name"] == "on-new-teacher":
            dep["entrypoint"] = "flows.smoke.smoke"
            dep["parameters"] = {"placement": {"accelerated": "accelerator"},
                                 "register_as": RESULT_NAME, "experiment": EXPERIMENT}
        if dep["name"] == "nightly-cpu":  # served, but paused: a test that runs across its
            for schedule in dep["schedules"]:  # hour must not start a compression on the
                schedule["active"] = False  # test's cpu worker
        if dep["name"] in ("nightly-cpu", "on-new-teacher", "cpu", "accelerator"):
            keep.append(dep)
    spec["deployments"] = keep
    path = tmp / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def chromium(url: str, tmp: Path, screenshot: Path | None = None) -> str:
    """Render ``url`` in headless Chromium; the DOM after scripts ran (or a PNG)."""
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={tmp / 'chromium-profile'}",
            "--virtual-time-budget=15000", "--window-size=1400,900"]
    argv += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*argv, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


# ---------------------------------------------------------------- the stack


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 and a bucket; the environment that reaches it."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": endpoint,
           "MLFLOW_S3_ENDPOINT_URL": endpoint}
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="served")
    yield {"env": env, "client": client, "bucket": "served", "store": "s3://served/ac"}
    server.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory, s3, mlflow_db_template):
    """`autocompress serve` (cpu worker) + a broken accelerator worker, torn down after."""
    tmp = tmp_path_factory.mktemp("served")
    home = tmp / "serve"
    home.mkdir()
    shutil.copy(mlflow_db_template, home / "mlflow.db")  # skip MLflow's migrations
    port, mlflow_port = free_port(), free_port()
    env = {**os.environ, **s3["env"], "AUTOCOMPRESS_STORE": s3["store"],
           "AUTOCOMPRESS_HOME": str(tmp / "cli-home"), "PREFECT_HOME": str(tmp / "cli-prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           "PREFECT_WORKER_QUERY_SECONDS": "1"}
    for var in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "AUTOCOMPRESS_RESULTS",
                "AUTOCOMPRESS_FAULTS", "AUTOCOMPRESS_MLFLOW_ARTIFACTS"):
        env.pop(var, None)
    log = open(tmp / "serve.out", "w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "autocompress.cli", "serve", "--file", str(served_spec(tmp)),
         "--home", str(home), "--port", str(port), "--mlflow-port", str(mlflow_port),
         "--worker", "cpu"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    workers = Stack()
    out = tmp / "serve.out"
    try:
        # The test's own accelerator worker joins as soon as serve wrote worker.env.
        wait_for(lambda: (home / "worker.env").exists() or serve.poll() is not None, 300,
                 "serve to write worker.env", out.read_text)
        from autocompress.commands.serve import read_worker_env

        joined = {**env, **read_worker_env(home / "worker.env")}
        broken = {**joined, "AUTOCOMPRESS_FAULTS": "forward_probe:99"}
        workers.start("worker accelerator", worker_argv("accelerator", "gpu-node-1"),
                      worker_env(broken, tmp / "gpu-node-1"), tmp / "gpu-node-1.log",
                      cwd=tmp / "gpu-node-1")
        wait_for(lambda: "ready" in out.read_text() or serve.poll() is not None, 400,
                 "serve to be ready", out.read_text)
        assert serve.poll() is None, out.read_text()
        api = PrefectAPI(f"http://127.0.0.1:{port}/api", joined["PREFECT_API_AUTH_STRING"])
        yield {"tmp": tmp, "home": home, "env": joined, "serve": serve, "out": out, "api": api,
               "workers": workers, "prefect": f"http://127.0.0.1:{port}",
               "mlflow": f"http://127.0.0.1:{mlflow_port}", "s3": s3}
    finally:
        workers.stop()
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        log.close()


# ---------------------------------------------------------------- the test


def test_serve_refuses_web_pages_strangers_and_command_overrides(served):
    """The attack of a web page on a served API: a flow run whose worker runs a command.

    Runs before the main test (same stack): nothing it tries may start a flow run.
    """
    api = served["api"]
    (nightly,) = [d for d in api.call("/deployments/filter", {}) if d["name"] == "nightly-cpu"]
    marker = served["tmp"] / "pwned"
    attack = {"job_variables": {"command": f"sh -c 'id > {marker}'"}}
    url = f"{api.url}/deployments/{nightly['id']}/create_flow_run"
    host = served["prefect"].removeprefix("http://")
    password = api.headers()["Authorization"]
    # A page on another site (even one that learnt the password), a DNS-rebinding page
    # (its own host name), a local process without the password, one without CSRF token.
    assert status_of(url, attack, {"Origin": "http://evil.example"}) == 403
    assert status_of(url, attack, {"Origin": "http://evil.example",
                                   "Authorization": password}) == 403
    assert status_of(url, attack, {"Host": f"evil.example:{host.split(':')[1]}",
                                   "Origin": f"http://evil.example:{host.split(':')[1]}"}) == 403
    assert status_of(url, attack, {"Origin": served["prefect"]}) in (401, 403)
    with pytest.raises(urllib.error.HTTPError) as unauthorized:  # reading needs it too
        urllib.request.urlopen(f"{api.url}/deployments/{nightly['id']}", timeout=30)
    assert unauthorized.value.code == 401
    assert status_of(url, attack, {"Authorization": password}) == 403  # no CSRF token
    # With the password and a CSRF token, the override itself is refused by the pools'
    # job template (no `command`, `env` or `working_dir` variable).
    with pytest.raises(urllib.error.HTTPError) as refused:
        api.call(f"/deployments/{nightly['id']}/create_flow_run", attack)
    assert refused.value.code == 422
    time.sleep(3)  # three polls of the cpu worker
    runs = api.call("/flow_runs/filter",
                    {"flow_runs": {"deployment_id": {"any_": [nightly["id"]]}}})
    assert runs == [] and not marker.exists()
    # The password reaches workers only through the owner-only worker.env.
    assert (served["home"] / "worker.env").stat().st_mode & 0o077 == 0


# About two minutes alone on 2 cores; many more when the machine is shared, so the
# per-test limit (600 s in pyproject) is raised here; every wait has its own bound.
@pytest.mark.timeout(1500)
def test_served_event_retry_distributed_and_uis(served):
    api = served["api"]
    env = served["env"]
    tmp = served["tmp"]

    # 1. The cron schedule is on the served deployment (paused by served_spec).
    deployments = {d["name"]: d for d in api.call("/deployments/filter", {})}
    expected = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"][0]
    assert expected["name"] == "nightly-cpu"
    crons = [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"])
             for s in deployments["nightly-cpu"]["schedules"]]
    assert crons == [(expected["schedules"][0]["cron"], "UTC", False)]

    # 2. Registering a teacher emits the event; the trigger starts a flow run.
    from autocompress.modeling.tiny import tiny_model

    tiny_model("llama", seed=0).save_pretrained(tmp / "tiny-teacher")
    out = run_cli([sys.executable, "-m", "autocompress.cli", "teacher", "register",
                   "--model", str(tmp / "tiny-teacher"), "--name", TEACHER_NAME], env)
    event_id = out.split("autocompress.teacher.registered")[-1].strip().split()[0]
    triggered = deployments["on-new-teacher"]["id"]

    def runs_of(deployment_id):
        return api.call("/flow_runs/filter",
                   {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})

    def diagnose():
        logs = [served["out"], served["home"] / "workers" / "cpu" / "worker.log",
                tmp / "gpu-node-1.log", tmp / "gpu-node-2.log"]
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in logs if p.exists())

    def final_run():
        runs = runs_of(triggered)
        return runs if runs and runs[0]["state_type"] in ("COMPLETED", "FAILED", "CRASHED") \
            else None

    (run,) = wait_for(final_run, 240, "the triggered flow run to finish", diagnose)
    assert run["parameters"]["teacher"] == f"models:/{TEACHER_NAME}/1"
    assert run["parameters"]["trigger_event"] == event_id

    # 3. The placed step failed on the broken accelerator worker: the run is Failed.
    assert run["state_type"] == "FAILED", run["state"]
    assert run["work_pool_name"] == "cpu"

    # 4. Replace the broken worker, retry the flow run from the CLI.
    workers = served["workers"]
    workers.stop("worker accelerator")
    workers.start("worker accelerator", worker_argv("accelerator", "gpu-node-2"),
                  worker_env(env, tmp / "gpu-node-2"), tmp / "gpu-node-2.log",
                  cwd=tmp / "gpu-node-2")
    run_cli([venv_program("prefect"), "flow-run", "retry", run["id"]], env, timeout=120)

    def completed():
        current = api.call(f"/flow_runs/{run['id']}")
        if current["state_type"] in ("FAILED", "CRASHED", "CANCELLED"):
            pytest.fail(f"retried run ended {current['state_name']}\n{diagnose()}")
        return current if current["state_type"] == "COMPLETED" else None

    done = wait_for(completed, 240, "the retried flow run to complete", diagnose)
    assert done["run_count"] == 2

    # Finished stages were reused: each ran once; the placed one failed, then ran.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(served["mlflow"])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    stage_runs = client.search_runs([experiment.experiment_id],
                                    "tags.`autocompress.step` != ''")
    statuses: dict[str, list[str]] = {}
    for r in stage_runs:
        statuses.setdefault(r.data.tags["autocompress.step"], []).append(r.info.status)
    assert sorted(statuses["teacher"]) == ["FINISHED"]
    assert sorted(statuses["loss"]) == ["FINISHED"]
    assert sorted(statuses["accelerated"]) == ["FAILED", "FAILED", "FINISHED"]
    task_states = {(t["name"].rsplit("-", 1)[0], t["state_name"])
                   for t in api.call("/task_runs/filter",
                                {"flow_runs": {"id": {"any_": [run["id"]]}}})}
    assert {("teacher", "Cached"), ("forward_probe", "Cached")} <= task_states

    # The result is registered; its lineage names the flow run and the event.
    version = client.get_model_version(RESULT_NAME, "1")
    assert version.tags["lineage.trigger_event"] == event_id
    assert version.tags["lineage.flow_run_id"] == run["id"]
    assert version.tags["lineage.teacher"] == f"models:/{TEACHER_NAME}/1"
    parent = client.get_run(version.run_id)
    assert parent.data.tags["autocompress.trigger_event"] == event_id

    # 5. Placed steps ran in another worker's process; nothing local was shared.
    stage_runs = [r for r in api.call("/flow_runs/filter", {})
                  if r["name"] == "accelerated@accelerator"]
    assert sorted(r["state_type"] for r in stage_runs) == ["COMPLETED", "FAILED"]
    assert {r["work_pool_name"] for r in stage_runs} == {"accelerator"}
    assert done["infrastructure_pid"] not in {r["infrastructure_pid"] for r in stage_runs}
    cpu_home = served["home"] / "workers" / "cpu"
    gpu_home = tmp / "gpu-node-2"
    assert sorted(p.name for p in (cpu_home / "work").iterdir()) == ["forward_probe", "register",
                                                                    "teacher"]
    assert sorted(p.name for p in (gpu_home / "work").iterdir()) == ["forward_probe"]
    assert not (cpu_home / "work" / "forward_probe").samefile(gpu_home / "work" / "forward_probe")
    cpu_keys = {p.name for p in (cpu_home / "work" / "forward_probe").iterdir()}
    gpu_keys = {p.name for p in (gpu_home / "work" / "forward_probe").iterdir()}
    assert cpu_keys.isdisjoint(gpu_keys)  # `loss` ran on cpu, `accelerated` on gpu-node-2
    for worker_home in (cpu_home, gpu_home):
        assert not (worker_home / "artifacts").exists()
        assert not (worker_home / "prefect-results").exists()
    keys = [o["Key"] for o in served["s3"]["client"].list_objects_v2(
        Bucket=served["s3"]["bucket"]).get("Contents", [])]
    assert any(k.startswith("ac/probe/") and k.endswith(".manifest.json") for k in keys)
    assert any(k.startswith("ac/prefect-results/") for k in keys)

    # 6. The UIs: the MLflow model page lists the lineage; screenshots of both UIs.
    assert CHROMIUM, "headless Chromium is missing: `make test` installs it (apt: chromium)"
    page = f"{served['mlflow']}/#/models/{RESULT_NAME}/versions/1"
    dom = chromium(page, tmp)
    assert RESULT_NAME in dom and "lineage.trigger_event" in dom and event_id in dom
    if os.environ.get("AUTOCOMPRESS_SCREENSHOTS"):  # the README's images (two renders more)
        shots = Path(os.environ["AUTOCOMPRESS_SCREENSHOTS"])
        shots.mkdir(parents=True, exist_ok=True)
        graph = shots / "prefect-flow-run-graph.png"
        chromium(f"{served['prefect']}/runs/flow-run/{run['id']}", tmp, screenshot=graph)
        model_page = shots / "mlflow-model-lineage.png"
        chromium(page, tmp, screenshot=model_page)
        assert graph.stat().st_size > 20_000 and model_page.stat().st_size > 20_000

    # Ctrl-C stops everything serve started: no process is left that runs from,
    # or was given, a directory of this test.
    workers.stop()
    serve = served["serve"]
    os.killpg(serve.pid, signal.SIGINT)
    assert serve.wait(timeout=60) == 0
    assert "stopped" in served["out"].read_text()
    for url in (served["prefect"] + "/api/health", served["mlflow"] + "/health"):
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)
    assert processes_mentioning(str(tmp)) == []


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose command line or environment contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if text.encode() in cmdline or text.encode() in environ:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


# ---------------------------------------------------------------- placement, in-process


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


# ---------------------------------------------------------------- no worker takes a placed step


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
