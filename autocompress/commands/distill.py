"""CLI: `autocompress distill` (recover a pruned student)."""

from __future__ import annotations

from pathlib import Path

import typer

from autocompress.commands import MODEL_HELP
from autocompress.commands.aliases import aliased, as_mapping, renamed, setting
from autocompress.commands.settings import config_option, load_settings

DISTILL_CONFIG_EXAMPLE = (
    "Keys of DistillConfig, e.g. seq_len=256, batch_size=16, grad_accum=1, lr=1e-3, "
    "warmup_steps=20, temperature=1.0, alpha=0.5 (hidden-state loss), layer_map={1: 2}, "
    "eval_every=0, eval_batches=8, ckpt_every=50, seed=0, bf16=true, teacher_topk=64, "
    "parallel=ddp|fsdp, keep_checkpoints=false; threads=N (torch CPU threads per process)."
)

# Old spellings (one release): the student was --student; deep settings moved to --config.
DISTILL_ALIASES = {
    "--student": renamed("--model"), "-s": renamed("--model"),
    **{f"--{key.replace('_', '-')}": setting(key) for key in (
        "seq_len", "batch_size", "grad_accum", "lr", "warmup_steps", "temperature", "alpha",
        "eval_every", "eval_batches", "ckpt_every", "seed", "teacher_topk", "threads")},
    "--layer-map": setting("layer_map", convert=as_mapping),
    "--bf16": setting("bf16", "true"), "--no-bf16": setting("bf16", "false"),
    "--fsdp": setting("parallel", "fsdp"),
    "--keep-checkpoints": setting("keep_checkpoints", "true"),
    "--no-keep-checkpoints": setting("keep_checkpoints", "false"),
}


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("distill", cls=aliased(DISTILL_ALIASES))(distill_command)


def _distill_settings():
    """DistillConfig plus ``threads``, the one setting of the command itself."""
    from autocompress.distill import DistillConfig

    class DistillSettings(DistillConfig):
        threads: int | None = None

    return DistillSettings


# ------------------------------------------------------------------ distill


def distill_command(
    model: str = typer.Option(
        ..., "--model", "-m", help="The student to train (e.g. the output of `prune`). "
        + MODEL_HELP),
    teacher: str = typer.Option(..., "--teacher", "-t", help="The teacher it learns from. "
                                + MODEL_HELP),
    tokens: int = typer.Option(..., "--tokens", "-n", help="Training token budget."),
    out: Path = typer.Option(
        ..., "--out", "-o",
        help="Where the distilled student is written (model + tokenizer + distill.json). "
        "Checkpoints go to OUT.work until the run finishes.",
    ),
    data: Path | None = typer.Option(
        None, "--data",
        help="Corpus directory (from `autocompress data prepare`): train split for training, "
        "held-out split for evaluation. Default: the standard-library corpus in "
        "AUTOCOMPRESS_HOME (built if absent).",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the interrupted run whose checkpoints are in OUT.work."
    ),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output directory."),
    config: list[str] = config_option(DISTILL_CONFIG_EXAMPLE),
) -> None:
    """Distil a teacher into a (pruned) student: forward KL on logits, resumable.

    Runs in one process, or on several with torchrun (DDP, or parallel=fsdp), e.g.
    `torchrun --nproc_per_node 8 -m autocompress.cli distill ...` — every process
    takes a disjoint part of each global batch, so the result does not depend on
    the number of processes. Kill it at any time; `--resume` continues exactly.
    """
    import torch

    from autocompress import distributed
    from autocompress.data.corpus import ensure_corpus
    from autocompress.distill import DistillConfig, DistillData, distill
    from autocompress.errors import AutoCompressError
    from autocompress.modeling import load_causal_lm

    settings = load_settings(_distill_settings(), [*config, f"tokens={tokens}"], "distill")
    distill_config = DistillConfig.model_validate(settings.model_dump(exclude={"threads"}))
    if settings.threads:
        torch.set_num_threads(settings.threads)
    ctx = distributed.init_from_env()
    try:
        teacher_model, teacher_tok = load_causal_lm(teacher)
        student_model, student_tok = load_causal_lm(model)
        tokenizer = student_tok or teacher_tok
        if tokenizer is None:
            raise AutoCompressError(
                "neither the teacher nor the student directory has a tokenizer",
                "save the teacher's tokenizer (tokenizer.save_pretrained) into one of them",
            )
        if not ctx.enabled and torch.cuda.is_available():
            student_model.to("cuda")  # a single process uses the GPU when there is one
        # Rank 0 builds the corpus and token caches first; the others then read them.
        heldout = distill_config.eval_batches * distill_config.batch_size
        dataset = None
        for turn in (True, False):
            if ctx.is_main == turn:
                dataset = DistillData.from_corpus(tokenizer, ensure_corpus(data),
                                                  distill_config.seq_len, heldout_windows=heldout)
            distributed.barrier(ctx)
        result = distill(teacher_model, student_model, dataset, distill_config, out,
                         tokenizer=tokenizer, resume=resume, overwrite=overwrite)
        if ctx.is_main:
            _print_distill_summary(result)
    finally:
        distributed.shutdown()


def _print_distill_summary(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Distilled {result.steps} steps, {result.tokens_seen:,} tokens "
                        f"({result.seconds:.0f} s, {result.world_size} process(es))")
    table.add_column("held-out")
    for column in ("teacher", "student before", "student after"):
        table.add_column(column, justify="right")
    for key in ("heldout_loss", "heldout_ppl", "heldout_kd"):
        row = [result.teacher_eval.get(key), result.initial_eval.get(key),
               result.final_eval.get(key)]
        table.add_row(key, *("-" if v is None else f"{v:.4f}" for v in row))
    console = Console()
    console.print(table)
    speed = result.tokens_seen / max(result.seconds, 1e-9)
    probe = result.bf16_probe
    timed = (f" (timed {probe.get('decided', '')}: fp32 {probe['fp32_s']:.3f} s, "
             f"bf16 {probe['bf16_s']:.3f} s per probe)" if probe else "")
    console.print(f"{speed:,.0f} tokens/s in {'bf16' if result.bf16 else 'fp32'}{timed}")
    cache = result.teacher_outputs
    if cache:
        console.print(f"teacher outputs (top-{cache['topk']}): {cache['steps_reused']} steps "
                      f"reused, {cache['steps_built']} computed in {cache['build_seconds']:.0f} "
                      f"s, in {cache['dir']}")
    console.print(f"wrote {result.out_dir}")
