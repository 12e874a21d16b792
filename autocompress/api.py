"""The Python API: search an architecture, or compress a teacher end to end.

    import autocompress

    found = autocompress.search("default", limits=autocompress.Limits(max_tpot_ms=3.0))
    result = autocompress.compress("default", budget_fraction=0.6, out="compressed")

``compress`` runs the recipe (``autocompress.recipe``) in this process: fit the cost
model and gate it, resolve the limits, time the teacher, importance → search → prune →
distill → evaluate → verify, each step the library call that the Prefect stage of the
same name makes, with the same settings (``stage_config.stage_settings``, teacher-size
defaults included). It has no cache, no retries, no MLflow and no registry: the
``compress`` flow (``autocompress run``) adds those.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autocompress import recipe
from autocompress.arch import ArchSpec
from autocompress.arch_search.run import SearchConfig, SearchContext
from autocompress.costmodel.model import CostModel
from autocompress.costmodel.validate import ValidationReport
from autocompress.costmodel.workload import Workload
from autocompress.defaults import DEFAULT_METHOD, DEFAULT_TARGET, DEFAULT_WORKLOAD
from autocompress.distill import DistillConfig, DistillResult
from autocompress.evaluation.suite import EvalConfig
from autocompress.importance import CalibrationConfig
from autocompress.limits import Limits
from autocompress.stage_config import (
    EVAL_STAGE,
    FitOptions,
    ValidationOptions,
    VerifyOptions,
    stage_settings,
)
from autocompress.verify import VerifyReport

# What a teacher may be: a model directory, ``default``, or an in-memory (model, tokenizer).
TeacherLike = str | Path | tuple[Any, Any]
Method = Literal["autocompress", "greedy", "random", "minitron", "minitron-scored",
                 "mip"]  # defaults.METHODS (tests/test_api.py checks they agree)


class SearchResult(BaseModel):
    """The architecture a search picked, with the cost model's view of it."""

    method: Method
    arch: ArchSpec
    limits: Limits = Field(description="The limits searched for (budget fraction resolved).")
    predicted: dict[str, float] = Field(description="The cost model's metrics of ``arch``.")
    teacher_predicted: dict[str, float]
    params: int
    teacher_params: int
    cost_model: str = Field(description="Version of the cost model that priced it.")
    report: dict[str, Any] = Field(description="Everything `autocompress search` writes.")


