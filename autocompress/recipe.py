"""The compression recipe: the steps of one run, written once.

    teacher ─► corpus ─► cost model (fit ─► gate) ─► limits ─► time the teacher
            ─► importance ─► search ─► prune ─► distill ─► evaluate ─► verify ─► register

Limits no architecture of the search space can meet stop the run at the limits step
(``reachable_limits``), before the teacher is timed, before importance and the search.

``autocompress.compress`` runs these steps in one process; the ``compress`` flow runs
each as a Prefect stage (``tasks/``) with caching, retries and MLflow. Both call the
functions here and take each stage's settings from ``stage_config.stage_settings`` (the
teacher-size defaults included), so the two cannot drift apart. The flow adds what only
an orchestrator can: the profile of the machine as a cached artifact, the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import check_limits_early
from autocompress.costmodel.gate import judge_with_retries
from autocompress.costmodel.model import CostModel
from autocompress.costmodel.target import Target
from autocompress.costmodel.validate import ValidationReport, validate_cost_model
from autocompress.costmodel.workload import Workload, get_workload
from autocompress.errors import AutoCompressError
from autocompress.importance import (
    CalibrationConfig,
    Importance,
    calibration_batches,
    compute_importance,
)
from autocompress.limits import Limits, check_same_host
from autocompress.modeling import arch_spec_of
from autocompress.modeling.loading import load_config
from autocompress.stage_config import FitOptions, ValidationOptions

# The steps in the order both runners take them (the flow's step names).
STEPS = ("teacher", "corpus", "profile", "costmodel", "validation", "limits",
         "teacher_verification", "importance", "arch", "pruned", "model", "teacher_eval",
         "evaluation", "verification", "registered")


def workloads_of(names: list[str] | None, default: str | Workload) -> list[Workload]:
    """The workloads ``names`` (None: the run's own, ``default``)."""
    if not names:
        return [get_workload(default) if isinstance(default, str) else default]
    return [get_workload(name) for name in names]


def fit_cost_model(target: str | Target, teacher_config: Any, workload: str | Workload | None,
                   options: FitOptions) -> CostModel:
    """Step 2: fit the cost model on probes timed here (a target this machine can time),
    else the analytic model of the target's spec sheet.

    ``workload``: the run's workload, fitted alone unless ``options.workloads`` says
    otherwise: every probe is timed on every fitted workload in lockstep with the
    teacher-shaped reference, so each extra workload multiplies the fit's time.
    """
    from autocompress.costmodel.fit import fit_cost_model as fit

    parsed = Target.parse(target) if isinstance(target, str) else target
    if not parsed.measurable:
        return CostModel.analytic(parsed)
    workloads = None  # no workload at all: the fit's CPU presets
    if options.workloads or workload:
        workloads = workloads_of(options.workloads, workload)
    model, _rows = fit(parsed, teacher_config, workloads=workloads, n_probes=options.n_probes,
                       repeats=options.repeats, warmup=options.warmup, seed=options.seed,
                       paired=options.paired, progress=True)
    return model


def gate(model: CostModel, teacher_config: Any, workload: str | Workload,
         options: ValidationOptions,
         log: Callable[[str], None] = print) -> tuple[ValidationReport | None, list[str]]:
    """Step 3, the gate: time sampled architectures, score the cost model on them.

    Returns the report (None: the target cannot be timed here, so the model goes
    unvalidated) and the gate's failures (empty: the search may trust the model). A
    failure on a busy machine is measured again (bounded) before it counts.
    """
    if not model.target.measurable:
        return None, []
    workloads = workloads_of(options.workloads, workload)

    def measure(repeats: int) -> ValidationReport:
        return validate_cost_model(model, teacher_config, workloads, n=options.n,
                                   repeats=repeats, warmup=options.warmup, seed=options.seed,
                                   progress=True)

    return judge_with_retries(measure, lambda report: gate_failures(report, options),
                              options.repeats, options.gated_metrics, options.noise_retry,
                              log=log)


def gate_failures(report: ValidationReport, options: ValidationOptions) -> list[str]:
    """What fails the gate: a gated metric's error above ``max_mape`` or its rank
    agreement below ``min_kendall_tau``."""
    failures = []
    for metric in options.gated_metrics:
        mape = report.mape.get(metric)
        tau = report.kendall_tau.get(metric)
        if options.max_mape is not None and mape is not None and mape > options.max_mape:
            failures.append(f"{metric} MAPE {mape:.1f}% > {options.max_mape}%")
        if (options.min_kendall_tau is not None and tau is not None
                and tau < options.min_kendall_tau):
            failures.append(f"{metric} Kendall tau {tau:.2f} < {options.min_kendall_tau}")
    return failures


def gate_error(model: CostModel, failures: list[str], where: str) -> AutoCompressError:
    """The one-line refusal of a cost model that failed the gate (``where``: its report)."""
    return AutoCompressError(
        f"cost model {model.version} failed the validation gate: {'; '.join(failures)} "
        f"(report: {where})",
        "refit with more probes/repeats (options.costmodel), or relax "
        "options.validation.max_mape / min_kendall_tau")


def reachable_limits(teacher: Any, cost_model: CostModel, workload: str | Workload,
                     limits: Limits | None, search: SearchConfig,
                     budget_fraction: float | None = None) -> Limits:
    """The limits step: ``limits`` resolved (``budget_fraction``: of the teacher's predicted
    cost), refused with the smallest reachable costs when no architecture of ``search``'s
    space meets them. ``teacher``: its config or its model directory (the weights are not
    read), so a run with limits nothing can meet stops in a fraction of a second, not
    after importance."""
    config = load_config(teacher)[1] if isinstance(teacher, str | Path) else teacher
    spec = arch_spec_of(config)
    wl = get_workload(workload) if isinstance(workload, str) else workload
    return check_limits_early(spec, search.space, cost_model, wl, limits, budget_fraction)


def check_teacher_reading(limits: Limits, teacher_measured: Mapping[str, float],
                          limits_origin: Mapping[str, Any] | None) -> None:
    """After timing the teacher: refuse limits carried from a host that read the teacher
    more than ``limits.HOST_DRIFT`` away (``limits_origin``: ``{"from": name,
    "teacher_measured": {metric: value}}``; None: limits set here, nothing to check)."""
    if limits_origin:
        check_same_host(limits, teacher_measured, limits_origin.get("teacher_measured") or {},
                        where=limits_origin.get("from", "another run"))


def teacher_importance(model: torch.nn.Module, tokenizer: Any,
                       calibration: CalibrationConfig, progress: bool = False) -> Importance:
    """Step 4: importance scores of ``model`` on the calibration split, as the importance
    stage computes them (``importance.importance_for_checkpoint``)."""
    torch.manual_seed(calibration.seed)
    batches = calibration_batches(tokenizer, calibration)
    return compute_importance(model, batches, removal_batches=calibration.removal_batches,
                              criterion=calibration.criterion, progress=progress)
