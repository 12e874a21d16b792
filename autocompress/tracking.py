"""MLflow tracking: runs per flow and per stage, model registration, lineage.

Everything goes through an explicit ``MlflowClient`` and explicit run ids, never
MLflow's "active run": the active run is thread-local, so inside a Prefect task
(which runs in a worker thread) it is None, and re-entering a parent run then
leaving it would mark it FINISHED. Stage runs are children of the flow's run via
the ``mlflow.parentRunId`` tag, which is exactly what ``parent_run_id=`` does.

Where things go:

* Tracking: ``MLFLOW_TRACKING_URI`` if set (a server, ``http://...``), else the
  embedded default ``sqlite:///$AUTOCOMPRESS_HOME/mlflow.db``.
* Artifacts: each experiment gets an explicit ``artifact_location``:
  ``AUTOCOMPRESS_MLFLOW_ARTIFACTS`` if set, else ``<store>/mlflow`` when the
  artifact store (``AUTOCOMPRESS_STORE``) is S3, else
  ``$AUTOCOMPRESS_HOME/mlartifacts`` — except for a remote server, which decides
  itself (it usually proxies artifacts).
* Registry: the compressed model becomes an *external* LoggedModel (its weights
  stay at their ``ArtifactRef`` URI; MLflow keeps the MLmodel file, the lineage
  JSON and small metadata files) registered as a model version whose tags carry
  the lineage. ``lineage()`` reads those tags back and re-hashes each artifact.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from autocompress.artifacts import ArtifactRef, fetch, verify_with_cause
from autocompress.atomic import write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.lineage_view import description as lineage_description
from autocompress.lineage_view import key_figures
from autocompress.paths import PACKAGE_DIR, home

# mlflow is imported inside the functions that use it (each marked "lazy: mlflow"): it
# takes seconds to import, and every stage, the CLI and the library's registry lookups
# import this module whether or not they talk to MLflow.
DEFAULT_EXPERIMENT = "autocompress"
# MLflow limits: param values 6000 chars, tag values 8000 (model-version tags 5000).
_MAX_PARAM = 6000
_MAX_TAG = 5000
_GLOBAL_URI_LOCK = threading.Lock()
# Small files of a model directory worth keeping in the registry itself.
_SMALL_FILE_BYTES = 256 * 1024


# Registry names: what MLflow's stores all accept and what reads back unambiguously
# (no "/" of a path, no "@" of NAME@VERSION, no "." MLflow refuses in some stores).
_REGISTRY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


def check_registry_name(name: str, flag: str = "--register-as") -> str:
    """Refuse a registry name MLflow would reject (or that reads as NAME@VERSION), before
    any work: checked by the commands at their start, and again before registering."""
    if not _REGISTRY_NAME.match(name or ""):
        raise AutoCompressError(
            f"{flag} {name!r} is not a usable registry name",
            "use letters, digits, '-' and '_' (at most 100, starting with a letter or digit), "
            "e.g. my-model_v2")
    return name


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or the embedded sqlite store under AUTOCOMPRESS_HOME."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{home() / 'mlflow.db'}"


def default_artifact_location(experiment: str, uri: str | None = None) -> str | None:
    """Where an experiment's artifacts go (None = let a remote server decide)."""
    explicit = os.environ.get("AUTOCOMPRESS_MLFLOW_ARTIFACTS")
    if explicit:
        return f"{explicit.rstrip('/')}/{experiment}"
    store = os.environ.get("AUTOCOMPRESS_STORE", "")
    if store.startswith("s3://"):
        return f"{store.rstrip('/')}/mlflow/{experiment}"
    if (uri or tracking_uri()).startswith(("http://", "https://", "databricks")):
        return None
    return (home() / "mlartifacts" / experiment).as_uri()


@functools.cache
def code_version() -> str:
    """``<package version>+g<git sha>`` in a git checkout with commits, else a source hash.

    The source hash covers every ``.py`` file of the package, so two runs with
    the same code version ran the same library code. The package is found from
    this file and its version from the installed metadata, not by importing
    ``autocompress`` (which would tie this module to the whole API).
    """
    pkg = PACKAGE_DIR
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=pkg,
                             capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(pkg)], cwd=pkg,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if sha:
            return f"{_package_version()}+g{sha}{'.dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{_package_version()}+src.{source_hash(pkg)[:12]}"


def _package_version() -> str:
    try:
        return importlib.metadata.version("autocompress")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


def source_hash(*paths: Path) -> str:
    """sha256 over the ``.py`` files under ``paths`` (names + contents)."""
    digest = hashlib.sha256()
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            if "__pycache__" in path.parts:
                continue
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay as JSON)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_flatten(f"{prefix}.{key}" if prefix else str(key), sub))
        return out
    return {prefix: value}


