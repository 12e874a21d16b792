"""The ``smoke`` flow: check a served set-up end to end in seconds.

    teacher ─► loss (forward pass here) ─► accelerated (forward pass on the
    accelerator pool, by default) ─► register (lineage, the triggering event)

It exercises what a long compression relies on — a teacher from the registry
fetched from the artifact store, a step placed on another pool's worker, results
and artifacts travelling through the store, a registered model whose lineage
names its flow run and event — without hours of search and distillation. Its
parameters are the subset of ``compress``'s that these steps use.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow

from autocompress.model_source import resolve_model_dir
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
from tasks.registry import register_model
from tasks.smoke import forward_probe
from tasks.teacher import publish_teacher

SMOKE_STEPS: list[Step] = [
    Step("teacher", publish_teacher, teacher_dir="teacher_dir", label="teacher"),
    Step("loss", forward_probe, model="teacher", device="cpu_device"),
    Step("accelerated", forward_probe, model="teacher", device="auto_device"),
]
CHAIN = ["teacher", "loss", "accelerated"]


@flow(name="smoke")
def smoke(
    teacher: str = "default",
    placement: dict[str, str] | None = None,
    register_as: str | None = "autocompress-smoke",
    trigger_event: str | None = None,
    experiment: str = "autocompress-smoke",
    store: str | None = None,
    track: bool = True,
) -> FlowReport:
    """Fetch ``teacher``, run a forward pass in this process and on the placed pools.

    Args:
        teacher: ``default``, a model directory or ``models:/NAME/VERSION``.
        placement: step name -> work pool (``{"accelerated": "accelerator"}``).
        register_as: registry name for the result (None: don't register).
        trigger_event: id of the Prefect event that started this run (lineage).
        experiment / store / track: as for ``compress``.
    """
    started = time.perf_counter()
    params = {"teacher": teacher, "placement": placement or {}}
    tags = {"autocompress.trigger_event": trigger_event} if trigger_event else None
    with tracked_flow("smoke", params, experiment, store, track, tags=tags) as run:
        report = new_report("smoke", run)
        values: dict[str, Any] = {"teacher": teacher, "teacher_dir": resolve_model_dir(teacher),
                                  "cpu_device": "cpu", "auto_device": "auto"}
        run_steps(SMOKE_STEPS, values, run, report, placement=placement)
        if register_as and track:
            values["register_as"] = register_as
            values["lineage"] = Lineage(
                teacher=teacher, teacher_sha256=values["teacher"].sha256,
                scores={"loss": values["loss"].metrics["loss"]}, flow_run_id=run.flow_run_id,
                trigger_event=trigger_event, artifacts=refs_of(values, CHAIN))
            run_steps([Step("registered", register_model, name="register_as", model="teacher",
                            lineage="lineage")], values, run, report)
        report.outputs = {k: values[k] for k in [*CHAIN, "registered"] if k in values}
        return finish_report(report, run, started)
