"""The Python API: search an architecture, or compress a teacher end to end.

    import autocompress

    found = autocompress.search("default", "cpu-local/hf-eager/fp32", "interactive-cpu",
                                autocompress.Limits(max_tpot_ms=3.0))
    result = autocompress.compress("default", "cpu-local/hf-eager/fp32", "interactive-cpu",
                                   budget_fraction=0.6, out="compressed")

``compress`` runs importance → search → prune → distill → evaluate → verify in this
process, each step the library call that the Prefect stage of the same name makes
(``tasks/``). It has no cache, no retries and no MLflow: the ``compress`` flow
(``autocompress run``) adds those, and fits and validates a cost model for the target
first; here the target's saved fit (``autocompress costmodel fit``) is used, else the
analytic model, or the ``cost_model`` you pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec
from autocompress.arch_search.run import SearchConfig, SearchContext
from autocompress.costmodel.model import CostModel
from autocompress.costmodel.workload import Workload
from autocompress.distill import DEFAULT_TOKENS, DistillConfig, DistillResult
from autocompress.evaluation.suite import EvalConfig
from autocompress.limits import Limits
from autocompress.verify import VerifyReport

# What a teacher may be: a model directory, ``default``, or an in-memory (model, tokenizer).
TeacherLike = str | Path | tuple[Any, Any]
Method = Literal["autocompress", "greedy", "random", "minitron"]


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
    """Settings of each step of ``compress`` (defaults: those of the ``compress`` flow)."""

    model_config = ConfigDict(extra="forbid")

    search: SearchConfig = Field(default_factory=SearchConfig,
                                 description="The search, importance calibration included.")
    distill: DistillConfig = Field(default_factory=lambda: DistillConfig(tokens=DEFAULT_TOKENS))
    evaluate: bool = True
    eval_tasks: str | None = Field(None, description="Benchmark tasks (None: the local suite).")
    eval_limit: int | None = Field(None, description="Items per task (None: all).")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    verify: bool = True
    verify_repeats: int = Field(9, ge=1)
    verify_warmup: int = Field(1, ge=0)
    verify_sessions: int = Field(3, ge=1, description="timing sessions pooled by verify")


class CompressResult(BaseModel):
    """What ``compress`` produced: the model directory and each step's record."""

    out_dir: Path
    search: SearchResult
    distill: DistillResult
    evaluation: dict[str, Any] | None = Field(None, description="The benchmark suite's JSON.")
    verification: VerifyReport | None = Field(None, description="Measured vs limits.")

    @property
    def verified(self) -> bool | None:
        """Whether the measured model meets its limits (None: not verified)."""
        return None if self.verification is None else self.verification.ok


def search(
    teacher: TeacherLike,
    target: str = "cpu-local/hf-eager/fp32",
    workload: str | Workload = "interactive-cpu",
    limits: Limits | None = None,
    config: SearchConfig | None = None,
    *,
    budget_fraction: float | None = None,
    method: Method = "autocompress",
    corpus: str | Path | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
) -> SearchResult:
    """The architecture that keeps the most quality within ``limits`` on ``target``.

    Args:
        teacher: a model directory, ``default`` (the bundled teacher) or ``(model, tokenizer)``.
        target: ``HARDWARE/ENGINE/DTYPE``, e.g. ``cpu-local/hf-eager/fp32``.
        workload: a workload preset (``autocompress costmodel presets``) or a ``Workload``.
        limits: latency / throughput / memory limits.
        config: a ``SearchConfig``; None: the defaults.
        budget_fraction: add a limit at this fraction of the teacher's predicted cost on
            the workload's main metric (e.g. 0.6).
        method: ``autocompress`` (DNAS + exact repair), ``greedy`` (repair from the
            teacher, no DNAS), ``random`` (random search) or ``minitron`` (the fair
            homogeneous baseline matched to the same limits).
        corpus: corpus directory (default: the standard corpus, built on first use).
        cost_model: default: the target's saved fit, else the analytic model.
    """
    ctx, config = _context(teacher, target, workload, config, corpus, cost_model, progress)
    return _search(ctx, limits, budget_fraction, method, config, progress)


def compress(
    teacher: TeacherLike,
    target: str = "cpu-local/hf-eager/fp32",
    workload: str | Workload = "interactive-cpu",
    limits: Limits | None = None,
    config: CompressConfig | None = None,
    *,
    out: str | Path,
    budget_fraction: float | None = None,
    method: Method = "autocompress",
    corpus: str | Path | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
) -> CompressResult:
    """Compress ``teacher`` to meet ``limits`` on ``target``; the model is written to ``out``.

    importance → search → prune → distill → evaluate → verify, in this process.
    Arguments as for ``search``; ``config`` holds every step's settings.
    """
    from autocompress.distill import DistillData, distill
    from autocompress.evaluation.suite import evaluate
    from autocompress.prune import prune
    from autocompress.verify import verify

    config = config or CompressConfig()
    out = Path(out)
    ctx, _ = _context(teacher, target, workload, config.search, corpus, cost_model, progress)
    found = _search(ctx, limits, budget_fraction, method, config.search, progress)
    student = prune(ctx.model, ctx.importance, found.arch)
    data = DistillData.from_corpus(ctx.tokenizer, ctx.corpus_dir, config.distill.seq_len,
                                   heldout_windows=config.distill.eval_batches
                                   * config.distill.batch_size)
    distilled = distill(ctx.model, student, data, config.distill, out, tokenizer=ctx.tokenizer)
    evaluation = None
    if config.evaluate:
        evaluation = evaluate(student, ctx.tokenizer, tasks=config.eval_tasks,
                              limit=config.eval_limit, corpus_dir=ctx.corpus_dir,
                              config=config.eval, model_name=method)
    verification = None
    if config.verify:
        verification = verify(out, ctx.cost_model.target, ctx.workload, found.limits,
                              repeats=config.verify_repeats, warmup=config.verify_warmup,
                              cost_model=ctx.cost_model, sessions=config.verify_sessions)
    return CompressResult(out_dir=out, search=found, distill=distilled, evaluation=evaluation,
                          verification=verification)


def _context(teacher: TeacherLike, target: str, workload: str | Workload,
             config: SearchConfig | None, corpus: str | Path | None,
             cost_model: CostModel | None, progress: bool) -> tuple[SearchContext, SearchConfig]:
    config = config or SearchConfig()
    ctx = SearchContext.build(teacher, target, workload, config=config, corpus_dir=corpus,
                              cost_model=cost_model, progress=progress)
    return ctx, config


def _search(ctx: SearchContext, limits: Limits | None, budget_fraction: float | None,
            method: Method, config: SearchConfig, progress: bool) -> SearchResult:
    from autocompress.arch_search.run import run_method

    limits = ctx.resolve_limits(limits, budget_fraction)
    outcome = run_method(ctx, method, limits, config, progress=progress)
    report = outcome.report(ctx)
    return SearchResult(
        method=method, arch=outcome.spec, limits=limits,
        predicted={k: float(v) for k, v in report["predicted"].items()},
        teacher_predicted={k: float(v) for k, v in ctx.teacher_costs().items()},
        params=report["params"], teacher_params=report["teacher_params"],
        cost_model=ctx.cost_model.version, report=report)