class Tracker:
    """One experiment on one tracking server, addressed by explicit run ids."""

    def __init__(self, experiment: str = DEFAULT_EXPERIMENT, uri: str | None = None,
                 artifact_location: str | None = None):
        from mlflow.tracking import MlflowClient  # lazy: mlflow

        self.uri = uri or tracking_uri()
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        self.experiment_id = self._experiment_id(
            artifact_location or default_artifact_location(experiment, self.uri))

    def _experiment_id(self, artifact_location: str | None) -> str:
        from mlflow.exceptions import MlflowException  # lazy: mlflow

        try:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                return found.experiment_id
            return self.client.create_experiment(self.experiment,
                                                 artifact_location=artifact_location)
        except MlflowException as err:
            # Two processes creating the same experiment: the loser reads it back.
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                return found.experiment_id
            raise AutoCompressError(f"MLflow at {self.uri} refused the experiment: {err.message}",
                                    "check MLFLOW_TRACKING_URI and the server logs") from err
        except Exception as err:  # connection refused and friends
            raise AutoCompressError(f"cannot reach MLflow at {self.uri}: {type(err).__name__}",
                                    "start the server or unset MLFLOW_TRACKING_URI") from err

    # -- runs ----------------------------------------------------------------
    def start_run(self, name: str, parent_run_id: str | None = None,
                  tags: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> str:
        """Create a run (a child of ``parent_run_id`` if given); return its id."""
        all_tags = {"autocompress.code_version": code_version(), **(tags or {})}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name,
                                     tags={k: _text(v, _MAX_TAG) for k, v in all_tags.items()})
        if params:
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    def end_run(self, run_id: str, ok: bool = True) -> None:
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Log (nested dicts flattened with dots); values as text, None skipped."""
        from mlflow.entities import Param  # lazy: mlflow

        flat = {k: v for k, v in _flatten("", params).items() if v is not None}
        items = [Param(k, _text(v, _MAX_PARAM)) for k, v in sorted(flat.items())]
        for start in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[start:start + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log numeric values (nested dicts flattened); non-numbers are skipped."""
        from mlflow.entities import Metric  # lazy: mlflow

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0)
                 for k, v in sorted(_flatten("", metrics).items())
                 if isinstance(v, int | float) and not isinstance(v, bool)]
        for start in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[start:start + 1000])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, _text(value, _MAX_TAG))

    def log_file(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or a directory's files to the run's artifacts."""
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(run_id, str(path), artifact_path)

    def log_json(self, run_id: str, name: str, data: Any, artifact_path: str | None = None) -> None:
        with tempfile.TemporaryDirectory(prefix="autocompress-mlflow-") as tmp:
            self.log_file(run_id, write_json_atomic(Path(tmp) / name, data), artifact_path)

    def log_ref(self, run_id: str, name: str, ref: ArtifactRef) -> None:
        """Record a published artifact: tags with URI + hash, its metrics, a JSON copy."""
        self.set_tags(run_id, {f"artifact.{name}.uri": ref.uri,
                               f"artifact.{name}.sha256": ref.sha256})
        if ref.metrics:
            self.log_metrics(run_id, {name: ref.metrics})
        self.log_json(run_id, f"{name}.json", ref.model_dump(mode="json"), "refs")

    # -- registry ------------------------------------------------------------
    def register_model(self, name: str, model: ArtifactRef, lineage: Lineage,
                       run_id: str | None = None, description: str | None = None) -> int:
        """Register ``model`` as a new version of ``name``, with lineage tags and the
        lineage in words as the version's description (``description`` first, if given);
        return the version."""
        check_registry_name(name, "registry name")
        from mlflow.exceptions import MlflowException  # lazy: mlflow
        from mlflow.models.model import MLMODEL_FILE_NAME
        from mlflow.models.utils import get_external_mlflow_model_spec
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

        tags = lineage.to_tags()
        logged = self.client.create_logged_model(
            self.experiment_id, name=name[:100], source_run_id=run_id,
            tags={MLFLOW_MODEL_IS_EXTERNAL: "true", **tags}, model_type="autocompress",
        )
        with tempfile.TemporaryDirectory(prefix="autocompress-register-") as tmp:
            tmp = Path(tmp)
            get_external_mlflow_model_spec(logged).save(str(tmp / MLMODEL_FILE_NAME))
            write_json_atomic(tmp / "lineage.json", lineage.model_dump(mode="json"))
            _copy_small_files(model, tmp / "model-metadata")
            self.client.log_model_artifacts(logged.model_id, str(tmp))
        self.client.finalize_logged_model(logged.model_id, "READY")
        try:
            self.client.create_registered_model(name, description=description)
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        # MLflow's registry store resolves a models:/ source through the *global*
        # tracking URI, not this client's: point it here for the call.
        with _global_tracking_uri(self.uri):
            version = self.client.create_model_version(
                name, source=f"models:/{logged.model_id}", run_id=run_id,
                tags={**tags, "autocompress.model_id": logged.model_id},
                description=_version_description(description, lineage),
                model_id=logged.model_id,
            )
        return int(version.version)


def _version_description(description: str | None, lineage: Lineage) -> str:
    # The SQL stores keep 5000 characters of a description.
    text = "\n\n".join(filter(None, [description, lineage_description(lineage)]))
    return _text(text, _MAX_TAG)


@contextlib.contextmanager
def _global_tracking_uri(uri: str):
    import mlflow  # lazy: mlflow

    with _GLOBAL_URI_LOCK:
        previous = mlflow.get_tracking_uri()
        # set_tracking_uri also writes MLFLOW_TRACKING_URI, which tracking_uri() reads:
        # restore the variable exactly, or later calls in this process go elsewhere.
        previous_env = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(previous)
            if previous_env is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous_env


def _copy_small_files(model: ArtifactRef, dest: Path) -> None:
    """Config/JSON files of a local model dir, so the registry shows what the model is."""
    path = model.local_path()
    if path is None or not path.exists():
        return
    files = [path] if path.is_file() else sorted(path.glob("*"))
    for file in files:
        if file.is_file() and file.suffix in (".json", ".md", ".txt", ".yaml") \
                and file.stat().st_size <= _SMALL_FILE_BYTES:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, dest / file.name)


@functools.cache
def _cached_tracker(experiment: str, uri: str, artifact_location: str | None) -> Tracker:
    return Tracker(experiment, uri, artifact_location)


def get_tracker(experiment: str = DEFAULT_EXPERIMENT, uri: str | None = None,
                artifact_location: str | None = None) -> Tracker:
    """A shared ``Tracker`` per (experiment, tracking URI) in this process."""
    return _cached_tracker(experiment, uri or tracking_uri(), artifact_location)


# ---------------------------------------------------------------------------
# Lineage


class Lineage(BaseModel):
    """Everything needed to say where a registered model came from."""

    teacher: str = Field(description="teacher as given (path, hub id, `default`)")
    teacher_sha256: str
    data_fingerprint: str | None = None
    costmodel_version: str | None = Field(None, description="sha256 of the fitted cost model")
    costmodel_error: dict[str, float] = Field(default_factory=dict, description="MAPE etc.")
    target: str | None = None
    workload: str | None = None
    limits: dict[str, Any] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)
    measured: dict[str, float] = Field(default_factory=dict)
    flow_run_id: str | None = None
    trigger_event: str | None = Field(None, description="id of the event that started the run")
    code_version: str = Field(default_factory=code_version)
    # Stage name -> artifact, in pipeline order (the chain from teacher to model).
    artifacts: dict[str, ArtifactRef] = Field(default_factory=dict)
    # Served runs: flow step (or "flow") -> the worker that ran it.
    workers: dict[str, str] = Field(default_factory=dict)

    def to_tags(self) -> dict[str, str]:
        """Flat string tags for a model version (searchable in the MLflow UI)."""
        tags: dict[str, str] = {}
        for key in ("teacher", "teacher_sha256", "data_fingerprint", "costmodel_version",
                    "target", "workload", "flow_run_id", "trigger_event", "code_version"):
            value = getattr(self, key)
            if value is not None:
                tags[f"lineage.{key}"] = _text(value, _MAX_TAG)
        tags["lineage.limits"] = _text(self.limits, _MAX_TAG)
        for group in ("costmodel_error", "scores", "measured"):
            for name, value in getattr(self, group).items():
                tags[f"lineage.{group}.{name}"] = repr(float(value))
        tags["lineage.chain"] = ",".join(self.artifacts)
        for step, worker in self.workers.items():
            tags[f"lineage.worker.{step}"] = _text(worker, _MAX_TAG)
        for stage, ref in self.artifacts.items():
            tags[f"artifact.{stage}"] = _text(self._artifact_tag(stage, ref), _MAX_TAG)
        return tags

    def _artifact_tag(self, stage: str, ref: ArtifactRef) -> dict[str, Any]:
        """An artifact's tag: where it is, its hash, and the figures its line of the
        lineage shows (so that the lineage read back from tags shows them too)."""
        tag: dict[str, Any] = {"uri": ref.uri, "sha256": ref.sha256, "kind": ref.kind}
        figures = key_figures(stage, ref.metrics, self.limits)
        if figures:
            tag["metrics"] = figures
        return tag

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Lineage:
        """Inverse of ``to_tags`` (of a ref's metrics only its key figures are in tags,
        and none of its meta)."""
        data: dict[str, Any] = {"costmodel_error": {}, "scores": {}, "measured": {}}
        for key, value in tags.items():
            if not key.startswith("lineage."):
                continue
            field = key.removeprefix("lineage.")
            group, _, name = field.partition(".")
            if group in data and name:
                data[group][name] = float(value)
            elif field == "limits":
                data["limits"] = json.loads(value)
            elif group == "worker" and name:
                data.setdefault("workers", {})[name] = value
            elif field != "chain":
                data[field] = value
        chain = [s for s in tags.get("lineage.chain", "").split(",") if s]
        data["artifacts"] = {s: ArtifactRef(**json.loads(tags[f"artifact.{s}"]))
                             for s in chain if f"artifact.{s}" in tags}
        if "teacher" not in data or "teacher_sha256" not in data:
            raise AutoCompressError("this model version has no AutoCompress lineage tags",
                                    "only models registered by `autocompress run` have lineage")
        return cls(**data)


class ChainLink(BaseModel):
    """One artifact of the lineage chain and the result of re-hashing it."""

    stage: str
    kind: str
    uri: str
    sha256: str
    status: str  # ok | missing | incomplete | mismatch | unreachable


class LineageReport(BaseModel):
    """A registered model version, its lineage, and whether its artifacts still check out."""

    name: str
    version: int
    model_id: str | None
    run_id: str | None
    tracking_uri: str
    lineage: Lineage
    chain: list[ChainLink]
    problems: list[str] = Field(default_factory=list,
                                description="Why artifacts were unreachable, each cause once.")

    @property
    def ok(self) -> bool:
        return all(link.status == "ok" for link in self.chain)


def parse_model_ref(text: str) -> tuple[str, str | None]:
    """``NAME[@VERSION|@ALIAS|@latest]`` -> (name, version-or-alias or None)."""
    name, _, version = text.partition("@")
    if not name:
        raise AutoCompressError(f"bad model reference {text!r}", "use NAME or NAME@VERSION")
    return name, version or None


def lineage(name: str, version: str | int | None = None, check: bool = True,
            tracker: Tracker | None = None) -> LineageReport:
    """Read a registered version's lineage back and (by default) re-hash every artifact."""
    from mlflow.exceptions import MlflowException  # lazy: mlflow

    tracker = tracker or get_tracker()
    client = tracker.client
    try:
        if version in (None, "latest"):
            versions = client.search_model_versions(f"name = {_filter_literal(name)}")
            if not versions:
                raise AutoCompressError(f"no registered model named {name!r} at {tracker.uri}",
                                        "list models in the MLflow UI or check MLFLOW_TRACKING_URI")
            mv = max(versions, key=lambda v: int(v.version))
        elif str(version).isdigit():
            mv = client.get_model_version(name, str(version))
        else:
            mv = client.get_model_version_by_alias(name, str(version))
    except MlflowException as err:
        raise AutoCompressError(f"cannot read model {name}@{version or 'latest'}: {err.message}",
                                "check the name/version and MLFLOW_TRACKING_URI") from err
    info = Lineage.from_tags(dict(mv.tags))
    links, problems = [], []
    for stage, ref in info.artifacts.items():
        status, cause = verify_with_cause(ref) if check else ("unchecked", None)
        links.append(ChainLink(stage=stage, kind=ref.kind, uri=ref.uri, sha256=ref.sha256,
                               status=status))
        if cause and cause not in problems:  # e.g. no AWS credentials: said once, not per link
            problems.append(cause)
    # REST replies may omit model_id; the tag written at registration has it.
    model_id = getattr(mv, "model_id", None) or mv.tags.get("autocompress.model_id")
    return LineageReport(name=name, version=int(mv.version), model_id=model_id,
                         run_id=mv.run_id, tracking_uri=tracker.uri, lineage=info, chain=links,
                         problems=problems)


REGISTRY_PREFIX = "models:/"


def registered_artifact(uri: str, stages: tuple[str, ...] = ("model", "teacher")) -> Path:
    """The local copy of a registered model, ``models:/NAME/VERSION`` (VERSION: a number,
    an alias or ``latest``; absent = latest): the first of ``stages`` in its lineage
    (``("engine_model", "model")`` for the file an engine serves), fetched hash-checked."""
    name, _, version = uri.removeprefix(REGISTRY_PREFIX).strip("/").partition("/")
    info = lineage(name, version or None, check=False).lineage
    for stage in stages:
        if info.artifacts.get(stage) is not None:
            return fetch(info.artifacts[stage])
    raise AutoCompressError(f"{uri} has no {' or '.join(stages)} artifact in its lineage",
                            "register it with `autocompress teacher train` or a flow")


def _filter_literal(value: str) -> str:
    """``value`` quoted for an MLflow filter string (which has no escape character)."""
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    raise AutoCompressError(f"the model name {value!r} holds both kinds of quote and cannot be "
                            "searched for", "pass an explicit version: NAME@VERSION")
