"""Distillation stage (box 8 of ``flows/compress.py``): KD from the teacher, resumable.

Checkpoints live in the stage's checkpoint dir (same inputs → same dir), so a
failed or interrupted distillation continues from its last checkpoint when the
flow is re-run. Multi-GPU distillation (torchrun/FSDP) runs outside this task:
``autocompress distill`` under ``torchrun`` (see infra/README.md).
"""

from __future__ import annotations

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage


@stage("distill", retries=1)
def distill_model(ctx: StageContext, teacher: ArtifactRef, student: ArtifactRef,
                  corpus: ArtifactRef, options: dict | None = None) -> ArtifactRef:
    """``autocompress.distill.distill`` teacher → student on the corpus's train split.

    Unset held-out sizes follow the teacher's size (``stage_sizes``); the token budget
    is the options' (default ``DEFAULT_TOKENS``)."""
    import torch

    from autocompress.distill import DistillData, distill
    from autocompress.modeling import load_causal_lm
    from autocompress.stage_config import stage_settings
    from autocompress.training import latest_checkpoint

    config = stage_settings("distill", options, teacher.metrics.get("params"))
    ctx.log_params({"distill": config.model_dump(mode="json")})
    teacher_model, teacher_tok = load_causal_lm(ctx.fetch(teacher))
    student_model, student_tok = load_causal_lm(ctx.fetch(student))
    tokenizer = student_tok or teacher_tok
    if torch.cuda.is_available():
        student_model.to("cuda")
    data = DistillData.from_corpus(tokenizer, ctx.working_copy(corpus), config.seq_len,
                                   heldout_windows=config.eval_batches * config.batch_size)
    work_dir = ctx.checkpoint_dir() / "distill"
    resume = latest_checkpoint(work_dir / "checkpoints") is not None
    out_dir = ctx.scratch() / "model"
    # The teacher's cached outputs are keyed by its artifact hash: every student of
    # this teacher on this corpus (the baseline, sweeps, re-runs) reuses them.
    result = distill(teacher_model, student_model, data, config, out_dir, tokenizer=tokenizer,
                     resume=resume, work_dir=work_dir, teacher_id=teacher.sha256)
    metrics = {f"final_{k}": float(v) for k, v in result.final_eval.items()}
    metrics.update({f"initial_{k}": float(v) for k, v in result.initial_eval.items()})
    metrics.update({f"teacher_{k}": float(v) for k, v in result.teacher_eval.items()})
    metrics.update({"tokens_seen": float(result.tokens_seen), "train_seconds": result.seconds})
    metrics["params"] = float(sum(p.numel() for p in student_model.parameters()))
    metrics["tokens_per_s"] = result.tokens_seen / max(result.seconds, 1e-9)
    metrics["bf16"] = float(result.bf16)
    if result.teacher_outputs:
        metrics["teacher_outputs_build_s"] = result.teacher_outputs["build_seconds"]
        metrics["teacher_outputs_steps_reused"] = float(result.teacher_outputs["steps_reused"])
    return ctx.publish(out_dir, "model", name="model", metrics=metrics, move=True,
                       meta={"resumed": resume, **student.meta})
