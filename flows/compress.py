"""The ``compress`` flow: one flow run = one compression run.

    teacher ─► corpus ─► (1 profile ─► 2 cost model ─► 3 validate gate) ─► limits
                      ─► 10 verify the teacher ─► 4 importance ─► 5 search
                      ─► 6 discretize/repair ─► 7 prune ─► 8 distill ─► 9 evaluate
                      ─► 10 verify ─► 11 register
    optional Minitron baseline: same importance and distillation budget, 7 → 10

Each box is a ``Step`` below; a stage joins the pipeline by adding its line.
The compressed model is registered (with lineage) only when its measured
latency/memory meet the limits; otherwise the report says why.

Re-running with the same parameters reuses every finished stage from the cache
(keys are content hashes of the inputs + code versions); a stage that failed
re-runs, and long stages resume from their checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow

from autocompress.errors import AutoCompressError
from autocompress.limits import Limits, check_same_host
from autocompress.stage_options import STAGE_CONFIGS, check_eval_config, check_options
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
from tasks.costmodel import fit_costmodel, profile_target, this_machine, validate_costmodel
from tasks.data import prepare_corpus
from tasks.distill import distill_model
from tasks.engine import export_for_engine
from tasks.evaluation import evaluate_model
from tasks.prune import prune_model, score_importance
from tasks.registry import register_model
from tasks.search import ablation_arch, minitron_arch, resolve_limits, search_arch
from tasks.teacher import publish_teacher
from tasks.verify import verify_model

# The pipeline, in order. Inputs name flow parameters or earlier steps' outputs.
EVAL = dict(corpus="corpus", tasks="eval_tasks", config="eval_config", limit="eval_limit",
            teacher="teacher")
VERIFY = dict(costmodel="costmodel", target="target", workload="workload", limits="limits",
              machine="machine", options="verify_options")
SEARCH_INPUTS = dict(teacher="teacher", corpus="corpus", importance="importance",
                     costmodel="costmodel", target="target", workload="workload",
                     limits="limits", options="search_options")

COMPRESS_STEPS: list[Step] = [
    Step("teacher", publish_teacher, teacher_dir="teacher_dir", label="teacher"),
    Step("corpus", prepare_corpus, corpus_dir="corpus_dir"),
    Step("profile", profile_target, target="target", machine="machine"),              # 1
    Step("costmodel", fit_costmodel, target="target", teacher="teacher", profile="profile",
         options="costmodel_options", workload="workload"),                           # 2
    Step("validation", validate_costmodel, costmodel="costmodel", teacher="teacher",
         workload="workload", options="validation_options"),                          # 3 gate
    Step("limits", resolve_limits, teacher="teacher", costmodel="costmodel",
         workload="workload", limits="limits", budget_fraction="budget_fraction"),
    # The teacher is timed before the search: its reading checks carried limits early.
    Step("teacher_verification", verify_model, model="teacher", **VERIFY),            # 10
    Step("importance", score_importance, teacher="teacher", corpus="corpus",
         options="importance_options"),                                               # 4
    Step("arch", search_arch, validation="validation", **SEARCH_INPUTS),              # 5+6
    Step("pruned", prune_model, teacher="teacher", arch="arch", importance="importance"),  # 7
    Step("model", distill_model, teacher="teacher", student="pruned", corpus="corpus",
         options="distill_options"),                                                  # 8
    Step("teacher_eval", evaluate_model, model="teacher", **EVAL),                    # 9
    Step("evaluation", evaluate_model, model="model", **EVAL),
    Step("verification", verify_model, model="model", **VERIFY),
]

# The Minitron baseline (``baseline=True``): same importance, cost model, limits
# and distillation budget; boxes 7-10.
BASELINE_STEPS: list[Step] = [
    Step("baseline_arch", minitron_arch, **SEARCH_INPUTS),
    Step("baseline_pruned", prune_model, teacher="teacher", arch="baseline_arch",
         importance="importance"),
    Step("baseline_model", distill_model, teacher="teacher", student="baseline_pruned",
         corpus="corpus", options="distill_options"),
    Step("baseline_evaluation", evaluate_model, model="baseline_model", **EVAL),
    Step("baseline_verification", verify_model, model="baseline_model", **VERIFY),
]

# How the main branch finds its architecture (``autocompress.arch_search.run.METHODS``): the
# search; its ablations greedy (repair from the teacher, no DNAS) and random (random
# search, as many scored architectures as the search); the fair Minitron baseline.
METHODS = ("autocompress", "greedy", "random", "minitron")
ARCH_STEPS = {
    "minitron": Step("arch", minitron_arch, **SEARCH_INPUTS),
    "greedy": Step("arch", ablation_arch, validation="validation", method="method",
                   **SEARCH_INPUTS),
}
ARCH_STEPS["random"] = ARCH_STEPS["greedy"]


def steps_for(method: str) -> list[Step]:
    """The pipeline with the architecture found by ``method``."""
    if method not in METHODS:
        raise AutoCompressError(f"unknown method {method!r}", f"use one of {', '.join(METHODS)}")
    if method == "autocompress":
        return COMPRESS_STEPS
    return [ARCH_STEPS[method] if step.name == "arch" else step for step in COMPRESS_STEPS]


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


REGISTER_STEP = Step("registered", register_model, name="register_as", model="model",
                     lineage="lineage")

# Engine targets (cpu-local/llama.cpp/*) serve an exported file: it is exported after
# distillation, and that file is what is verified in the engine and registered.
ENGINES_SERVING_FILES = ("llama.cpp",)
ENGINE_EXPORT_STEP = Step("engine_model", export_for_engine, model="model", target="target")


def steps_for_target(target: str, pipeline: list[Step]) -> tuple[list[Step], Step, list[str]]:
    """(compress steps, register step, lineage chain) of ``pipeline`` for ``target``."""
    engine = target.split("/")[1] if target.count("/") >= 1 else ""
    if engine not in ENGINES_SERVING_FILES:
        return pipeline, REGISTER_STEP, CHAIN
    steps = []
    for step in pipeline:
        if step.name == "verification":
            steps += [ENGINE_EXPORT_STEP,
                      Step("verification", verify_model, model="engine_model", **VERIFY)]
        else:
            steps.append(step)
    register = Step("registered", register_model, name="register_as", model="engine_model",
                    lineage="lineage")
    chain = [*CHAIN[:CHAIN.index("verification")], "engine_model", "verification"]
    return steps, register, chain

# Stages that take an ``options`` dict from the flow's ``options[<name>]``.
STAGE_OPTIONS = tuple(STAGE_CONFIGS)

# Steps whose outputs form the lineage chain, in order (missing ones are skipped).
CHAIN = ["teacher", "corpus", "profile", "costmodel", "validation", "importance", "arch",
         "pruned", "model", "evaluation", "verification"]


def build_lineage(values: dict[str, Any], params: dict[str, Any], flow_run_id: str | None,
                  chain: list[str]) -> Lineage:
    """The lineage record of a registered model from the flow's step outputs."""
    refs = refs_of(values, chain)
    validation = values.get("validation")
    evaluation = values.get("evaluation")
    verification = values.get("verification")
    corpus = values.get("corpus")
    return Lineage(
        teacher=str(params["teacher"]),
        teacher_sha256=values["teacher"].sha256,
        data_fingerprint=corpus.meta.get("fingerprint") if corpus is not None else None,
        costmodel_version=(values["costmodel"].meta.get("version") if "costmodel" in values
                           else None),
        costmodel_error=dict(validation.metrics) if validation is not None else {},
        target=params.get("target"),
        workload=params.get("workload"),
        limits=values["limits"].model_dump(exclude_none=True),
        scores=dict(evaluation.metrics) if evaluation is not None else {},
        measured=dict(verification.metrics) if verification is not None else {},
        flow_run_id=flow_run_id,
        artifacts=refs,
    )


