"""Teacher stages: bring a teacher into the store (hash it), or train the default one."""

from __future__ import annotations

import json
from pathlib import Path

from autocompress.artifacts import ArtifactRef
from autocompress.errors import AutoCompressError
from tasks.stage import StageContext, stage


def _model_meta(model_dir: Path) -> dict:
    """A few facts about a Hugging Face model directory (for tables and lineage)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size")
    return {k: config[k] for k in keys if k in config}


@stage("teacher")
def publish_teacher(ctx: StageContext, teacher_dir: Path, label: str = "") -> ArtifactRef:
    """Publish a local teacher directory; its content hash names it from here on.

    ``teacher_dir`` is a path, so the cache key is the directory's content: a
    retrained teacher at the same path is a different input.
    """
    teacher_dir = Path(teacher_dir)
    if not (teacher_dir / "config.json").exists():
        raise AutoCompressError(f"{teacher_dir} is not a Hugging Face model directory",
                                "pass a directory made by save_pretrained, or `default`")
    meta = {"label": label or str(teacher_dir), **_model_meta(teacher_dir),
            **_provenance(teacher_dir)}
    ctx.log_params({"teacher": meta})
    return ctx.publish(teacher_dir, "teacher", name="teacher", meta=meta,
                       metrics={"params": float(_num_params(teacher_dir))})


def _provenance(model_dir: Path) -> dict:
    """Where a named teacher's weights came from (package, GGUF sha256, dequantization)."""
    path = model_dir / "provenance.json"
    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    keys = ("name", "package", "package_version", "gguf_file", "gguf_sha256", "quantization",
            "dequantization", "builder_version")
    return {f"provenance.{k}": record[k] for k in keys if k in record}


def _num_params(model_dir: Path) -> int:
    """Parameter count from the config (no weights loaded)."""
    from transformers import AutoConfig

    from autocompress.modeling import arch_spec_of

    return arch_spec_of(AutoConfig.from_pretrained(model_dir)).num_params()


@stage("train_teacher", retries=1)
def train_teacher(ctx: StageContext, config: dict, corpus: ArtifactRef) -> ArtifactRef:
    """Train (or resume) the default teacher; checkpoints live in the stage work dir.

    A failed or interrupted run resumes from its last checkpoint when the flow is
    re-run with the same config and corpus (same cache key, same work dir).
    """
    from autocompress.teacher import TeacherConfig
    from autocompress.teacher import train_teacher as train

    cfg = TeacherConfig.model_validate(config)
    ctx.log_params({"teacher_config": cfg.model_dump()})
    out_dir = ctx.scratch() / "teacher"
    card = train(out_dir, cfg, work_dir=ctx.checkpoint_dir(), corpus_dir=ctx.working_copy(corpus))
    final = {k: float(v) for k, v in card.get("final_eval", {}).items()}
    for step, values in enumerate(card.get("evals", [])):
        ctx.log_metrics({k: v for k, v in values.items() if k != "step"},
                        step=int(values.get("step", step)))
    metrics = {"params": float(card["params"]), "tokens_seen": float(card["tokens_seen"]),
               "train_seconds": float(card["train_seconds"]), **final}
    return ctx.publish(out_dir, "teacher", name="teacher", metrics=metrics, move=True,
                       meta={"corpus_fingerprint": card["corpus_fingerprint"],
                             **_model_meta(out_dir)})
