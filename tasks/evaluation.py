"""Evaluation stage: the benchmark suite on one published model."""

from __future__ import annotations

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage

# Headline numbers copied from the evaluation JSON into the reference's metrics.
HEADLINE = ("mc_mean", "mc_mean_stderr", "bits_per_byte", "next_token_acc", "heldout_loss")


@stage("evaluate")
def evaluate_model(ctx: StageContext, model: ArtifactRef, corpus: ArtifactRef,
                   tasks: str | None = None, config: dict | None = None,
                   limit: int | None = None, teacher: ArtifactRef | None = None
                   ) -> ArtifactRef:
    """Run ``autocompress.evaluation.suite.evaluate`` and publish its JSON.

    ``teacher``: unset suite sizes follow its size (``stage_sizes``), so a teacher
    and its students answer the same items; None: the suite's defaults.
    """
    import torch

    from autocompress.evaluation.suite import evaluate
    from autocompress.modeling import load_causal_lm
    from autocompress.stage_config import EVAL_STAGE, stage_settings

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    lm, tokenizer = load_causal_lm(ctx.fetch(model))
    cfg = stage_settings(EVAL_STAGE, config,
                         teacher.metrics.get("params") if teacher is not None else None)
    ctx.log_params({"tasks": tasks or "local", "limit": limit, "eval": cfg.model_dump()})
    result = evaluate(lm, tokenizer, tasks=tasks, config=cfg, limit=limit,
                      work_dir=ctx.workdir / "eval", corpus_dir=ctx.working_copy(corpus),
                      model_name=model.meta.get("label") or model.kind, quiet=True)
    metrics = {k: float(result[k]) for k in HEADLINE if result.get(k) is not None}
    for name, entry in result.get("tasks", {}).items():
        if entry.get("score") is not None:
            metrics[f"task.{name}"] = float(entry["score"])
    return ctx.publish_json("evaluation.json", result, kind="evaluation", metrics=metrics)
