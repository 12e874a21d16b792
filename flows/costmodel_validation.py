"""The ``costmodel_validation`` flow: profile → fit → validate, for one target.

The same three stages open the ``compress`` flow (and share its cache), so
running this first makes a later compression skip them. The validation stage
is a gate: it fails the flow when the cost model mis-ranks architectures.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow

from autocompress.defaults import DEFAULT_TARGET, DEFAULT_WORKLOAD
from autocompress.model_source import resolve_model_dir
from autocompress.stage_config import check_options
from flows.common import FlowReport, Step, finish_report, new_report, run_steps, tracked_flow
from tasks.costmodel import fit_costmodel, profile_target, this_machine, validate_costmodel
from tasks.teacher import publish_teacher

VALIDATION_STEPS: list[Step] = [
    Step("teacher", publish_teacher, teacher_dir="teacher_dir", label="teacher"),
    Step("profile", profile_target, target="target", machine="machine"),
    Step("costmodel", fit_costmodel, target="target", teacher="teacher", profile="profile",
         options="costmodel_options"),
    Step("validation", validate_costmodel, costmodel="costmodel", teacher="teacher",
         workload="workload", options="validation_options"),
]


@flow(name="costmodel_validation")
def costmodel_validation(
    teacher: str = "default",
    target: str = DEFAULT_TARGET,
    workload: str = DEFAULT_WORKLOAD,
    fit: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
    experiment: str = "autocompress-costmodel",
    store: str | None = None,
    track: bool = True,
) -> FlowReport:
    """Fit the cost model of ``target`` around ``teacher``'s architecture and validate it.

    Args:
        teacher: ``default``, a model directory or ``models:/NAME/VERSION``; its
            architecture centres the probe and validation samples.
        target / workload: what to fit and validate for.
        fit: ``stage_config.FitOptions`` fields (probes, repeats...).
        validation: ``stage_config.ValidationOptions`` fields (n, repeats, gate).
    """
    started = time.perf_counter()
    check_options({"costmodel": fit or {}, "validation": validation or {}})
    params = {"teacher": teacher, "target": target, "workload": workload,
              "fit": fit or {}, "validation": validation or {}}
    with tracked_flow("costmodel_validation", params, experiment, store, track) as run:
        report = new_report("costmodel_validation", run)
        values: dict[str, Any] = {
            **params, "teacher_dir": resolve_model_dir(teacher), "machine": this_machine(),
            "costmodel_options": fit or {}, "validation_options": validation or {},
        }
        run_steps(VALIDATION_STEPS, values, run, report)
        report.outputs = {k: values[k] for k in ("teacher", "profile", "costmodel", "validation")}
        return finish_report(report, run, started)
