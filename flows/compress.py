"""The ``compress`` flow: one flow run = one compression run.

The recipe of ``autocompress.recipe`` (the steps ``autocompress.compress`` runs in one
process), each step a Prefect task (``tasks/``) that is cached, retried and tracked in
MLflow. The flow body below is the graph, one line per box:

    teacher ─► corpus ─► profile ─► cost model ─► gate ─► limits ─► time the teacher
            ─► importance ─► architecture (the search, an ablation or Minitron) ─► prune
            ─► distill ─► evaluate ─► (engine export) ─► verify ─► register
    optional Minitron baseline: same importance, cost model, limits and distillation
    budget, beside the main branch

The compressed model is registered (with lineage) only when its measured latency/memory
meet the limits; otherwise the report says why. Re-running with the same parameters reuses
every finished stage from the cache (keys are content hashes of the inputs + code
versions); a stage that failed re-runs, and long stages resume from their checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow

from autocompress import recipe
from autocompress.artifacts import ArtifactRef
from autocompress.defaults import (
    DEFAULT_METHOD,
    DEFAULT_TARGET,
    DEFAULT_TEACHER,
    DEFAULT_WORKLOAD,
    METHODS,
)
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.model_source import resolve_model_dir
from autocompress.paths import default_corpus_dir
from autocompress.profiles import get_profile, with_profile
from autocompress.stage_config import STAGE_CONFIGS, check_eval_config, check_options
from autocompress.tracking import Lineage
from flows.common import FlowReport, Steps, finish_report, new_report, refs_of, tracked_flow
from flows.placement import worker_name
from tasks.costmodel import fit_costmodel, profile_target, this_machine, validate_costmodel
from tasks.data import prepare_corpus
from tasks.distill import distill_model
from tasks.engine import export_for_engine
from tasks.evaluation import evaluate_model
from tasks.prune import prune_model, score_importance
from tasks.registry import register_model
from tasks.search import ablation_arch, minitron_arch, resolve_limits, search_arch
from tasks.stage import Stage
from tasks.teacher import publish_teacher
from tasks.verify import verify_model

__all__ = ["METHODS", "compress"]

# The task that finds the main branch's architecture, by method (``defaults.METHODS``).
ARCH_STAGES: dict[str, Stage] = {"autocompress": search_arch, "greedy": ablation_arch,
                                 "random": ablation_arch, "minitron": minitron_arch,
                                 "minitron-scored": ablation_arch, "mip": ablation_arch}
# Stages that take an ``options`` dict from the flow's ``options[<name>]``.
STAGE_OPTIONS = tuple(STAGE_CONFIGS)
# Engine targets (cpu-local/llama.cpp/*) serve an exported file: it is exported after
# distillation, and that file is what is verified in the engine and registered.
# Engines measured here that serve an export, not the model directory: llama.cpp a GGUF file,
# vLLM a nemotron-nas directory (what a vLLM user deploys; verify measures that export).
ENGINES_SERVING_FILES = ("llama.cpp", "vllm")
# Steps whose outputs form a registered model's lineage, in order (absent ones skipped).
LINEAGE = ("teacher", "corpus", "profile", "costmodel", "validation", "importance", "arch",
           "pruned", "model", "evaluation", "engine_model", "verification")
# Every step name the flow may run (placement may name any of them).
STEP_NAMES = (*recipe.STEPS, "engine_model", "baseline_arch", "baseline_pruned",
              "baseline_model", "baseline_evaluation", "baseline_verification")


@flow(name="compress")
def compress(
    teacher: str = DEFAULT_TEACHER,
    target: str = DEFAULT_TARGET,
    workload: str = DEFAULT_WORKLOAD,
    limits: Limits | None = None,
    budget_fraction: float | None = None,
    baseline: bool = False,
    method: str = DEFAULT_METHOD,
    seed: int | None = None,
    eval_tasks: str | None = None,
    eval_limit: int | None = None,
    eval_config: dict[str, Any] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    register_as: str | None = "autocompress-compressed",
    corpus_dir: str | None = None,
    experiment: str = "autocompress",
    store: str | None = None,
    track: bool = True,
    placement: dict[str, str] | None = None,
    trigger_event: str | None = None,
    limits_origin: dict[str, Any] | None = None,
    profile: str | None = None,
) -> FlowReport:
    """Compress ``teacher`` to meet ``limits`` on ``target`` for ``workload``.

    Args:
        teacher: ``default`` (the bundled code teacher), a model directory, or
            ``models:/NAME/VERSION`` (a model in the MLflow registry).
        target: hardware/engine/dtype, e.g. ``cpu-local/hf-eager/fp32``.
        workload: a workload preset name (``local-coding-cpu``, ``datacenter``...).
        limits: latency / throughput / memory limits (unset = unchecked).
        budget_fraction: add a limit at this fraction of the teacher's predicted
            cost on the workload's main metric (e.g. 0.6), on top of ``limits``.
        baseline: also run the Minitron baseline branch for a side-by-side table.
        method: how the architecture is found (``METHODS``): ``autocompress`` (the
            search), ``greedy`` / ``random`` (its ablations) or ``minitron`` (the fair
            homogeneous baseline) in the main branch; bench compare runs each method
            as its own flow run.
        seed: the search seed and the distillation seed (``options`` that set
            ``search.dnas.seed`` or ``distill.seed`` win); None: the options' own.
        eval_tasks / eval_limit / eval_config: the benchmark suite and its size.
        options: per-stage settings, ``{stage name: {setting: value}}``.
        register_as: registry name for the compressed model (None: don't register).
        corpus_dir: corpus directory (default ``$AUTOCOMPRESS_HOME/corpus``).
        experiment: MLflow experiment name.
        store: artifact store (dir, ``file://`` or ``s3://bucket/prefix``; default
            ``$AUTOCOMPRESS_STORE`` or ``$AUTOCOMPRESS_HOME/artifacts``).
        track: log to MLflow (off: only Prefect + the artifact store).
        placement: step name -> work pool, e.g. ``{"model": "accelerator"}``: those
            steps run on a worker of that pool (served flows; see prefect.yaml).
        trigger_event: id of the Prefect event that started this run (set by the
            deployment's trigger); recorded in the MLflow run and the lineage.
        limits_origin: where ``limits`` were set, ``{"from": name, "teacher_measured":
            {metric: value}}`` (``bench compare --limits-from``): the run stops right after
            timing the teacher if this host reads it more than 10% away
            (``limits.check_same_host``), before any search or training.
        profile: size every stage at once (``autocompress.profiles``): ``demo`` is
            `autocompress demo`'s sizes, ``tiny`` a real run that fits a test; None or
            ``full``: each stage's defaults. Explicit
            ``options``, ``eval_limit`` and ``eval_config`` win over the profile's.
    """

    started = time.perf_counter()
    limits = check_limits(limits, budget_fraction)
    if method not in METHODS:
        raise AutoCompressError(f"unknown method {method!r}", f"use one of {', '.join(METHODS)}")
    sizes = get_profile(profile)
    options = seeded(with_profile(options, sizes), seed)
    eval_limit = eval_limit if eval_limit is not None else sizes.eval_limit
    eval_config = {**sizes.eval_config, **check_eval_config(eval_config)}
    params = {"teacher": teacher, "target": target, "workload": workload,
              "limits": limits.model_dump(exclude_none=True),
              "budget_fraction": budget_fraction, "baseline": baseline, "method": method,
              "seed": seed, "eval_tasks": eval_tasks, "eval_limit": eval_limit,
              "options": options, "profile": profile}
    tags = {"autocompress.trigger_event": trigger_event} if trigger_event else None
    with tracked_flow("compress", params, experiment, store, track, tags=tags) as run:
        report = new_report("compress", run)
        step = Steps(run, report, placement)
        machine = this_machine()

        teacher_ref = step("teacher", publish_teacher, teacher_dir=resolve_model_dir(teacher),
                           label="teacher")
        corpus = step("corpus", prepare_corpus,
                      corpus_dir=Path(corpus_dir) if corpus_dir else default_corpus_dir())
        # The cost model of the target, trusted only behind the gate.
        profile = step("profile", profile_target, target=target, machine=machine)
        costmodel = step("costmodel", fit_costmodel, target=target, teacher=teacher_ref,
                         profile=profile, options=options.get("costmodel", {}),
                         workload=workload)
        validation = step("validation", validate_costmodel, costmodel=costmodel,
                          teacher=teacher_ref, workload=workload,
                          options=options.get("validation", {}))
        # Limits no architecture of the search space meets stop here, before any heavy step.
        limits = step("limits", resolve_limits, teacher=teacher_ref, costmodel=costmodel,
                      workload=workload, limits=limits, budget_fraction=budget_fraction,
                      search_options=options.get("search", {}))
        measure = dict(costmodel=costmodel, target=target, workload=workload, limits=limits,
                       machine=machine, options=options.get("verify", {}))
        # The teacher is timed before any search: carried limits are checked against it.
        teacher_timing = step("teacher_verification", verify_model, model=teacher_ref,
                              **measure)
        recipe.check_teacher_reading(limits, teacher_timing.metrics, limits_origin)

        importance = step("importance", score_importance, teacher=teacher_ref, corpus=corpus,
                          options=options.get("importance", {}))
        search = dict(teacher=teacher_ref, corpus=corpus, importance=importance,
                      costmodel=costmodel, target=target, workload=workload, limits=limits,
                      options=options.get("search", {}))
        arch = step("arch", ARCH_STAGES[method], **search, **behind_gate(method, validation))
        pruned = step("pruned", prune_model, teacher=teacher_ref, arch=arch,
                      importance=importance)
        model = step("model", distill_model, teacher=teacher_ref, student=pruned,
                     corpus=corpus, options=options.get("distill", {}))
        suite = dict(corpus=corpus, tasks=eval_tasks, config=eval_config, limit=eval_limit,
                     teacher=teacher_ref)
        step("teacher_eval", evaluate_model, model=teacher_ref, **suite)
        step("evaluation", evaluate_model, model=model, **suite)
        if serves_a_file(target):
            model = step("engine_model", export_for_engine, model=model, target=target)
        verification = step("verification", verify_model, model=model, **measure)

        if baseline:
            minitron_baseline(step, search, options.get("distill", {}), suite, measure)
        if not verification.metrics.get("ok"):
            report.notes.append("the compressed model misses its limits when measured "
                                f"(see {verification.uri}); not registered")
        elif register_as:
            lineage = build_lineage(step.outputs, params, run.flow_run_id, trigger_event)
            lineage.workers = served_workers(report)
            step("registered", register_model, name=register_as, model=model, lineage=lineage)
        report.outputs = dict(step.outputs)
        return finish_report(report, run, started)


def check_limits(limits: Limits | dict | None, budget_fraction: float | None) -> Limits:
    """The flow's limits as ``Limits``; a run with none and no budget fraction stops here."""
    limits = limits if isinstance(limits, Limits) else Limits.model_validate(limits or {})
    if limits.is_empty() and budget_fraction is None:
        raise AutoCompressError("no limit to compress for",
                                "give a limit (e.g. --limit tpot=3) or --budget-fraction 0.6")
    return limits


def behind_gate(method: str, validation: ArtifactRef) -> dict[str, Any]:
    """Extra inputs of the architecture step: the search and its ablations take the gate's
    report (so they run only behind it) and the ablations their method; Minitron neither."""
    if method == "minitron":
        return {}
    return {"validation": validation, **({} if method == "autocompress" else {"method": method})}


def serves_a_file(target: str) -> bool:
    """Whether ``target``'s engine serves an exported file rather than the model directory."""
    parts = target.split("/")
    return len(parts) > 1 and parts[0] == "cpu-local" and parts[1] in ENGINES_SERVING_FILES


def minitron_baseline(step: Steps, search: dict[str, Any], distill_options: dict[str, Any],
                      suite: dict[str, Any], measure: dict[str, Any]) -> ArtifactRef:
    """The fair Minitron baseline beside the main branch: the same importance, cost model,
    limits and distillation budget. Returns its verification."""
    arch = step("baseline_arch", minitron_arch, **search)
    pruned = step("baseline_pruned", prune_model, teacher=search["teacher"], arch=arch,
                  importance=search["importance"])
    model = step("baseline_model", distill_model, teacher=search["teacher"], student=pruned,
                 corpus=search["corpus"], options=distill_options)
    step("baseline_evaluation", evaluate_model, model=model, **suite)
    return step("baseline_verification", verify_model, model=model, **measure)


def seeded(options: dict[str, dict[str, Any]] | None, seed: int | None
           ) -> dict[str, dict[str, Any]]:
    """``options``, checked before any stage runs, with ``seed`` as the search seed
    (``search.dnas.seed``: DNAS, random draws, score batches, Minitron's short
    distillations) and the distillation seed, where the options do not set them already."""
    options = check_options(options)
    if seed is None:
        return options
    search = options.setdefault("search", {})
    search["dnas"] = {"seed": seed, **dict(search.get("dnas") or {})}
    options["distill"] = {"seed": seed, **options.get("distill", {})}
    return options


def served_workers(report: FlowReport) -> dict[str, str]:
    """Which served worker ran the flow and each placed step (empty when not served)."""
    here = worker_name()
    placed = {s.name: s.worker["name"] for s in report.steps if s.worker.get("name")}
    return {"flow": here, **placed} if here else placed


def build_lineage(outputs: dict[str, Any], params: dict[str, Any], flow_run_id: str | None,
                  trigger_event: str | None = None) -> Lineage:
    """The lineage record of a registered model from the flow's step outputs."""
    validation = outputs.get("validation")
    evaluation = outputs.get("evaluation")
    verification = outputs.get("verification")
    corpus = outputs.get("corpus")
    costmodel = outputs.get("costmodel")
    return Lineage(
        teacher=str(params["teacher"]),
        teacher_sha256=outputs["teacher"].sha256,
        data_fingerprint=corpus.meta.get("fingerprint") if corpus is not None else None,
        costmodel_version=costmodel.meta.get("version") if costmodel is not None else None,
        costmodel_error=dict(validation.metrics) if validation is not None else {},
        target=params.get("target"),
        workload=params.get("workload"),
        limits=outputs["limits"].model_dump(exclude_none=True),
        scores=dict(evaluation.metrics) if evaluation is not None else {},
        measured=dict(verification.metrics) if verification is not None else {},
        flow_run_id=flow_run_id,
        trigger_event=trigger_event,
        artifacts=refs_of(outputs, LINEAGE),
    )
