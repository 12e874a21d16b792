"""Pruning stages: importance scores (Minitron) on calibration data, then slicing
the teacher's weights into a searched architecture."""

from __future__ import annotations

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage


@stage("importance")
def score_importance(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                     options: dict | None = None) -> ArtifactRef:
    """``importance.importance_for_checkpoint`` on the corpus's calibration split.

    ``options``: ``importance.CalibrationConfig`` fields (seq_len, batch_size,
    num_batches, removal_batches, seed); the corpus comes from ``corpus``. Unset
    sizes follow the teacher's size (``stage_sizes``).
    """
    import torch

    from autocompress.importance import importance_for_checkpoint
    from autocompress.stage_config import stage_settings

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    calib = stage_settings("importance",
                           {**(options or {}), "corpus_dir": str(ctx.working_copy(corpus))},
                           teacher.metrics.get("params"))
    ctx.log_params({"calibration": calib.model_dump(exclude={"corpus_dir"})})
    path = ctx.scratch() / "importance.safetensors"
    scores = importance_for_checkpoint(ctx.fetch(teacher), calib, out_path=path, progress=True)
    metrics = {"base_loss": float(scores.base_loss), "num_tokens": float(scores.num_tokens)}
    return ctx.publish(path, "importance", metrics=metrics)


@stage("prune")
def prune_model(ctx: StageContext, teacher: ArtifactRef, arch: ArtifactRef,
                importance: ArtifactRef) -> ArtifactRef:
    """Slice the teacher's weights into the architecture in ``arch`` (its ``arch.json``)."""
    from autocompress.arch import ArchSpec
    from autocompress.prune import prune_checkpoint

    arch_path = ctx.fetch(arch)
    spec = ArchSpec.from_json(arch_path / "arch.json" if arch_path.is_dir() else arch_path)
    out_dir = ctx.scratch() / "pruned"
    record = prune_checkpoint(ctx.fetch(teacher), spec, out_dir,
                              importance=ctx.fetch(importance), progress=False)
    metrics = {"params": float(record["student_params"]),
               "teacher_params": float(record["teacher_params"])}
    return ctx.publish(out_dir, "model", name="pruned", metrics=metrics, move=True,
                       meta={"method": arch.meta.get("method")})
