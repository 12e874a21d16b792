"""Artifacts, stores, cache keys and lineage tags — no Prefect server needed.

The S3 tests talk to a real S3-compatible server (moto's) on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

from autocompress.artifacts import (
    MANIFEST_SUFFIX,
    ArtifactRef,
    LocalStore,
    S3Store,
    Store,
    sha256_path,
)
from autocompress.errors import AutoCompressError
from autocompress.tracking import Lineage


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- hashing


def test_dir_hash_depends_on_names_and_content_not_creation_order(tmp_path):
    a = _tree(tmp_path / "a", {"x.json": "1", "sub/y.bin": "2"})
    b = _tree(tmp_path / "b", {"sub/y.bin": "2", "x.json": "1"})
    assert sha256_path(a) == sha256_path(b)
    (b / "x.json").write_text("changed")
    assert sha256_path(a) != sha256_path(b)
    c = _tree(tmp_path / "c", {"x.json": "1", "sub/z.bin": "2"})  # same bytes, other name
    assert sha256_path(a) != sha256_path(c)
    # A file hashes as its bytes (sha256sum-compatible).
    import hashlib

    assert sha256_path(a / "x.json") == hashlib.sha256(b"1").hexdigest()


def test_hash_of_missing_path_is_a_user_error(tmp_path):
    with pytest.raises(AutoCompressError):
        sha256_path(tmp_path / "nope")


# ---------------------------------------------------------------- local store


def test_local_publish_is_content_addressed_atomic_and_verifiable(tmp_path):
    store = LocalStore(tmp_path / "store")
    src = _tree(tmp_path / "model", {"config.json": "{}", "weights.bin": "w" * 1000})
    ref = store.publish(src, "model", metrics={"params": 3.0})
    path = ref.local_path()
    assert path.is_dir() and ref.sha256[:16] in ref.uri
    assert ref.sha256 == sha256_path(src) and ref.size_bytes == 1002
    assert store.verify(ref) == "ok"
    # Publishing the same content again returns the same reference, no copy.
    again = store.publish(src, "model", metrics={"params": 3.0})
    assert again == ref
    # No temp leftovers next to the artifact.
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]
    # Tampering is detected; so is a missing manifest (an interrupted publish).
    (path / "weights.bin").write_text("tampered")
    assert store.verify(ref) == "mismatch"
    with pytest.raises(AutoCompressError, match="mismatch"):
        store.fetch(ref)
    path.with_name(path.name + MANIFEST_SUFFIX).unlink()
    assert store.verify(ref) == "incomplete"


def test_local_publish_move_and_fetch_copy(tmp_path):
    store = Store.from_uri(tmp_path / "store")
    src = tmp_path / "report.json"
    src.write_text(json.dumps({"a": 1}))
    ref = store.publish(src, "report", move=True)
    assert not src.exists()
    copy = store.fetch(ref, tmp_path / "copy.json")
    assert json.loads(copy.read_text()) == {"a": 1}
    assert ArtifactRef.model_validate_json(ref.model_dump_json()) == ref


def test_default_store_is_under_autocompress_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AUTOCOMPRESS_STORE", raising=False)
    store = Store.from_uri()
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "home" / "artifacts").resolve()
    with pytest.raises(AutoCompressError):
        Store.from_uri("ftp://host/x")


# ---------------------------------------------------------------- S3 store


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    import boto3

    bucket = f"b{free_port()}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    return bucket


def test_s3_publish_writes_manifest_last_and_fetch_checks_hash(tmp_path, s3_env):
    store = Store.from_uri(f"s3://{s3_env}/runs")
    assert isinstance(store, S3Store)
    src = _tree(tmp_path / "model", {"config.json": "{}", "sub/w.bin": "weights"})
    ref = store.publish(src, "model")
    assert ref.uri.startswith(f"s3://{s3_env}/runs/model/")
    keys = store.list_keys()
    key = ref.uri.removeprefix(f"s3://{s3_env}/")
    assert sorted(keys) == sorted([f"{key}/config.json", f"{key}/sub/w.bin",
                                   key + MANIFEST_SUFFIX])
    assert store.verify(ref) == "ok"
    local = store.fetch(ref, tmp_path / "fetched")
    assert sha256_path(local) == ref.sha256
    # Overwrite an object behind the store's back: the hash check catches it.
    store.client.put_object(Bucket=s3_env, Key=f"{key}/sub/w.bin", Body=b"evil")
    assert store.verify(ref) == "mismatch"
    with pytest.raises(AutoCompressError, match="hash check"):
        store.fetch(ref, tmp_path / "again")
    assert not (tmp_path / "again").exists()
    # Without a manifest (a half-finished upload) the artifact is not trusted.
    store.client.delete_object(Bucket=s3_env, Key=key + MANIFEST_SUFFIX)
    assert store.verify(ref) == "missing"
    with pytest.raises(AutoCompressError, match="missing or incompletely uploaded"):
        store.fetch(ref, tmp_path / "third")


def test_s3_manifest_entries_outside_the_folder_are_refused_before_writing(tmp_path, s3_env):
    store = Store.from_uri(f"s3://{s3_env}/runs")
    ref = store.publish(_tree(tmp_path / "model", {"config.json": "{}"}), "model")
    key = ref.uri.removeprefix(f"s3://{s3_env}/")
    manifest = json.loads(store.client.get_object(Bucket=s3_env,
                                                  Key=key + MANIFEST_SUFFIX)["Body"].read())
    victim = tmp_path / "victim"
    dest = tmp_path / "deep" / "er" / "fetched"
    for evil in ("../../victim", str(victim), "a/../../victim", "./x", "a//b"):
        store.client.put_object(Bucket=s3_env, Key=f"{key}/{evil}", Body=b"owned")
        tampered = {**manifest, "files": {**manifest["files"], evil: "0" * 64}}
        store.client.put_object(Bucket=s3_env, Key=key + MANIFEST_SUFFIX,
                                Body=json.dumps(tampered).encode())
        with pytest.raises(AutoCompressError, match="outside its folder"):
            store.fetch(ref, dest)
        assert not victim.exists() and not dest.parent.exists()


def test_a_file_named_like_a_manifest_inside_a_dir_changes_its_hash(tmp_path):
    store = LocalStore(tmp_path / "store")
    ref = store.publish(_tree(tmp_path / "model", {"config.json": "{}"}), "model")
    assert store.verify(ref) == "ok"
    (ref.local_path() / "extra.manifest.json").write_text("{}")
    assert store.verify(ref) == "mismatch"


def test_s3_errors_are_one_line_with_a_hint(tmp_path, s3_env, monkeypatch):
    src = tmp_path / "f.txt"
    src.write_text("x")
    with pytest.raises(AutoCompressError) as err:
        Store.from_uri(f"s3://no-such-bucket-{free_port()}/x").publish(src, "report")
    assert "NoSuchBucket" in err.value.message and err.value.hint
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(AutoCompressError, match="no AWS credentials") as err:
        Store.from_uri(f"s3://{s3_env}/x").publish(src, "report")
    assert "AWS_ACCESS_KEY_ID" in err.value.hint


# ---------------------------------------------------------------- lineage tags


def test_lineage_tags_round_trip():
    refs = {
        "teacher": ArtifactRef(uri="file:///t", sha256="a" * 64, kind="teacher"),
        "model": ArtifactRef(uri="s3://b/m", sha256="b" * 64, kind="model"),
    }
    lineage = Lineage(teacher="default", teacher_sha256="a" * 64, data_fingerprint="f" * 64,
                      costmodel_version="c" * 64, costmodel_error={"tpot_ms.mape": 0.07},
                      target="cpu-local/hf-eager/fp32", workload="local-coding-cpu",
                      limits={"max_tpot_ms": 3.0}, scores={"mc_mean": 0.41},
                      measured={"tpot_ms": 2.9}, flow_run_id="fr", artifacts=refs)
    tags = lineage.to_tags()
    assert all(isinstance(v, str) and len(v) <= 5000 for v in tags.values())
    assert tags["lineage.chain"] == "teacher,model"
    back = Lineage.from_tags(tags)
    assert back.model_dump() == lineage.model_dump()
    with pytest.raises(AutoCompressError):
        Lineage.from_tags({"foo": "bar"})


# ---------------------------------------------------------------- cache keys


def _stage_body(ctx, model, config):  # the "source" of a stage for the policy below
    return model


def test_cache_key_follows_content_and_code_not_uris_or_run(tmp_path):
    import torch

    from tasks.stage import RunInfo, StageCachePolicy

    policy = StageCachePolicy(stage_name="prune", stage_fn=_stage_body)
    a = ArtifactRef(uri="file:///one/place", sha256="a" * 64, kind="model")
    moved = a.model_copy(update={"uri": "s3://bucket/elsewhere"})

    def key(model, config=None, run=None, p=policy):
        return p.compute_key(None, {"model": model, "config": config or {"k": 1},
                                    "run": run or RunInfo()}, {})

    assert key(a) == key(moved, run=RunInfo(parent_run_id="other"))  # same content
    assert key(a) != key(a.model_copy(update={"sha256": "b" * 64}))
    assert key(a) != key(a, config={"k": 2})
    assert key(a).startswith("prune-")
    bumped = StageCachePolicy(stage_name="prune", stage_fn=_stage_body, version="2")
    assert key(a) != key(a, p=bumped)
    # A directory input counts by its content.
    d = _tree(tmp_path / "teacher", {"config.json": "{}"})
    before = key(d)
    (d / "config.json").write_text('{"changed": 1}')
    assert key(d) != before
    # Models and tensors are refused: publish them and pass the reference.
    with pytest.raises(TypeError, match="ArtifactRef"):
        key(torch.zeros(2))


def test_working_copy_keeps_published_inputs_immutable(tmp_path, monkeypatch):
    from tasks.stage import RunInfo, StageContext

    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AUTOCOMPRESS_STORE", raising=False)
    ctx = StageContext(name="x", run=RunInfo(track=False), key="x-k", workdir=tmp_path / "w")
    corpus = ctx.publish(_tree(tmp_path / "corpus", {"manifest.json": "{}"}), "corpus")
    copy = ctx.working_copy(corpus)
    (copy / "tokens").mkdir()  # what a tokenizer cache would do
    (copy / "tokens" / "cache.bin").write_text("cached")
    assert Store.for_ref(corpus).verify(corpus) == "ok"
    assert ctx.working_copy(corpus) == copy and (copy / "tokens" / "cache.bin").exists()
    assert ctx.fetch(corpus) == corpus.local_path()


def test_register_on_the_embedded_store_without_a_tracking_uri(tmp_path, monkeypatch):
    # MLflow's registry resolves models:/ sources through the global tracking URI;
    # with none set it would look in ./mlflow.db. Registration must not depend on it.
    from autocompress.tracking import Tracker, lineage

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    tracker = Tracker("units", uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    model = LocalStore(tmp_path / "store").publish(
        _tree(tmp_path / "m", {"config.json": "{}", "w.bin": "w"}), "model")
    info = Lineage(teacher="t", teacher_sha256="a" * 64, artifacts={"model": model})
    run_id = tracker.start_run("parent")
    assert tracker.register_model("units-model", model, info, run_id=run_id) == 1
    assert tracker.register_model("units-model", model, info, run_id=run_id) == 2
    report = lineage("units-model", tracker=tracker)
    assert report.version == 2 and report.ok and report.model_id
    assert not (tmp_path / "mlflow.db").exists()


def test_models_uri_resolves_to_the_registered_model_or_the_file_an_engine_serves(
        tmp_path, monkeypatch):
    from autocompress.model_source import resolve_model_dir
    from autocompress.tracking import Tracker, registered_artifact

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    store = LocalStore(tmp_path / "store")
    model = store.publish(_tree(tmp_path / "m", {"config.json": "{}", "w.bin": "w"}), "model")
    gguf = tmp_path / "model-q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    served = store.publish(gguf, "engine_model")
    tracker = Tracker("units", uri=uri)
    info = Lineage(teacher="t", teacher_sha256="a" * 64,
                   artifacts={"model": model, "engine_model": served})
    tracker.register_model("units-served", model, info, run_id=tracker.start_run("parent"))
    directory = resolve_model_dir("models:/units-served/1")
    assert (directory / "w.bin").read_text() == "w"
    assert registered_artifact("models:/units-served", ("engine_model", "model")
                               ).read_bytes() == b"GGUF"
    with pytest.raises(AutoCompressError, match="no teacher artifact"):
        registered_artifact("models:/units-served/1", ("teacher",))


def test_stage_code_follows_imports_including_the_ones_a_hand_list_missed():
    """The search stage's code reaches modules the search imports only indirectly
    (prune, verify, data: once missing from a hand-written list), lazy imports
    inside functions included; modules it never imports stay out."""
    from tasks.code_key import OUR_PACKAGES, code_files

    root = Path(__file__).resolve().parents[1]
    files = {str(p.relative_to(root)) for p in code_files("tasks.search", OUR_PACKAGES)}
    for needed in ("tasks/search.py", "autocompress/arch_search/run.py", "autocompress/prune.py",
                   "autocompress/verify.py", "autocompress/data/corpus.py",
                   "autocompress/costmodel/measure.py", "autocompress/hardware_specs.json"):
        assert needed in files
    # (distill.py is needed: the Minitron stage ranks its top-k after a short distillation;
    # evaluation's config too, since stage_config maps every stage to its config.) The search
    # reads a fitted cost model and never fits one.
    for unrelated in ("autocompress/costmodel/fit.py", "autocompress/commands/search.py",
                      "tasks/distill.py"):
        assert unrelated not in files


def test_stage_code_skips_string_constants_too_long_to_be_file_names(tmp_path):
    """A long sentence with a dot (a pydantic description) is not looked up as a data file:
    the lookup raised 'File name too long' and broke every stage's cache key."""
    from tasks.code_key import _data_files

    (tmp_path / "table.json").write_text("{}")
    sentence = "Time the pick on the target and re-aim. " * 10
    found = _data_files((sentence, "table.json"), tmp_path / "module.py", None)
    assert found == [tmp_path / "table.json"]


def test_lineage_of_a_quoted_name_says_why_s3_is_unreachable_once(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from autocompress.tracking import lineage

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    refs = {stage: ArtifactRef(uri=f"s3://bucket/{stage}/{'0' * 16}/x", sha256="0" * 64,
                               kind=stage) for stage in ("teacher", "model")}
    tags = Lineage(teacher="default", teacher_sha256="0" * 64, artifacts=refs).to_tags()
    client = MlflowClient(uri)
    for name in ("o'brien", "plain"):
        client.create_registered_model(name)
        client.create_model_version(name, source=str(tmp_path), tags=tags)

    class Tracker:  # lineage() needs only the client and the URI
        pass

    tracker = Tracker()
    tracker.client, tracker.uri = client, uri
    report = lineage("o'brien", tracker=tracker)
    assert report.name == "o'brien" and report.version == 1
    assert [link.status for link in report.chain] == ["unreachable", "unreachable"]
    assert len(report.problems) == 1 and "no AWS credentials" in report.problems[0]
    assert lineage("plain", tracker=tracker, check=False).version == 1
    with pytest.raises(AutoCompressError, match="both kinds of quote"):
        lineage("""o'"x""", tracker=tracker)