class CompressConfig(BaseModel):
    """Settings of each step of ``compress``, named as the flow's ``options`` name them.

    A field left unset takes the flow's default, which for importance, the search, the
    distillation and the benchmark suite follows the teacher's size (``stage_sizes``).
    """

    model_config = ConfigDict(extra="forbid")

    costmodel: FitOptions = Field(default_factory=FitOptions,
                                  description="The cost-model fit (unused when a "
                                  "``cost_model`` is passed).")
    validation: ValidationOptions = Field(default_factory=ValidationOptions,
                                          description="The cost-model gate.")
    importance: CalibrationConfig = Field(default_factory=CalibrationConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    distill: DistillConfig | None = Field(None, description="None: the recipe's budget.")
    evaluate: bool = True
    eval_tasks: str | None = Field(None, description="Benchmark tasks (None: the local suite).")
    eval_limit: int | None = Field(None, description="Items per task (None: all).")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    verify: VerifyOptions | None = Field(default_factory=VerifyOptions,
                                         description="None: do not verify the model.")

    def settings(self, stage: str, teacher_params: int) -> Any:
        """``stage``'s config: the fields set here over the recipe's defaults."""
        field = "eval" if stage == EVAL_STAGE else stage
        given = getattr(self, field)
        options = given.model_dump(exclude_unset=True) if given is not None else None
        return stage_settings(stage, options, teacher_params)


class CompressResult(BaseModel):
    """What ``compress`` produced: the model directory and each step's record."""

    out_dir: Path
    search: SearchResult
    distill: DistillResult
    validation: ValidationReport | None = Field(
        None, description="The cost-model gate's report (None: the target cannot be timed "
        "here, or a ``cost_model`` was passed).")
    teacher_verification: VerifyReport = Field(description="The teacher timed on the target.")
    evaluation: dict[str, Any] | None = Field(None, description="The benchmark suite's JSON.")
    verification: VerifyReport | None = Field(None, description="Measured vs limits.")

    @property
    def verified(self) -> bool | None:
        """Whether the measured model meets its limits (None: not verified)."""
        return None if self.verification is None else self.verification.ok


def search(
    teacher: TeacherLike,
    target: str = DEFAULT_TARGET,
    workload: str | Workload = DEFAULT_WORKLOAD,
    limits: Limits | None = None,
    config: SearchConfig | None = None,
    *,
    budget_fraction: float | None = None,
    method: Method = DEFAULT_METHOD,
    corpus: str | Path | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
) -> SearchResult:
    """The architecture that keeps the most quality within ``limits`` on ``target``.

    Only the search step of the recipe: the cost model is ``cost_model``, else the
    target's saved fit (``autocompress costmodel fit``), else the analytic model, and is
    not gated; ``compress`` runs the whole recipe.

    Args:
        teacher: a model directory, ``default`` (the bundled teacher) or ``(model, tokenizer)``.
        target: ``HARDWARE/ENGINE/DTYPE``, e.g. ``cpu-local/hf-eager/fp32``.
        workload: a workload preset (``autocompress costmodel presets``) or a ``Workload``.
        limits: latency / throughput / memory limits.
        config: a ``SearchConfig``; None: the defaults.
        budget_fraction: add a limit at this fraction of the teacher's predicted cost on
            the workload's main metric (e.g. 0.6).
        method: ``autocompress`` (DNAS + exact repair), ``greedy`` (repair from the
            teacher, no DNAS), ``random`` (random search), ``minitron`` (the fair
            homogeneous baseline matched to the same limits), ``minitron-scored``
            (Minitron's homogeneous grid through greedy's selection) or ``mip`` (block
            scores and costs solved exactly as an integer program).
        corpus: corpus directory (default: the standard corpus, built on first use).
        cost_model: default: the target's saved fit, else the analytic model.
    """
    config = config or SearchConfig()
    ctx = SearchContext.build(teacher, target, workload, config=config, corpus_dir=corpus,
                              cost_model=cost_model, progress=progress, limits=limits,
                              budget_fraction=budget_fraction)
    return _search(ctx, ctx.resolve_limits(limits, budget_fraction), method, config, progress)


def compress(
    teacher: TeacherLike,
    target: str = DEFAULT_TARGET,
    workload: str | Workload = DEFAULT_WORKLOAD,
    limits: Limits | None = None,
    config: CompressConfig | None = None,
    *,
    out: str | Path,
    budget_fraction: float | None = None,
    method: Method = DEFAULT_METHOD,
    corpus: str | Path | None = None,
    cost_model: CostModel | None = None,
    limits_origin: dict[str, Any] | None = None,
    progress: bool = False,
) -> CompressResult:
    """Compress ``teacher`` to meet ``limits`` on ``target``; the model is written to ``out``.

    The recipe's steps in this process (see the module docstring). Arguments as for
    ``search``; ``config`` holds every step's settings; ``cost_model``: skip the fit and
    the gate and use this one; ``limits_origin``: where ``limits`` were set, checked
    right after timing the teacher (as ``autocompress run`` does).
    """
    from autocompress.data.corpus import ensure_corpus
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import load_causal_lm

    config = config or CompressConfig()
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="autocompress-teacher-") as scratch:
        if isinstance(teacher, tuple):  # timing and distillation read a directory
            model, tokenizer = teacher
            teacher_dir = Path(scratch)
            model.save_pretrained(teacher_dir)
            tokenizer.save_pretrained(teacher_dir)
        else:
            teacher_dir = resolve_model_dir(teacher)
            model, tokenizer = load_causal_lm(teacher_dir)
        corpus_dir = ensure_corpus(Path(corpus) if corpus else None)
        return _run_recipe(model, tokenizer, teacher_dir, corpus_dir, target, workload, limits,
                           budget_fraction, method, config, out, cost_model, limits_origin,
                           progress)


