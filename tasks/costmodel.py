"""Cost-model stages (boxes 1–3 of ``flows/compress.py``): profile, fit, validate (a gate).

Thin wrappers over ``autocompress.hardware`` and the recipe's cost-model steps
(``autocompress.recipe``).
Targets that cannot be measured on this machine (GPU spec sheets) get the
analytic model and skip measured validation; the report says so.
"""

from __future__ import annotations

import socket
from typing import Any

from autocompress import recipe
from autocompress.artifacts import ArtifactRef
from autocompress.stage_config import stage_settings
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


@stage("costmodel", retries=1)
def fit_costmodel(ctx: StageContext, target: str, teacher: ArtifactRef, profile: ArtifactRef,
                  options: dict | None = None, workload: str | None = None) -> ArtifactRef:
    """``recipe.fit_cost_model``: fit on measured probes (measurable targets) or take the
    analytic one. ``workload``: the run's workload, fitted alone unless
    ``options.workloads`` says otherwise (each extra workload multiplies the fit's time).
    """
    from autocompress.costmodel import Target

    opts = stage_settings("costmodel", options)
    ctx.log_params({"target": Target.parse(target).name, "fit": opts.model_dump()})
    model = recipe.fit_cost_model(target, _teacher_config(ctx, teacher), workload, opts)
    metrics: dict[str, float] = {}
    if model.fit is not None:
        metrics = {f"train_mape.{k}": float(v) for k, v in model.fit.train_mape.items()}
        metrics["fit_seconds"] = float(model.fit.seconds)
    path = ctx.scratch() / "costmodel.json"
    model.save(path)
    return ctx.publish(path, "costmodel", metrics=metrics,
                       meta={"version": model.version, "source": model.source,
                             "target": model.target.name})


@stage("validation", retries=1)
def validate_costmodel(ctx: StageContext, costmodel: ArtifactRef, teacher: ArtifactRef,
                       workload: str, options: dict | None = None) -> ArtifactRef:
    """``recipe.gate``: measure sampled architectures, score the cost model, and enforce
    the gate.

    Raises ``AutoCompressError`` when the gate fails: the search must not run on
    a cost model that mis-ranks architectures on this target.
    """
    from autocompress.costmodel import CostModel
    from autocompress.costmodel.validate import plot_validation

    opts = stage_settings("validation", options)
    model = CostModel.load(ctx.fetch(costmodel))
    ctx.log_params({"validation": opts.model_dump(), "cost_model": model.version})
    report, failures = recipe.gate(model, _teacher_config(ctx, teacher), workload, opts,
                                   log=lambda text: print(f"[validation] {text}", flush=True))
    if report is None:
        return ctx.publish_json("validation.json", {
            "cost_model": model.version, "measured": False,
            "note": f"{model.target.name} cannot be measured on this machine; the analytic "
                    "model is used unvalidated"}, kind="validation")
    metrics = {f"mape.{k}": v for k, v in report.mape.items()}
    metrics.update({f"kendall_tau.{k}": v for k, v in report.kendall_tau.items()})
    metrics.update({f"spread.{k}": v for k, v in report.spread.items()})
    plot = plot_validation(report, ctx.scratch() / "validation.png")
    ctx.log_file(plot)
    ref = ctx.publish_json("validation.json", report.model_dump(mode="json"),
                           kind="validation", metrics=metrics)
    if failures:
        raise recipe.gate_error(model, failures, ref.uri)
    return ref
