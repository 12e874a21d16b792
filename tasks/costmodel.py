"""Cost-model stages (boxes 1–3 of ``flows/compress.py``): profile, fit, validate (a gate).

Thin wrappers over ``autocompress.hardware`` and ``autocompress.costmodel``.
Targets that cannot be measured on this machine (GPU spec sheets) get the
analytic model and skip measured validation; the report says so.
"""

from __future__ import annotations

import socket
from typing import Any

from autocompress.artifacts import ArtifactRef
from autocompress.errors import AutoCompressError
from autocompress.stage_config import FitOptions, ValidationOptions, stage_config
from tasks.stage import StageContext, stage


def this_machine() -> str:
    """Identity of the machine a measurement is valid for (part of cache keys)."""
    return socket.gethostname()


@stage("profile")
def profile_target(ctx: StageContext, target: str, machine: str) -> ArtifactRef:
    """Detect and (for measurable targets) benchmark this machine's hardware.

    ``machine`` (the host name) keys the cache: a profile is valid where it was taken.
    """
    from autocompress.costmodel import Target
    from autocompress.hardware import load_profile

    parsed = Target.parse(target)
    profile = load_profile() if parsed.measurable else None
    data: dict[str, Any] = {"target": parsed.name, "measurable": parsed.measurable,
                            "machine": machine,
                            "profile": profile.model_dump(mode="json") if profile else None}
    metrics: dict[str, float] = {}
    if profile is not None and profile.benchmarks is not None:
        bench = profile.benchmarks
        metrics = {"gemm_fp32_tflops": bench.gemm_fp32_flops.median / 1e12,
                   "gemm_bf16_tflops": bench.gemm_bf16_flops.median / 1e12,
                   "copy_bandwidth_gb_s": bench.copy_bandwidth_bytes_s.median / 1e9}
    return ctx.publish_json("profile.json", data, kind="hardware-profile", metrics=metrics)


def _teacher_config(ctx: StageContext, teacher: ArtifactRef):
    from transformers import AutoConfig

    import autocompress.modeling  # noqa: F401  (registers the hetero config class)

    return AutoConfig.from_pretrained(ctx.fetch(teacher))


def _workloads(names: list[str] | None, default: str):
    from autocompress.costmodel import get_workload

    return [get_workload(name) for name in (names or [default])]


@stage("costmodel", retries=1)
def fit_costmodel(ctx: StageContext, target: str, teacher: ArtifactRef, profile: ArtifactRef,
                  options: dict | None = None, workload: str | None = None) -> ArtifactRef:
    """Fit the cost model on measured probes (measurable targets) or take the analytic one.

    ``workload``: the run's workload, fitted alone unless ``options.workloads`` says
    otherwise: every probe is timed on every fitted workload in lockstep with the
    teacher-shaped reference, so each extra workload multiplies the fit's time, and a
    run predicts, searches and verifies on its own workload only.
    """
    from autocompress.costmodel import CostModel, Target
    from autocompress.costmodel.fit import fit_cost_model

    opts = stage_config("costmodel", FitOptions, options)
    parsed = Target.parse(target)
    ctx.log_params({"target": parsed.name, "fit": opts.model_dump()})
    metrics: dict[str, float] = {}
    if parsed.measurable:
        names = opts.workloads or ([workload] if workload else None)
        workloads = _workloads(names, "") if names else None  # None: the fit's CPU presets
        model, rows = fit_cost_model(parsed, _teacher_config(ctx, teacher), workloads=workloads,
                                     n_probes=opts.n_probes, repeats=opts.repeats,
                                     warmup=opts.warmup, seed=opts.seed, paired=opts.paired,
                                     progress=True)
        if model.fit is not None:
            metrics = {f"train_mape.{k}": float(v) for k, v in model.fit.train_mape.items()}
            metrics["fit_seconds"] = float(model.fit.seconds)
    else:
        model = CostModel.analytic(parsed)
    path = ctx.scratch() / "costmodel.json"
    model.save(path)
    return ctx.publish(path, "costmodel", metrics=metrics,
                       meta={"version": model.version, "source": model.source,
                             "target": parsed.name})


@stage("validation", retries=1)
def validate_costmodel(ctx: StageContext, costmodel: ArtifactRef, teacher: ArtifactRef,
                       workload: str, options: dict | None = None) -> ArtifactRef:
    """Measure sampled architectures, score the cost model, and enforce the gate.

    Raises ``AutoCompressError`` when the gate fails: the search must not run on
    a cost model that mis-ranks architectures on this target.
    """
    from autocompress.costmodel import CostModel
    from autocompress.costmodel.gate import judge_with_retries
    from autocompress.costmodel.validate import plot_validation, validate_cost_model

    opts = stage_config("validation", ValidationOptions, options)
    model = CostModel.load(ctx.fetch(costmodel))
    ctx.log_params({"validation": opts.model_dump(), "cost_model": model.version})
    if not model.target.measurable:
        return ctx.publish_json("validation.json", {
            "cost_model": model.version, "measured": False,
            "note": f"{model.target.name} cannot be measured on this machine; the analytic "
                    "model is used unvalidated"}, kind="validation")
    config, workloads = _teacher_config(ctx, teacher), _workloads(opts.workloads, workload)

    def measure(repeats: int):
        return validate_cost_model(model, config, workloads, n=opts.n, repeats=repeats,
                                   warmup=opts.warmup, seed=opts.seed, progress=True)

    # A gate failed on a busy machine is measured again (bounded) before it counts.
    report, failures = judge_with_retries(measure, lambda r: _gate_failures(r, opts),
                                          opts.repeats, opts.gated_metrics, opts.noise_retry,
                                          log=lambda text: print(f"[validation] {text}",
                                                                 flush=True))
    metrics = {f"mape.{k}": v for k, v in report.mape.items()}
    metrics.update({f"kendall_tau.{k}": v for k, v in report.kendall_tau.items()})
    metrics.update({f"spread.{k}": v for k, v in report.spread.items()})
    plot = plot_validation(report, ctx.scratch() / "validation.png")
    ctx.log_file(plot)
    ref = ctx.publish_json("validation.json", report.model_dump(mode="json"),
                           kind="validation", metrics=metrics)
    if failures:
        raise AutoCompressError(
            f"cost model {model.version} failed the validation gate: {'; '.join(failures)} "
            f"(report: {ref.uri})",
            "refit with more probes/repeats (options.costmodel), or relax "
            "options.validation.max_mape / min_kendall_tau",
        )
    return ref


def _gate_failures(report, opts: ValidationOptions) -> list[str]:
    failures = []
    for metric in opts.gated_metrics:
        mape = report.mape.get(metric)
        tau = report.kendall_tau.get(metric)
        if opts.max_mape is not None and mape is not None and mape > opts.max_mape:
            failures.append(f"{metric} MAPE {mape:.1f}% > {opts.max_mape}%")
        if opts.min_kendall_tau is not None and tau is not None and tau < opts.min_kendall_tau:
            failures.append(f"{metric} Kendall tau {tau:.2f} < {opts.min_kendall_tau}")
    return failures
