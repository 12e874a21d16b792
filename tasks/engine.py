"""Engine export stage: what a serving engine loads (llama.cpp: one GGUF; vLLM: nemotron-nas)."""

from __future__ import annotations

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage


@stage("engine-export")
def export_for_engine(ctx: StageContext, model: ArtifactRef, target: str) -> ArtifactRef:
    """What the target's engine serves, which the flow then verifies and registers:
    for llama.cpp ``gguf_export.export_gguf`` of ``model`` in the target's type (a
    directory holding ``model.gguf``), for vLLM its nemotron-nas export."""
    from autocompress.costmodel.target import Target
    from autocompress.gguf_export import export_gguf

    parsed = Target.parse(target)
    if parsed.engine.name == "vllm":
        return _export_for_vllm(ctx, model)
    out_dir = ctx.scratch() / "gguf"
    report = export_gguf(ctx.fetch(model), out_dir, parsed.dtype)
    ctx.log_params({"gguf": {"architecture": report.architecture, "dtype": report.dtype,
                             "layers": report.num_layers, "notes": report.notes}})
    metrics = {"params": float(report.num_params), "layers": float(report.num_layers)}
    return ctx.publish(out_dir, "model", name="gguf", metrics=metrics, move=True,
                       meta={"format": "gguf", "architecture": report.architecture,
                             "dtype": report.dtype})


def _export_for_vllm(ctx: StageContext, model: ArtifactRef) -> ArtifactRef:
    """``export.export_nemotron_nas`` for vLLM (refusing what vLLM cannot compute exactly)."""
    from autocompress.export import export_nemotron_nas

    out_dir = ctx.scratch() / "nemotron-nas"
    report = export_nemotron_nas(ctx.fetch(model), out_dir, engines=["vllm"])
    ctx.log_params({"nemotron_nas": {"engines": report.engines, "stand_ins": report.stand_ins,
                                     "layers": report.num_layers}})
    metrics = {"params": float(report.num_params), "layers": float(report.num_layers)}
    return ctx.publish(out_dir, "model", name="nemotron-nas", metrics=metrics, move=True,
                       meta={"format": "nemotron-nas", "engines": report.engines})
