"""Search stages (boxes 5–6 of ``flows/compress.py``): DNAS + discretize/repair, the Minitron
pick, and the ablations (greedy repair from the teacher, random search).

All run on the same ``SearchContext`` (teacher, importance, calibration data,
cost model of the target), so the baseline and the ablations are matched to the
same hardware budget with the same importance. The output is a directory with
``arch.json`` (the ArchSpec) and the library's report ``arch.search.json`` (+
trajectory JSON/PNG for the search).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig

from autocompress.arch_search import budgets
from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import SearchContext, check_limits_early
from autocompress.arch_search.run import method_to_file, minitron_to_file, search_to_file
from autocompress.artifacts import ArtifactRef
from autocompress.costmodel import CostModel, get_workload
from autocompress.limits import Limits
from autocompress.modeling import arch_spec_of
from autocompress.stage_config import stage_settings
from tasks.stage import StageContext, stage


def _context(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
             importance: ArtifactRef, costmodel: ArtifactRef, target: str, workload: str,
             options: dict | None):
    # Unset sizes follow the teacher's size (stage_sizes); explicit options win.
    config: SearchConfig = stage_settings("search", options, teacher.metrics.get("params"))
    ctx.log_params({"search": config.model_dump(mode="json")})
    search_ctx = SearchContext.build(
        str(ctx.fetch(teacher)), target, workload, config=config,
        importance=ctx.fetch(importance), corpus_dir=ctx.working_copy(corpus),
        cost_model=CostModel.load(ctx.fetch(costmodel)), progress=True)
    return search_ctx, config


def _arch_metrics(report: dict) -> dict[str, float]:
    metrics = {f"predicted_{k}": float(v) for k, v in (report.get("predicted") or {}).items()
               if isinstance(v, int | float)}
    for key in ("params", "teacher_params"):
        if report.get(key) is not None:
            metrics[key] = float(report[key])
    metrics["meets_limits"] = float(bool(report.get("meets_limits")))
    if report.get("scored_candidates") is not None:
        metrics["scored_candidates"] = float(report["scored_candidates"])
    return metrics


@stage("search", retries=1)
def search_arch(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                importance: ArtifactRef, costmodel: ArtifactRef, validation: ArtifactRef,
                target: str, workload: str, limits: Limits,
                options: dict | None = None) -> ArtifactRef:
    """DNAS under the cost model's constraints, then repair to meet ``limits`` exactly.

    ``validation`` is an input so that the search runs only behind the gate.
    The DNAS checkpoints live in the stage's checkpoint dir: a re-run resumes.
    """
    search_ctx, config = _context(ctx, teacher, corpus, importance, costmodel, target,
                                  workload, options)
    out_dir = ctx.scratch() / "arch"
    out_dir.mkdir()
    report = search_to_file(search_ctx, limits, out_dir / "arch.json", config,
                            work_dir=ctx.checkpoint_dir() / "dnas", progress=True)
    for png in Path(out_dir).glob("*.png"):
        ctx.log_file(png)
    if report.get("timing"):  # the machine while the pick was timed (busy: a warning)
        ctx.log_params({"timing": {k: v for k, v in report["timing"].items()
                                   if k != "conditions"}})
    return ctx.publish(out_dir, "archspec", metrics=_arch_metrics(report),
                       meta={"method": "autocompress-dnas"})


@stage("ablation", retries=1)
def ablation_arch(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                  importance: ArtifactRef, costmodel: ArtifactRef, validation: ArtifactRef,
                  target: str, workload: str, limits: Limits, method: str,
                  options: dict | None = None) -> ArtifactRef:
    """An ablation of the search (``greedy`` or ``random``, ``search.ablations``) under the
    same cost model, limits, scores and measured loop; behind the validation gate."""
    search_ctx, config = _context(ctx, teacher, corpus, importance, costmodel, target,
                                  workload, options)
    out_dir = ctx.scratch() / "arch"
    out_dir.mkdir()
    report = method_to_file(search_ctx, method, limits, out_dir / "arch.json", config,
                            progress=True)
    return ctx.publish(out_dir, "archspec", metrics=_arch_metrics(report),
                       meta={"method": method})


@stage("minitron", retries=1)
def minitron_arch(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                  importance: ArtifactRef, costmodel: ArtifactRef, target: str, workload: str,
                  limits: Limits, options: dict | None = None) -> ArtifactRef:
    """The Minitron baseline architecture matched to the same limits (same importance)."""
    search_ctx, config = _context(ctx, teacher, corpus, importance, costmodel, target,
                                  workload, options)
    out_dir = ctx.scratch() / "arch"
    out_dir.mkdir()
    report = minitron_to_file(search_ctx, out_dir / "arch.json", limits=limits, config=config,
                              progress=True)
    return ctx.publish(out_dir, "archspec", metrics=_arch_metrics(report),
                       meta={"method": "minitron"})


@stage("limits")
def resolve_limits(ctx: StageContext, teacher: ArtifactRef, costmodel: ArtifactRef,
                   workload: str, limits: Limits, budget_fraction: float | None,
                   search_options: dict | None = None) -> Limits:
    """``search.budgets.resolve_limits`` with the teacher's cost predicted by the flow's
    cost model. With ``search_options`` (the search stage's options), also
    ``check_limits_early``: limits no architecture of that space meets are refused
    here, before importance and the search."""
    wl = get_workload(workload)
    predicted: dict[str, float] = {}
    model = CostModel.load(ctx.fetch(costmodel))
    config = AutoConfig.from_pretrained(ctx.fetch(teacher))

    def teacher_costs() -> dict[str, float]:
        predicted.update(model.predict(arch_spec_of(config), wl).metrics())
        return predicted

    resolved = budgets.resolve_limits(limits, budget_fraction, teacher_costs, wl)
    if predicted:
        ctx.log_params({"limits": resolved.model_dump(exclude_none=True),
                        "teacher_predicted": predicted})
    if search_options is not None:
        search: SearchConfig = stage_settings("search", search_options,
                                              teacher.metrics.get("params"))
        check_limits_early(arch_spec_of(config), search.space, model, wl, resolved)
    return resolved
