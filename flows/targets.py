"""Flows over several targets or budgets, composed from the ``compress`` flow's steps.

- ``compress_joint``: one architecture for several targets (``autocompress run --target A
  --target B``): a cost model, validation gate and limits per target, one joint search
  (``search.multitarget``), one prune/distill/evaluate, and a verification on every target.
- ``pareto``: a family along the accuracy-cost front of one target from one search
  (``autocompress run --budget-fraction 0.3,0.5,0.7``): the shared stages once, one ``family``
  search, then prune/distill/evaluate/verify per budget.
- ``targets_matrix``: each column's own architecture (a column: a target, its workload and
  a budget) and, on measured columns, the homogeneous one of the same parameter count, each
  distilled once per seed; then every architecture measured on every measurable column
  (``verify`` with that column's cost model and limits) and predicted on the others: the
  cross-target matrix of ``bench/targets.py``.

A step that exists once per target or budget is the ``compress`` flow's step with a
suffix: ``costmodel.hf-eager-fp32``, ``arch.b0.30`` (``keyed``). Every stage is the same
cached task as in ``compress``, so stages shared with other runs come from the cache.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import BaseModel, Field, ValidationError

from autocompress.artifacts import fetch
from autocompress.costmodel import Target, get_workload
from autocompress.defaults import DEFAULT_TARGET, DEFAULT_WORKLOAD
from autocompress.errors import AutoCompressError, invalid_input
from autocompress.limits import Limits
from autocompress.model_source import resolve_model_dir
from flows.common import FlowReport, Step, finish_report, new_report, run_steps, tracked_flow
from flows.compress import STAGE_OPTIONS, seeded
from tasks.costmodel import fit_costmodel, profile_target, this_machine, validate_costmodel
from tasks.data import prepare_corpus
from tasks.distill import distill_model
from tasks.evaluation import evaluate_model
from tasks.prune import prune_model, score_importance
from tasks.search import resolve_limits, search_arch
from tasks.targets import (
    family_member,
    family_search,
    joint_search,
    params_matched_arch,
    predict_arch,
)
from tasks.teacher import publish_teacher
from tasks.verify import verify_model

# The compress flow's stages wired by name (inputs: flow values or earlier steps' outputs),
# so that this module can re-key them per target or per model (``keyed``).
EVAL = dict(corpus="corpus", tasks="eval_tasks", config="eval_config", limit="eval_limit",
            teacher="teacher")
STEPS = {step.name: step for step in [
    Step("teacher", publish_teacher, teacher_dir="teacher_dir", label="teacher"),
    Step("corpus", prepare_corpus, corpus_dir="corpus_dir"),
    Step("profile", profile_target, target="target", machine="machine"),
    Step("costmodel", fit_costmodel, target="target", teacher="teacher", profile="profile",
         options="costmodel_options", workload="workload"),
    Step("validation", validate_costmodel, costmodel="costmodel", teacher="teacher",
         workload="workload", options="validation_options"),
    Step("limits", resolve_limits, teacher="teacher", costmodel="costmodel",
         workload="workload", limits="limits", budget_fraction="budget_fraction"),
    Step("importance", score_importance, teacher="teacher", corpus="corpus",
         options="importance_options"),
    Step("arch", search_arch, validation="validation", teacher="teacher", corpus="corpus",
         importance="importance", costmodel="costmodel", target="target",
         workload="workload", limits="limits", options="search_options"),
    Step("pruned", prune_model, teacher="teacher", arch="arch", importance="importance"),
    Step("model", distill_model, teacher="teacher", student="pruned", corpus="corpus",
         options="distill_options"),
    Step("teacher_eval", evaluate_model, model="teacher", **EVAL),
    Step("evaluation", evaluate_model, model="model", **EVAL),
]}
SHARED = ("teacher", "corpus", "importance")
# Steps that exist once per target (their outputs and the inputs of these names are keyed).
PER_TARGET = ("target", "workload", "profile", "costmodel", "validation", "limits",
              "teacher_verification", "verification")
# Steps that exist once per member of a family or architecture of the matrix.
PER_MODEL = ("arch", "pruned", "model", "evaluation")


def target_label(target: str) -> str:
    """``cpu-local/llama.cpp/q8_0`` -> ``llama.cpp-q8_0`` (a step-name suffix)."""
    return target.removeprefix("cpu-local/").replace("/", "-")


def keyed(step: Step, key: str, names: tuple[str, ...]) -> Step:
    """``step`` for one target or budget: its output and its inputs named in ``names`` get
    the suffix ``.key``."""
    inputs = {param: f"{src}.{key}" if src in names else src
              for param, src in step.inputs.items()}
    return Step(f"{step.name}.{key}", step.stage, **inputs)


def base_values(teacher: str, workload: str, options: dict | None, eval_tasks, eval_limit,
                corpus_dir: str | None) -> dict[str, Any]:
    """The flow parameters every step reads (``compress``'s, without target and limits)."""
    from autocompress.paths import default_corpus_dir

    return {"teacher": teacher, "teacher_dir": resolve_model_dir(teacher), "workload": workload,
            "corpus_dir": Path(corpus_dir) if corpus_dir else default_corpus_dir(),
            "eval_tasks": eval_tasks, "eval_limit": eval_limit, "eval_config": {},
            "machine": this_machine(), "method": "autocompress", "no_limits": Limits(),
            **{f"{name}_options": (options or {}).get(name, {}) for name in STAGE_OPTIONS}}


def target_steps(target: str, values: dict[str, Any], budget_fraction: float | None,
                 limits: Limits, key: str | None = None, workload: str | None = None
                 ) -> list[Step]:
    """Profile, cost model, gate and limits of one target (values get its parameters);
    ``key`` names its steps (default: the target's label), ``workload`` its workload
    (default: the flow's)."""
    key = key or target_label(target)
    values[f"target.{key}"] = target
    values[f"workload.{key}"] = workload or values["workload"]
    values[f"limits_in.{key}"] = limits
    values[f"budget_fraction.{key}"] = budget_fraction
    limits_step = keyed(STEPS["limits"], key, PER_TARGET)
    limits_step.inputs.update(limits=f"limits_in.{key}", budget_fraction=f"budget_fraction.{key}")
    return [keyed(STEPS[name], key, PER_TARGET) for name in ("profile", "costmodel",
                                                             "validation")] + [limits_step]


def verify_step(name: str, model: str, target: str, key: str | None = None) -> Step:
    """Verify ``model`` (a step's output) on ``target`` (the steps of ``key``, default the
    target's label) with its cost model, workload and limits."""
    key = key or target_label(target)
    return Step(name, verify_model, model=model, costmodel=f"costmodel.{key}",
                target=f"target.{key}", workload=f"workload.{key}", limits=f"limits.{key}",
                machine="machine", options="verify_options")


def model_steps(key: str, arch_step: Step | None = None) -> list[Step]:
    """Prune, distill, evaluate one architecture (``arch.key``)."""
    steps = [keyed(STEPS[name], key, PER_MODEL) for name in ("pruned", "model", "evaluation")]
    return ([arch_step] if arch_step else []) + steps


def _flow_values(teacher, workload, options, seed, eval_tasks, eval_limit, corpus_dir):
    options = seeded(options, seed)
    return options, base_values(teacher, workload, options, eval_tasks, eval_limit, corpus_dir)


def _shared_steps(teacher_eval: bool = True) -> list[Step]:
    return [STEPS[name] for name in SHARED] + ([STEPS["teacher_eval"]] if teacher_eval else [])


# ------------------------------------------------------------------ one search, many targets


@flow(name="compress-joint")
def compress_joint(
    teacher: str = "default",
    targets: list[str] | None = None,
    workload: str = DEFAULT_WORKLOAD,
    limits: Limits | None = None,
    budget_fraction: float | None = None,
    seed: int | None = None,
    eval_tasks: str | None = None,
    eval_limit: int | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    corpus_dir: str | None = None,
    experiment: str = "autocompress",
    store: str | None = None,
    track: bool = True,
) -> FlowReport:
    """One architecture that meets every target's limits (each target's ``limits`` plus
    ``budget_fraction`` of the teacher's cost there), verified on every target."""
    started = time.perf_counter()
    targets = list(targets or [])
    if len(targets) < 2:
        raise AutoCompressError("a joint run needs at least two targets",
                                hint="give --target twice or more")
    limits = Limits.model_validate(limits or {}) if not isinstance(limits, Limits) else limits
    options, values = _flow_values(teacher, workload, options, seed, eval_tasks, eval_limit,
                                   corpus_dir)
    params = {"teacher": teacher, "targets": targets, "workload": workload,
              "limits": limits.model_dump(exclude_none=True), "budget_fraction": budget_fraction,
              "seed": seed, "eval_limit": eval_limit, "options": options}
    with tracked_flow("compress-joint", params, experiment, store, track) as run:
        report = new_report("compress-joint", run)
        steps = _shared_steps()
        for target in targets:
            steps += target_steps(target, values, budget_fraction, limits)
        run_steps(steps, values, run, report)
        keys = [target_label(t) for t in targets]
        values["targets"] = targets
        values["costmodels"] = [values[f"costmodel.{k}"] for k in keys]
        values["validations"] = [values[f"validation.{k}"] for k in keys]
        values["joint_limits"] = [values[f"limits.{k}"] for k in keys]
        joint = Step("arch", joint_search, teacher="teacher", corpus="corpus",
                     importance="importance", costmodels="costmodels",
                     validations="validations", targets="targets", workload="workload",
                     limits="joint_limits", options="search_options")
        tail = [joint, STEPS["pruned"], STEPS["model"], STEPS["evaluation"]]
        tail += [verify_step(f"verification.{target_label(t)}", "model", t) for t in targets]
        run_steps(tail, values, run, report)
        missed = [t for t in targets
                  if not values[f"verification.{target_label(t)}"].metrics.get("ok")]
        if missed:
            report.notes.append(f"the joint model misses its limits when measured on {missed}")
        report.outputs = {s.name: values[s.name] for s in [*steps, *tail]}
        return finish_report(report, run, started)


# ------------------------------------------------------------------ a Pareto family


def budget_label(fraction: float) -> str:
    return f"b{fraction:.2f}"


@flow(name="pareto")
def pareto(
    teacher: str = "default",
    target: str = DEFAULT_TARGET,
    workload: str = DEFAULT_WORKLOAD,
    budgets: list[float] | None = None,
    seed: int | None = None,
    eval_tasks: str | None = None,
    eval_limit: int | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    corpus_dir: str | None = None,
    experiment: str = "autocompress",
    store: str | None = None,
    track: bool = True,
) -> FlowReport:
    """One compressed model per budget fraction in ``budgets``, from one search."""
    started = time.perf_counter()
    budgets = sorted(set(budgets or []), reverse=True)
    if len(budgets) < 2:
        raise AutoCompressError("a Pareto family needs at least two budgets",
                                hint="e.g. --budget-fraction 0.3,0.5,0.7")
    options, values = _flow_values(teacher, workload, options, seed, eval_tasks, eval_limit,
                                   corpus_dir)
    params = {"teacher": teacher, "target": target, "workload": workload, "budgets": budgets,
              "seed": seed, "eval_limit": eval_limit, "options": options}
    key = target_label(target)
    with tracked_flow("pareto", params, experiment, store, track) as run:
        report = new_report("pareto", run)
        labels = [budget_label(b) for b in budgets]
        steps = _shared_steps(teacher_eval=False) + target_steps(target, values, None,
                                                                 Limits())[:3]
        limit_steps = []
        for label, fraction in zip(labels, budgets, strict=True):
            values[f"fraction.{label}"] = fraction
            limit_steps.append(Step(f"limits.{label}", STEPS["limits"].stage, teacher="teacher",
                                    costmodel=f"costmodel.{key}", workload="workload",
                                    limits="no_limits", budget_fraction=f"fraction.{label}"))
        run_steps(steps + limit_steps, values, run, report)
        values.update(labels=labels, target=target,
                      family_limits=[values[f"limits.{label}"] for label in labels])
        family = Step("family", family_search, teacher="teacher", corpus="corpus",
                      importance="importance", costmodel=f"costmodel.{key}",
                      validation=f"validation.{key}", target="target", workload="workload",
                      limits="family_limits", labels="labels", options="search_options")
        tail = [family]
        for label in labels:
            values[f"label.{label}"] = label
            member = Step(f"arch.{label}", family_member, family="family",
                          label=f"label.{label}")
            tail += model_steps(label, member)
            values[f"target.{label}"] = target
            tail.append(Step(f"verification.{label}", verify_model, model=f"model.{label}",
                             costmodel=f"costmodel.{key}", target="target",
                             workload="workload", limits=f"limits.{label}",
                             machine="machine", options="verify_options"))
        run_steps(tail, values, run, report)
        report.outputs = {s.name: values[s.name] for s in [*steps, *limit_steps, *tail]}
        return finish_report(report, run, started)


# ------------------------------------------------------------------ the cross-target matrix


class Column(BaseModel):
    """A column of the matrix: a target, the workload it serves (``PRESET`` or
    ``PRESET:METRIC``, whose main metric the budget is on) and the budget, a fraction of
    the teacher's predicted main metric there."""

    target: str
    workload: str = DEFAULT_WORKLOAD
    budget_fraction: float = Field(0.5, gt=0)

    @classmethod
    def parse(cls, text: str) -> Column:
        """``TARGET[@WORKLOAD][=FRACTION]``, e.g. ``cpu-local/llama.cpp/q4_0@datacenter-cpu:
        memory_gb=0.6``."""
        head, _, fraction = text.partition("=")
        target, _, workload = head.partition("@")
        try:
            column = cls(target=target, workload=workload or DEFAULT_WORKLOAD,
                         **({"budget_fraction": fraction} if fraction else {}))
        except ValidationError as err:
            raise invalid_input(err, f"column {text!r}", "write TARGET@WORKLOAD=FRACTION "
                                "with a fraction above 0, e.g. cpu-local/llama.cpp/q4_0@"
                                "interactive-cpu=0.5") from None
        Target.parse(column.target), get_workload(column.workload)  # named errors, early
        return column

    @property
    def label(self) -> str:
        """A step-name suffix: ``llama.cpp-q4_0.datacenter-cpu-memory_gb``."""
        return f"{target_label(self.target)}.{self.workload.replace(':', '-')}"

    @property
    def measured(self) -> bool:
        return Target.parse(self.target).measurable

    @property
    def metric(self) -> str:
        return get_workload(self.workload).main_metric


class MatrixCell(BaseModel):
    """Row ``arch`` (an architecture of the matrix) on column ``target`` (a column label):
    measured there (``verify``) or predicted (a spec-sheet cost model)."""

    arch: str
    target: str
    measured: bool
    ok: bool | None = None
    costs: dict[str, float] = Field(default_factory=dict)
    predicted: dict[str, float] = Field(default_factory=dict)
    limits: dict[str, float] = Field(default_factory=dict)
    noise: dict[str, float] = Field(default_factory=dict)
    refused: str | None = None  # why the column's engine cannot serve it exactly (not timed)


PARAMS = "params"  # the suffix of a column's params-matched row


def row_steps(row: str, arch_step: Step, seeds: list[int]) -> list[Step]:
    """An architecture's row: the arch, its pruned teacher, and per distillation seed a
    model and its evaluation (``model.ROW.sSEED``, ``evaluation.ROW.sSEED``)."""
    steps = [arch_step, keyed(STEPS["pruned"], row, PER_MODEL)]
    model, evaluation = STEPS["model"], STEPS["evaluation"]
    for s in seeds:
        steps.append(Step(f"model.{row}.s{s}", model.stage, **{
            **model.inputs, "student": f"pruned.{row}", "options": f"distill_options.s{s}"}))
        steps.append(Step(f"evaluation.{row}.s{s}", evaluation.stage,
                          **{**evaluation.inputs, "model": f"model.{row}.s{s}"}))
    return steps


@flow(name="targets-matrix")
def targets_matrix(
    teacher: str = "default",
    columns: list[Column] | None = None,
    seeds: list[int] | None = None,
    params_matched: bool = True,
    seed: int | None = None,
    eval_tasks: str | None = None,
    eval_limit: int | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    corpus_dir: str | None = None,
    experiment: str = "autocompress",
    store: str | None = None,
    track: bool = True,
) -> dict[str, Any]:
    """Each column's own architecture (searched for its target, workload and budget), and
    for each measured column the homogeneous architecture of the same parameter count
    (``params_matched``); every architecture distilled once per seed of ``seeds`` (default
    ``[seed or 0]``) and evaluated, then measured (``verify``) on every measured column
    and predicted on the others (spec-sheet cost models)."""
    started = time.perf_counter()
    columns = [Column.model_validate(c) for c in columns or []]
    labels = [c.label for c in columns]
    if len(columns) < 2 or len(set(labels)) < len(labels):
        raise AutoCompressError(f"a matrix needs two or more distinct columns, not {labels}",
                                hint="give each column a different target or workload")
    seeds = list(dict.fromkeys(seeds or [seed or 0]))
    options, values = _flow_values(teacher, columns[0].workload, options, seed, eval_tasks,
                                   eval_limit, corpus_dir)
    for s in seeds:
        values[f"distill_options.s{s}"] = {**values["distill_options"], "seed": s}
    params = {"teacher": teacher, "columns": [c.model_dump() for c in columns], "seeds": seeds,
              "params_matched": params_matched, "seed": seed, "eval_limit": eval_limit,
              "options": options}
    with tracked_flow("targets-matrix", params, experiment, store, track) as run:
        report = new_report("targets-matrix", run)
        run_steps(_shared_steps(), values, run, report)
        rows: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        for column in columns:  # each column's own architecture (and its params-matched one)
            key = column.label
            own = dict(values)
            steps = target_steps(column.target, own, column.budget_fraction, Limits(), key,
                                 column.workload)
            arch = keyed(STEPS["arch"], key, PER_TARGET + PER_MODEL)
            plan = {key: row_steps(key, arch, seeds)}
            if params_matched and column.measured:
                matched = Step(f"arch.{key}.{PARAMS}", params_matched_arch, teacher="teacher",
                               corpus="corpus", importance="importance",
                               costmodel=f"costmodel.{key}", arch=f"arch.{key}",
                               target=f"target.{key}", workload=f"workload.{key}",
                               options="search_options")
                plan[f"{key}.{PARAMS}"] = row_steps(f"{key}.{PARAMS}", matched, seeds)
            try:  # a column whose search fails (e.g. unreachable) is reported, not fatal
                run_steps(steps + [s for row in plan.values() for s in row], own, run, report)
            except AutoCompressError as err:
                errors[key] = str(err)
            values.update({k: v for k, v in own.items() if k not in values})
            if key not in errors:
                rows.update({row: {"column": key, "kind": PARAMS if row != key else "own"}
                             for row in plan})
        cells: list[MatrixCell] = []
        refusals = vllm_refusals(columns, rows, values, seeds[0])
        for column in columns:  # every architecture on this column
            key = column.label
            if f"limits.{key}" not in values:
                continue
            for row in rows:
                name = f"cell.{row}.{key}"
                refused = refusals.get(row) if served_by_vllm(column) else None
                if refused:  # e.g. per-layer query heads on vLLM: refused, never timed
                    cells.append(MatrixCell(arch=row, target=key, measured=column.measured,
                                            ok=False, refused=refused))
                    continue
                if column.measured:
                    step = verify_step(name, f"model.{row}.s{seeds[0]}", column.target, key)
                else:
                    step = Step(name, predict_arch, arch=f"arch.{row}",
                                costmodel=f"costmodel.{key}", workload=f"workload.{key}",
                                limits=f"limits.{key}")
                run_steps([step], values, run, report)
                cells.append(_cell(row, key, values[name]))
        flow_report = finish_report(report, run, started)
        return {"columns": [{**c.model_dump(), "label": c.label, "measured": c.measured,
                             "metric": c.metric} | _column_summary(values, c.label)
                            for c in columns if c.label not in errors],
                "rows": {row: {**info, **_row_summary(values, row, seeds)}
                         for row, info in rows.items()},
                "cells": [c.model_dump() for c in cells], "errors": errors, "seeds": seeds,
                "steps": [s.model_dump() for s in flow_report.steps],
                "wall_s": flow_report.wall_s, "mlflow_run_id": flow_report.mlflow_run_id}


def served_by_vllm(column: Column) -> bool:
    """Whether the column's engine serves a nemotron-nas export (vLLM), whose loading rules
    can refuse a row; llama.cpp reads GGUF and PyTorch anything."""
    return Target.parse(column.target).engine.name == "vllm"


def vllm_refusals(columns: list[Column], rows: dict[str, Any], values: dict[str, Any],
                  seed: int) -> dict[str, str | None]:
    """Per row, why vLLM cannot serve its model exactly (None: it can); checked once per
    row, and only when a column is served by vLLM."""
    from autocompress.export import export_refusal

    if not any(served_by_vllm(c) for c in columns):
        return {}
    return {row: export_refusal(fetch(values[f"model.{row}.s{seed}"]), "vllm") for row in rows}


def _cell(row: str, column: str, ref) -> MatrixCell:
    data = json.loads(fetch(ref).read_text())
    if data.get("measured") is False:
        return MatrixCell(arch=row, target=column, measured=False, ok=data["ok"],
                          predicted=_numbers(data["predicted"]), limits=data["limits"])
    return MatrixCell(arch=row, target=column, measured=True, ok=data["ok"],
                      costs=_numbers(data["measured"]), predicted=_numbers(data["predicted"]),
                      limits={k: v for k, v in data["limits"].items() if v is not None},
                      noise=_numbers(data.get("noise") or {}))


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def _column_summary(values: dict[str, Any], key: str) -> dict[str, Any]:
    """A column's limits and the references of its cost model and gate."""
    return {"limits": values[f"limits.{key}"].model_dump(exclude_none=True),
            "costmodel": values[f"costmodel.{key}"].model_dump(mode="json"),
            "validation": values[f"validation.{key}"].model_dump(mode="json")}


def _row_summary(values: dict[str, Any], row: str, seeds: list[int]) -> dict[str, Any]:
    """A row's architecture and, per seed, its model and evaluation (references + scores)."""
    arch = values[f"arch.{row}"]
    return {"arch": arch.model_dump(mode="json"), "params": arch.metrics.get("params"),
            "models": {str(s): values[f"model.{row}.s{s}"].model_dump(mode="json")
                       for s in seeds},
            "evaluations": {str(s): values[f"evaluation.{row}.s{s}"].model_dump(mode="json")
                            for s in seeds},
            "scores": {str(s): dict(values[f"evaluation.{row}.s{s}"].metrics) for s in seeds}}