def _run_recipe(model: Any, tokenizer: Any, teacher_dir: Path, corpus_dir: Path, target: str,
                workload: str | Workload, limits: Limits | None,
                budget_fraction: float | None, method: Method, config: CompressConfig,
                out: Path, cost_model: CostModel | None, limits_origin: dict[str, Any] | None,
                progress: bool) -> CompressResult:
    """The recipe's steps, in the flow's order (``recipe.STEPS``)."""
    from autocompress.distill import DistillData, distill
    from autocompress.evaluation.suite import evaluate
    from autocompress.prune import prune
    from autocompress.verify import verify

    params = sum(p.numel() for p in model.parameters())
    validation = None
    if cost_model is None:  # steps 2-3: fit the cost model here, and gate it
        cost_model = recipe.fit_cost_model(target, model.config, workload,
                                           config.settings("costmodel", params))
        validation, failures = recipe.gate(cost_model, model.config, workload,
                                           config.settings("validation", params))
        if failures:
            raise recipe.gate_error(cost_model, failures, "CompressResult.validation")
    search_settings = config.settings("search", params)
    # Limits nothing in the space can meet stop here, before importance and the search.
    resolved = recipe.reachable_limits(model.config, cost_model, workload, limits,
                                       search_settings, budget_fraction)
    importance_settings = config.settings("importance", params).model_copy(
        update={"corpus_dir": str(corpus_dir)})
    ctx = SearchContext.build((model, tokenizer), target, workload, config=search_settings,
                              corpus_dir=corpus_dir, cost_model=cost_model, progress=progress,
                              importance=recipe.teacher_importance(model, tokenizer,
                                                                   importance_settings,
                                                                   progress))
    ctx.teacher_dir = str(teacher_dir)
    verify_settings = config.settings("verify", params) if config.verify else VerifyOptions()
    # The teacher is timed before the search: its reading checks carried limits early.
    teacher_timing = verify(teacher_dir, cost_model.target, ctx.workload, resolved,
                            cost_model=cost_model, **verify_settings.model_dump())
    recipe.check_teacher_reading(resolved, teacher_timing.measured, limits_origin)
    found = _search(ctx, resolved, method, search_settings, progress)
    student = prune(model, ctx.importance, found.arch)
    distill_settings = config.settings("distill", params)
    data = DistillData.from_corpus(tokenizer, corpus_dir, distill_settings.seq_len,
                                   heldout_windows=distill_settings.eval_batches
                                   * distill_settings.batch_size)
    distilled = distill(model, student, data, distill_settings, out, tokenizer=tokenizer)
    evaluation = None
    if config.evaluate:
        evaluation = evaluate(student, tokenizer, tasks=config.eval_tasks,
                              limit=config.eval_limit, corpus_dir=corpus_dir,
                              config=config.settings(EVAL_STAGE, params), model_name=method)
    verification = None
    if config.verify:
        verification = verify(out, cost_model.target, ctx.workload, resolved,
                              cost_model=cost_model, **verify_settings.model_dump())
    return CompressResult(out_dir=out, search=found, distill=distilled, validation=validation,
                          teacher_verification=teacher_timing, evaluation=evaluation,
                          verification=verification)


def _search(ctx: SearchContext, limits: Limits, method: Method, config: SearchConfig,
            progress: bool) -> SearchResult:
    from autocompress.arch_search.run import run_method

    outcome = run_method(ctx, method, limits, config, progress=progress)
    report = outcome.report(ctx)
    return SearchResult(
        method=method, arch=outcome.spec, limits=limits,
        predicted={k: float(v) for k, v in report["predicted"].items()},
        teacher_predicted={k: float(v) for k, v in ctx.teacher_costs().items()},
        params=report["params"], teacher_params=report["teacher_params"],
        cost_model=ctx.cost_model.version, report=report)
