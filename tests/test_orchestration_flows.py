"""Flows under the Prefect test harness: resume, retries, S3 artifacts, the registry.

Real services only: Prefect's test server (one per session), MLflow on sqlite or
as a real ``mlflow server`` on 127.0.0.1, moto's S3 server on 127.0.0.1. The
stages are small but real: a tiny random Llama saved with ``save_pretrained``,
its parameter count and loss on fixed tokens, a checkpointed loop.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Telemetry off and a private PREFECT_HOME before Prefect is imported.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-home-"))

import pytest  # noqa: E402
import torch  # noqa: E402
from prefect import flow  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from autocompress.artifacts import ArtifactRef, Store  # noqa: E402
from autocompress.serving import free_port  # noqa: E402
from autocompress.tracking import Lineage, get_tracker  # noqa: E402
from flows.common import (  # noqa: E402
    FlowReport,
    Step,
    Steps,
    finish_report,
    new_report,
    run_steps,
    tracked_flow,
)
from tasks.data import prepare_corpus  # noqa: E402
from tasks.distill import distill_model  # noqa: E402
from tasks.prune import prune_model  # noqa: E402
from tasks.registry import register_model  # noqa: E402
from tasks.stage import StageContext, reset_faults, stage  # noqa: E402
from tasks.teacher import publish_teacher  # noqa: E402

CALLS: dict[str, int] = {}
RESUMED_AT: list[int] = []
FAIL_LATE_ONCE = {"armed": False}


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


# ---------------------------------------------------------------- small real stages


@stage("tiny_teacher", retry_delay_seconds=0)
def tiny_teacher(ctx: StageContext, seed: int) -> ArtifactRef:
    """A tiny random Llama, saved the way a real teacher is."""
    from autocompress.modeling.tiny import tiny_model

    _count("tiny_teacher")
    model = tiny_model("llama", seed=seed)
    out = ctx.scratch() / "model"
    model.save_pretrained(out)
    params = float(sum(p.numel() for p in model.parameters()))
    return ctx.publish(out, "teacher", name="model", metrics={"params": params})


@stage("loss_report", retry_delay_seconds=0)
def loss_report(ctx: StageContext, model: ArtifactRef) -> ArtifactRef:
    """Parameter count and next-token loss on fixed random tokens."""
    from transformers import AutoModelForCausalLM

    _count("loss_report")
    lm = AutoModelForCausalLM.from_pretrained(ctx.fetch(model))
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, lm.config.vocab_size, (2, 16), generator=generator)
    with torch.no_grad():
        loss = float(lm(input_ids=tokens, labels=tokens).loss)
    ctx.log_metrics({"loss": loss})
    return ctx.publish_json("loss.json", {"loss": loss}, metrics={"loss": loss})


@stage("late", retries=0)
def late(ctx: StageContext, model: ArtifactRef, report: ArtifactRef, steps: int = 4) -> ArtifactRef:
    """A checkpointed loop: resumes from ``checkpoint_dir`` after a failure."""
    _count("late")
    progress = ctx.checkpoint_dir() / "progress.json"
    start = json.loads(progress.read_text())["step"] if progress.exists() else 0
    RESUMED_AT.append(start)
    for step in range(start, steps):
        progress.write_text(json.dumps({"step": step + 1}))
        if step == 1 and FAIL_LATE_ONCE["armed"]:
            FAIL_LATE_ONCE["armed"] = False
            raise RuntimeError("injected fault in the middle of the late stage")
    return ctx.publish_json("late.json", {"steps": steps, "report": report.sha256})


@stage("flaky", retries=2, retry_delay_seconds=0)
def flaky(ctx: StageContext, model: ArtifactRef) -> ArtifactRef:
    _count("flaky")
    return ctx.publish_json("flaky.json", {"model": model.sha256})


@flow(name="orchestration-demo")
def demo_flow(seed: int = 0, experiment: str = "test", with_flaky: bool = False,
              register_as: str | None = None) -> FlowReport:
    """A flow written as the compress flow is: plain calls of stage tasks through ``Steps``."""
    started = time.perf_counter()
    with tracked_flow("orchestration-demo", {"seed": seed}, experiment) as run:
        report = new_report("orchestration-demo", run)
        step = Steps(run, report)
        teacher = step("teacher", tiny_teacher, seed=seed)
        losses = step("report", loss_report, model=teacher)
        step("late", late, model=teacher, report=losses)
        if with_flaky:
            step("flaky", flaky, model=teacher)
        if register_as:
            lineage = Lineage(
                teacher=f"tiny-llama-seed{seed}", teacher_sha256=teacher.sha256,
                scores=dict(losses.metrics), flow_run_id=run.flow_run_id,
                artifacts={k: step.outputs[k] for k in ("teacher", "report", "late")},
            )
            step("registered", register_model, name=register_as, model=teacher, lineage=lineage)
        report.outputs = dict(step.outputs)
        return finish_report(report, run, started)


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def env(tmp_path, monkeypatch, prefect_server, mlflow_db_template):
    """A fresh AutoCompress home, MLflow store and fault/counter state per test."""
    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_db_template, db)
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    for var in ("AUTOCOMPRESS_STORE", "AUTOCOMPRESS_RESULTS", "AUTOCOMPRESS_FAULTS",
                "AUTOCOMPRESS_MLFLOW_ARTIFACTS"):
        monkeypatch.delenv(var, raising=False)
    reset_faults()
    CALLS.clear()
    RESUMED_AT.clear()
    FAIL_LATE_ONCE["armed"] = False
    torch.set_num_threads(1)
    return tmp_path


def _states(report: FlowReport) -> dict[str, str]:
    return {s.name: s.state for s in report.steps}


def _stage_runs(experiment: str, stage_name: str):
    tracker = get_tracker(experiment)
    return tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`autocompress.stage` = '{stage_name}'")


# ---------------------------------------------------------------- tests


@pytest.mark.slow
def test_resume_reuses_finished_stages_and_restarts_from_checkpoint(env):
    FAIL_LATE_ONCE["armed"] = True
    with pytest.raises(RuntimeError, match="injected fault"):
        demo_flow(seed=0)
    assert CALLS == {"tiny_teacher": 1, "loss_report": 1, "late": 1}

    report = demo_flow(seed=0)
    assert _states(report) == {"teacher": "Cached", "report": "Cached", "late": "Completed"}
    assert CALLS == {"tiny_teacher": 1, "loss_report": 1, "late": 2}
    assert RESUMED_AT == [0, 2]  # the second attempt continued from its checkpoint
    assert all(Store.for_ref(r).verify(r) == "ok" for r in report.outputs.values())

    # Other inputs are other cache keys; a third identical run is all cache hits.
    assert _states(demo_flow(seed=1))["teacher"] == "Completed"
    assert set(_states(demo_flow(seed=0)).values()) == {"Cached"}
    assert CALLS["tiny_teacher"] == 2
    # The failed and the successful attempt of `late` each have an MLflow child run.
    statuses = sorted(r.info.status for r in _stage_runs("test", "late"))
    assert statuses == ["FAILED", "FINISHED", "FINISHED"]


def test_transient_fault_is_retried_and_the_run_succeeds(env, monkeypatch):
    monkeypatch.setenv("AUTOCOMPRESS_FAULTS", "flaky:1")
    report = demo_flow(seed=0, with_flaky=True)
    assert _states(report)["flaky"] == "Completed"
    assert CALLS["flaky"] == 1  # the fault hits before the body on attempt 1
    runs = _stage_runs("test", "flaky")
    attempts = {r.data.tags["autocompress.attempt"]: r.info.status for r in runs}
    assert attempts == {"1": "FAILED", "2": "FINISHED"}
    parent = get_tracker("test").client.get_run(runs[0].data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["artifact.flaky.sha256"] == report.outputs["flaky"].sha256
    assert report.stage_work_s > 0 and report.wall_s >= report.stage_work_s


KEYED_STAGE = """
from tasks.stage import RunInfo, StageContext, stage

