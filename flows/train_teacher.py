"""The ``train_teacher`` flow: prepare the default teacher, register it, announce it.

corpus ─► train (resumable) ─► evaluate ─► register ─► event ``autocompress.teacher.registered``

The event carries the registered name and version, so a deployment with an event
trigger (see ``prefect.yaml``) can start a compression of the new teacher
(``teacher="models:/NAME/VERSION"``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.events import emit_event

from autocompress.artifacts import Store
from autocompress.tracking import Lineage
from flows.common import (
    FlowReport,
    Step,
    finish_report,
    new_report,
    refs_of,
    run_steps,
    tracked_flow,
)
from tasks.data import prepare_corpus
from tasks.evaluation import evaluate_model
from tasks.registry import register_model
from tasks.teacher import publish_teacher
from tasks.teacher import train_teacher as train_teacher_stage

TEACHER_EVENT = "autocompress.teacher.registered"

def announce_teacher(registered, model) -> str:
    """Emit ``autocompress.teacher.registered`` for a registered teacher; return the event id.

    The payload names the registry entry (``model_uri`` = ``models:/NAME/VERSION``),
    which the ``on-new-teacher`` trigger in prefect.yaml hands to ``compress``.
    """
    event = emit_event(
        event=TEACHER_EVENT,
        resource={"prefect.resource.id": f"mlflow.model.{registered.name}",
                  "prefect.resource.name": registered.name},
        payload={"name": registered.name, "version": registered.version,
                 "uri": model.uri, "sha256": model.sha256,
                 "model_uri": f"models:/{registered.name}/{registered.version}"},
    )
    return str(event.id) if event is not None else ""


TEACHER_STEPS: list[Step] = [
    Step("corpus", prepare_corpus, corpus_dir="corpus_dir"),
    Step("model", train_teacher_stage, config="config", corpus="corpus"),
    Step("evaluation", evaluate_model, model="model", corpus="corpus", tasks="eval_tasks",
         limit="eval_limit"),
]


@flow(name="train_teacher")
def train_teacher(
    config: dict[str, Any] | None = None,
    corpus_dir: str | None = None,
    eval_tasks: str | None = None,
    eval_limit: int | None = None,
    register_as: str | None = "autocompress-teacher",
    install_to: str | None = None,
    experiment: str = "autocompress-teacher",
    store: str | None = None,
    track: bool = True,
) -> FlowReport:
    """Train the default teacher (``autocompress.teacher.TeacherConfig`` fields in ``config``).

    Args:
        config: overrides of ``TeacherConfig`` (sizes, token budget, lr, seed...).
        corpus_dir: corpus directory (default ``$AUTOCOMPRESS_HOME/corpus``).
        eval_tasks / eval_limit: benchmark suite for the teacher's scores.
        register_as: registry name (None: don't register, no event).
        install_to: also copy the trained teacher to this directory (atomically),
            e.g. ``autocompress/assets/default-teacher``.
        experiment / store / track: as for ``compress``.
    """
    from autocompress.paths import default_corpus_dir
    from autocompress.teacher import TeacherConfig

    started = time.perf_counter()
    cfg = TeacherConfig.model_validate(config or {})
    params = {"config": cfg.model_dump(), "eval_tasks": eval_tasks, "eval_limit": eval_limit}
    with tracked_flow("train_teacher", params, experiment, store, track) as run:
        report = new_report("train_teacher", run)
        values: dict[str, Any] = {
            **params,
            "corpus_dir": Path(corpus_dir) if corpus_dir else default_corpus_dir(),
        }
        run_steps(TEACHER_STEPS, values, run, report)
        model = values["model"]
        if install_to:
            Store.for_ref(model).fetch(model, Path(install_to))
            report.notes.append(f"installed the teacher at {install_to}")
        if register_as and track:
            values["register_as"] = register_as
            values["lineage"] = Lineage(
                teacher=f"trained:{register_as}", teacher_sha256=model.sha256,
                data_fingerprint=values["corpus"].meta.get("fingerprint"),
                scores=dict(values["evaluation"].metrics), flow_run_id=run.flow_run_id,
                artifacts=refs_of(values, ["corpus", "model", "evaluation"]),
            )
            run_steps([Step("registered", register_model, name="register_as", model="model",
                            lineage="lineage")], values, run, report)
            announce_teacher(values["registered"], model)
        report.outputs = {k: values[k] for k in ("corpus", "model", "evaluation", "registered")
                          if k in values}
        return finish_report(report, run, started)


@flow(name="register_teacher")
def register_teacher(
    model_dir: str,
    register_as: str = "autocompress-teacher",
    experiment: str = "autocompress-teacher",
    store: str | None = None,
) -> FlowReport:
    """Register an existing model directory as a teacher and announce it by event.

    The directory is published to the artifact store (content hash), registered in
    MLflow with its lineage, and ``autocompress.teacher.registered`` is emitted, so
    a served ``on-new-teacher`` deployment compresses it.
    """
    started = time.perf_counter()
    params = {"model_dir": model_dir, "register_as": register_as}
    with tracked_flow("register_teacher", params, experiment, store) as run:
        report = new_report("register_teacher", run)
        values: dict[str, Any] = {"teacher_dir": Path(model_dir), "register_as": register_as,
                                  "label": Path(model_dir).name}
        run_steps([Step("model", publish_teacher, teacher_dir="teacher_dir", label="label")],
                  values, run, report)
        model = values["model"]
        values["lineage"] = Lineage(teacher=f"registered:{Path(model_dir).name}",
                                    teacher_sha256=model.sha256, flow_run_id=run.flow_run_id,
                                    artifacts={"model": model})
        run_steps([Step("registered", register_model, name="register_as", model="model",
                        lineage="lineage")], values, run, report)
        event_id = announce_teacher(values["registered"], model)
        report.notes.append(f"emitted {TEACHER_EVENT} {event_id}")
        report.outputs = {k: values[k] for k in ("model", "registered")}
        return finish_report(report, run, started)
