"""Engine export stage: the file a serving engine loads (llama.cpp: one GGUF)."""

from __future__ import annotations

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage


@stage("engine-export")
def export_for_engine(ctx: StageContext, model: ArtifactRef, target: str) -> ArtifactRef:
    """``gguf_export.export_gguf`` of ``model`` in the target's type (a directory
    holding ``model.gguf``), which the flow then verifies and registers."""
    from autocompress.costmodel.target import Target
    from autocompress.gguf_export import export_gguf

    parsed = Target.parse(target)
    out_dir = ctx.scratch() / "gguf"
    report = export_gguf(ctx.fetch(model), out_dir, parsed.dtype)
    ctx.log_params({"gguf": {"architecture": report.architecture, "dtype": report.dtype,
                             "layers": report.num_layers, "notes": report.notes}})
    metrics = {"params": float(report.num_params), "layers": float(report.num_layers)}
    return ctx.publish(out_dir, "model", name="gguf", metrics=metrics, move=True,
                       meta={"format": "gguf", "architecture": report.architecture,
                             "dtype": report.dtype})