CALLS = []


@stage("keyed", retries=0)
def keyed(ctx: StageContext, x: int) -> dict:
    from keypkg.helper import double

    CALLS.append(x)
    return {"y": double(x)}


def run_keyed(flow):
    return flow(name="keyed-flow")(
        lambda: keyed(x=3, run=RunInfo(track=False), return_state=True).name)()
"""


def test_a_stage_reruns_when_code_it_imports_changes(env, tmp_path, monkeypatch):
    """The code part of a cache key follows what a stage really imports: editing a
    module two imports away (stage -> helper -> deep) is a miss, and the body runs
    again; the same code, even with its files rewritten, is a hit."""
    import importlib

    pkg = tmp_path / "src" / "keypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stages.py").write_text(KEYED_STAGE)
    (pkg / "helper.py").write_text("def double(x):\n    from keypkg.deep import FACTOR\n\n"
                                   "    return FACTOR * x\n")
    (pkg / "deep.py").write_text("FACTOR = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))

    def run() -> tuple[str, list[int]]:
        for name in [m for m in sys.modules if m.split(".")[0] == "keypkg"]:
            del sys.modules[name]  # a fresh import, as a new process would see it
        stages = importlib.import_module("keypkg.stages")
        return stages.run_keyed(flow), stages.CALLS

    assert run() == ("Completed", [3])
    (pkg / "deep.py").write_text("FACTOR = 2\n")  # rewritten, not changed
    assert run() == ("Cached", [])
    (pkg / "deep.py").write_text("FACTOR = 3\n")
    assert run() == ("Completed", [3])
    assert run() == ("Cached", [])


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_s3_artifacts_results_and_mlflow_artifact_uris(env, moto_endpoint, monkeypatch):
    import boto3

    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": moto_endpoint,
                       "MLFLOW_S3_ENDPOINT_URL": moto_endpoint}.items():
        monkeypatch.setenv(var, value)
    bucket = f"ac{free_port()}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=bucket)
    monkeypatch.setenv("AUTOCOMPRESS_STORE", f"s3://{bucket}/ac")

    report = demo_flow(seed=3, experiment="s3-exp")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    for name in ("teacher", "report", "late"):
        ref = report.outputs[name]
        assert ref.uri.startswith(f"s3://{bucket}/ac/"), ref.uri
        assert Store.for_ref(ref).verify(ref) == "ok"
        assert ref.uri.removeprefix(f"s3://{bucket}/") + ".manifest.json" in keys
    assert any(k.startswith("ac/prefect-results/") for k in keys)  # Prefect's results
    assert not (env / "home" / "prefect-results").exists()

    tracker = get_tracker("s3-exp")
    assert tracker.client.get_experiment(tracker.experiment_id).artifact_location == \
        f"s3://{bucket}/ac/mlflow/s3-exp"
    parent = tracker.client.get_run(report.mlflow_run_id)
    assert parent.info.artifact_uri.startswith(f"s3://{bucket}/ac/mlflow/s3-exp/")
    ref_key = parent.info.artifact_uri.removeprefix(f"s3://{bucket}/") + "/refs/teacher.json"
    logged = json.loads(s3.get_object(Bucket=bucket, Key=ref_key)["Body"].read())
    assert logged["sha256"] == report.outputs["teacher"].sha256

    # A new run finds every result in S3 (nothing is cached locally).
    again = demo_flow(seed=3, experiment="s3-exp")
    assert set(_states(again).values()) == {"Cached"}
    assert again.outputs["late"] == report.outputs["late"]


@pytest.fixture
def mlflow_server(env, mlflow_db_template):
    from autocompress.serving import Stack, start_mlflow_server, wait_http

    db = env / "server.db"
    shutil.copy(mlflow_db_template, db)
    stack = Stack()
    try:
        server = start_mlflow_server(stack, free_port(), f"sqlite:///{db}",
                                     str(env / "mlartifacts"), dict(os.environ),
                                     env / "mlflow-server.log")
        wait_http(server, "/health", timeout=300)  # slow on a loaded 2-core machine
        yield server.url
    finally:
        stack.stop()  # the server's process group: it and its uvicorn worker


def test_registry_lineage_through_an_mlflow_server(env, mlflow_server, monkeypatch):
    from autocompress.cli import app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    report = demo_flow(seed=5, experiment="registry-exp", register_as="tiny-demo")
    registered = report.outputs["registered"]
    assert (registered.name, registered.version) == ("tiny-demo", 1)
    assert registered.tracking_uri == mlflow_server

    runner = CliRunner()
    result = runner.invoke(app, ["lineage", "--model", "tiny-demo@1", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["lineage"]["teacher_sha256"] == report.outputs["teacher"].sha256
    assert data["lineage"]["flow_run_id"] == report.flow_run_id
    assert [link["stage"] for link in data["chain"]] == ["teacher", "report", "late"]
    assert {link["status"] for link in data["chain"]} == {"ok"}
    assert data["lineage"]["scores"]["loss"] == report.outputs["report"].metrics["loss"]
    pretty = runner.invoke(app, ["lineage", "--model", "tiny-demo"])
    assert pretty.exit_code == 0 and "tiny-demo@1" in pretty.output

    # The registered version is a LoggedModel holding MLmodel + lineage.json.
    client = get_tracker("registry-exp").client
    version = client.get_model_version("tiny-demo", "1")
    model_id = data["model_id"]
    assert model_id and version.run_id == report.mlflow_run_id
    assert client.get_logged_model(model_id).tags["lineage.teacher"] == "tiny-llama-seed5"
    files = {f.path for f in client.list_logged_model_artifacts(model_id)}
    assert {"MLmodel", "lineage.json"} <= files

    # Tamper with the teacher's weights: lineage notices and exits 1.
    teacher_dir = report.outputs["teacher"].local_path()
    weights = next(teacher_dir.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")
    bad = runner.invoke(app, ["lineage", "--model", "tiny-demo@1"])
    assert bad.exit_code == 1 and "mismatch" in bad.output


# ---------------------------------------------------------------- a crash during distillation


@stage("given_file", retry_delay_seconds=0)
def given_file(ctx: StageContext, path: Path, kind: str) -> ArtifactRef:
    """Publish a file made by the test (the arch and importance a search would pick)."""
    return ctx.publish(path, kind)


COMPRESS_TAIL = [
    Step("teacher", publish_teacher, teacher_dir="teacher_dir"),
    Step("corpus", prepare_corpus, corpus_dir="corpus_dir"),
    Step("arch", given_file, path="arch_path", kind="arch_kind"),
    Step("importance", given_file, path="importance_path", kind="importance_kind"),
    Step("pruned", prune_model, teacher="teacher", arch="arch", importance="importance"),
    Step("distilled", distill_model, teacher="teacher", student="pruned", corpus="corpus",
         options="distill_options"),
]


@flow(name="compress-tail")
def compress_tail(inputs: dict, experiment: str = "fault") -> FlowReport:
    """The compress flow from the teacher to distillation, with its real stages."""
    started = time.perf_counter()
    with tracked_flow("compress-tail", {}, experiment, track=False) as run:
        report = new_report("compress-tail", run)
        values = {**inputs, "arch_kind": "archspec", "importance_kind": "importance"}
        run_steps(COMPRESS_TAIL, values, run, report)
        report.outputs = {"distilled": values["distilled"]}
        return finish_report(report, run, started)


def test_a_crash_during_distillation_resumes_to_the_same_model(env, tiny_corpus, tiny_tokenizer,
                                                               monkeypatch):
    import autocompress.training as training
    from autocompress.arch import ArchSpec
    from autocompress.importance import random_importance
    from autocompress.modeling import arch_spec_of
    from autocompress.modeling.tiny import tiny_model

    teacher = tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=32, num_layers=2,
                         num_heads=4, gqa_ratio=2, intermediate_size=64, head_dim=8, seed=1)
    teacher.save_pretrained(env / "teacher")
    tiny_tokenizer.save_pretrained(env / "teacher")
    spec = arch_spec_of(teacher).to_dict()
    spec["layers"][1]["ffn"]["intermediate_size"] = 32
    ArchSpec.model_validate(spec).to_json(env / "arch.json")
    random_importance(teacher, seed=0).save(env / "importance.safetensors")
    inputs = {"teacher_dir": env / "teacher", "corpus_dir": tiny_corpus,
              "arch_path": env / "arch.json", "importance_path": env / "importance.safetensors",
              "distill_options": {"tokens": 4 * 32 * 8, "seq_len": 32, "batch_size": 4,
                                  "ckpt_every": 2, "eval_batches": 1, "warmup_steps": 2,
                                  # fp32 in both homes: the bf16 choice is timed once per
                                  # home, and two homes could time it differently.
                                  "bf16": False}}

    def weights(report):
        from safetensors.torch import load_file

        return load_file(report.outputs["distilled"].local_path() / "model.safetensors")

    # The reference: one uninterrupted run in another home (nothing cached).
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(env / "home-reference"))
    reference = compress_tail(inputs, experiment="reference")
    assert set(_states(reference).values()) == {"Completed"}
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(env / "home"))

    # The process "dies" right after distillation's checkpoint at step 4 of 8.
    real_save = training.save_checkpoint

    def save_then_die(ckpt_dir, model, optimizer, state):
        real_save(ckpt_dir, model, optimizer, state)
        if state.step == 4:
            raise KeyboardInterrupt("killed during distillation")

    monkeypatch.setattr(training, "save_checkpoint", save_then_die)
    with pytest.raises(BaseException, match="killed during distillation"):
        compress_tail(inputs)
    saved_steps = []

    def save_and_count(ckpt_dir, model, optimizer, state):
        saved_steps.append(state.step)
        real_save(ckpt_dir, model, optimizer, state)

    monkeypatch.setattr(training, "save_checkpoint", save_and_count)
    resumed = compress_tail(inputs)
    states = _states(resumed)
    assert states.pop("distilled") == "Completed"
    assert set(states.values()) == {"Cached"}  # finished stages are reused
    assert resumed.outputs["distilled"].meta["resumed"] is True
    assert saved_steps == [6, 8]  # it went on from step 4, it did not start over
    got, want = weights(resumed), weights(reference)
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in want.items()}
    for name, tensor in want.items():  # the same model as the uninterrupted run, bit for bit
        assert torch.equal(got[name], tensor), name


# ---------------------------------------------------------------- the compress flow's graph


class RecordedSteps:
    """Stands in for ``flows.common.Steps`` in the compress flow: records each step's name and
    inputs and returns a reference (the resolved limits for ``limits``), running nothing."""

    calls: list[tuple[str, str, dict]] = []

    def __init__(self, run, report, placement=None):
        self.outputs: dict = {}

    def __call__(self, name, stage, /, **inputs):
        from autocompress.limits import Limits

        self.calls.append((name, stage.name, inputs))
        result = (Limits(max_tpot_ms=4.0) if name == "limits" else
                  ArtifactRef(uri=f"file:///x/{name}", sha256="0" * 64, kind="x",
                              metrics={"tpot_ms": 9.0, "ok": 1.0}))
        self.outputs[name] = result
        return result


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """The compress flow's body with its steps recorded, not run: ``recorded(**params)``
    returns the calls as (step, stage, inputs)."""
    import flows.compress as compress_flow

    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(compress_flow, "Steps", RecordedSteps)

    def run(**params):
        RecordedSteps.calls = []
        try:
            compress_flow.compress.fn(**{"limits": {"max_tpot_ms": 4.0}, "track": False,
                                         **params})
        finally:
            calls = list(RecordedSteps.calls)
        return calls

    return run


def _names(calls) -> list[str]:
    return [name for name, _stage, _inputs in calls]


def test_the_compress_flow_runs_the_recipes_steps_in_order(recorded):
    """The flow's body is the recipe (``autocompress.recipe.STEPS``), and every step name it
    uses is one placement may name."""
    from autocompress.recipe import STEPS
    from flows.compress import STEP_NAMES

    calls = recorded(register_as="m")
    assert _names(calls) == list(STEPS)
    calls += recorded(baseline=True, target="cpu-local/llama.cpp/q8_0")
    assert set(_names(calls)) == set(STEP_NAMES)


def test_the_compress_flow_times_the_teacher_first_and_stops_there_on_another_host(recorded):
    """The teacher is verified right after the limits are resolved, before importance and the
    search, so a run under limits carried from another host stops before any real work."""
    from autocompress.errors import AutoCompressError
    from autocompress.limits import HOST_REFUSAL

    elsewhere = {"from": "earlier.json", "teacher_measured": {"tpot_ms": 6.0}}
    with pytest.raises(AutoCompressError, match=HOST_REFUSAL):
        recorded(limits_origin=elsewhere)
    assert _names(RecordedSteps.calls)[-1] == "teacher_verification"
    same_host = {"from": "earlier.json", "teacher_measured": {"tpot_ms": 8.5}}
    assert _names(recorded(limits_origin=same_host, register_as=None))[-1] == "verification"


def test_each_method_finds_the_architecture_with_its_own_stage(recorded):
    """autocompress: the search behind the gate; greedy/random: the ablation stage with its
    method, behind the gate; minitron: the baseline's pick (no gate input)."""
    from autocompress.defaults import METHODS
    from autocompress.errors import AutoCompressError

    arch = {m: next(c for c in recorded(method=m, register_as=None) if c[0] == "arch")
            for m in METHODS}
    assert arch["autocompress"][1] == "search" and "validation" in arch["autocompress"][2]
    assert arch["greedy"][1] == arch["random"][1] == "ablation"
    assert arch["random"][2]["method"] == "random" and "validation" in arch["greedy"][2]
    assert arch["mip"][2]["method"] == "mip" and arch["minitron-scored"][1] == "ablation"
    assert arch["minitron"][1] == "minitron" and "validation" not in arch["minitron"][2]
    with pytest.raises(AutoCompressError, match="unknown method 'bogus'"):
        recorded(method="bogus")
    assert RecordedSteps.calls == []  # refused before any step


def test_an_engine_target_exports_verifies_and_registers_the_engine_file(recorded):
    """An engine target puts the GGUF export between distillation and verification, and the
    registered model (and its lineage) is that file."""
    calls = recorded(target="cpu-local/llama.cpp/q8_0", register_as="m")
    names = _names(calls)
    assert names.index("model") < names.index("engine_model") < names.index("verification")
    inputs = {name: given for name, _stage, given in calls}
    engine_file = "file:///x/engine_model"
    assert inputs["verification"]["model"].uri == engine_file
    assert inputs["registered"]["model"].uri == engine_file
    chain = list(inputs["registered"]["lineage"].artifacts)
    assert chain.index("engine_model") == chain.index("verification") - 1
    served = recorded(target="cpu-local/vllm/bf16", register_as="m")  # a nemotron-nas export
    assert _names(served).index("engine_model") == _names(served).index("verification") - 1
    assert "engine_model" not in _names(recorded(target="h100-sxm/vllm/bf16", register_as="m"))
    plain = recorded(register_as="m")
    assert "engine_model" not in _names(plain)
    assert {name: given for name, _s, given in plain}["registered"]["model"].uri == \
        "file:///x/model"