@flow(name="compress")
def compress(
    teacher: str = "default",
    target: str = "cpu-local/hf-eager/fp32",
    workload: str = "local-coding-cpu",
    limits: Limits | None = None,
    budget_fraction: float | None = None,
    baseline: bool = False,
    method: str = "autocompress",
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
    """
    from autocompress.model_source import resolve_model_dir
    from autocompress.paths import default_corpus_dir

    started = time.perf_counter()
    limits = Limits.model_validate(limits or {}) if not isinstance(limits, Limits) else limits
    if limits.is_empty() and budget_fraction is None:
        raise AutoCompressError("no limit to compress for",
                                "give a limit (e.g. --max-tpot-ms 3) or --budget-fraction 0.6")
    steps = steps_for(method)
    options = seeded(options, seed)
    eval_config = check_eval_config(eval_config)
    params = {"teacher": teacher, "target": target, "workload": workload,
              "limits": limits.model_dump(exclude_none=True),
              "budget_fraction": budget_fraction, "baseline": baseline, "method": method,
              "seed": seed,
              "eval_tasks": eval_tasks, "eval_limit": eval_limit, "options": options or {}}
    tags = {"autocompress.trigger_event": trigger_event} if trigger_event else None
    with tracked_flow("compress", params, experiment, store, track, tags=tags) as run:
        report = new_report("compress", run)
        values: dict[str, Any] = {
            **params,
            "limits": limits,
            "teacher_dir": resolve_model_dir(teacher),
            "corpus_dir": Path(corpus_dir) if corpus_dir else default_corpus_dir(),
            "eval_config": eval_config,
            "machine": this_machine(),
            # options["<stage>"] reaches that stage as its `options` input.
            **{f"{name}_options": (options or {}).get(name, {}) for name in STAGE_OPTIONS},
        }
        steps, register_step, chain = steps_for_target(target, steps)
        timed = [s.name for s in steps].index("teacher_verification") + 1
        run_steps(steps[:timed], values, run, report, placement)
        if limits_origin:
            check_same_host(limits, values["teacher_verification"].metrics,
                            limits_origin.get("teacher_measured") or {},
                            where=limits_origin.get("from", "another run"))
        run_steps(steps[timed:], values, run, report, placement)
        if baseline:
            run_steps(BASELINE_STEPS, values, run, report, placement)
        verification = values["verification"]
        if not verification.metrics.get("ok"):
            report.notes.append("the compressed model misses its limits when measured "
                                f"(see {verification.uri}); not registered")
        elif register_as:
            values["register_as"] = register_as
            values["lineage"] = build_lineage(values, params, run.flow_run_id, chain)
            values["lineage"].trigger_event = trigger_event
            run_steps([register_step], values, run, report)
        report.outputs = {step.name: values[step.name]
                          for step in [*steps, *BASELINE_STEPS, register_step]
                          if step.name in values}
        return finish_report(report, run, started)
