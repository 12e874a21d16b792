"""CLI: `autocompress distill` (recover a pruned student)."""

from __future__ import annotations

from pathlib import Path

import typer

from autocompress.commands import MODEL_HELP


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("distill")(distill_command)


# ------------------------------------------------------------------ distill


def distill_command(
    teacher: str = typer.Option(..., "--teacher", "-t", help=MODEL_HELP),
    student: str = typer.Option(
        ..., "--student", "-s", help="The student to train (e.g. the output of `prune`)."
    ),
    tokens: int = typer.Option(..., "--tokens", "-n", help="Training token budget."),
    out: Path = typer.Option(
        ..., "--out", "-o",
        help="Where the distilled student is written (model + tokenizer + distill.json). "
        "Checkpoints go to OUT.work until the run finishes.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the interrupted run whose checkpoints are in OUT.work."
    ),
    data: Path | None = typer.Option(
        None, "--data",
        help="Corpus directory (from `autocompress data prepare`): train split for training, "
        "held-out split for evaluation. Default: the standard-library corpus in "
        "AUTOCOMPRESS_HOME (built if absent).",
    ),
    seq_len: int = typer.Option(256, help="Tokens per training sequence."),
    batch_size: int = typer.Option(
        16, help="Global sequences per optimizer step (over all processes)."
    ),
    grad_accum: int = typer.Option(
        1, help="Micro-batches per step and process (batch = processes x grad_accum x micro)."
    ),
    lr: float = typer.Option(1e-3, help="Peak learning rate (AdamW)."),
    warmup_steps: int = typer.Option(20, help="Linear warmup steps before cosine decay."),
    temperature: float = typer.Option(1.0, help="Softmax temperature of the KD loss."),
    alpha: float = typer.Option(
        0.0, help="Weight of the hidden-state cosine loss (0 = logits only, Minitron's "
        "default; try 0.5-1 for students that lost many layers)."
    ),
    layer_map: str | None = typer.Option(
        None, help="Hidden states to match when --alpha > 0, as STUDENT:TEACHER pairs "
        "(`1:2,2:4`; 0 = embeddings, i = output of block i). Default: spread evenly."
    ),
    eval_every: int = typer.Option(0, help="Steps between held-out evaluations (0 = at end)."),
    eval_batches: int = typer.Option(8, help="Held-out batches per evaluation."),
    ckpt_every: int = typer.Option(50, help="Steps between checkpoints."),
    seed: int = typer.Option(0, help="Seed for data order and initialisation."),
    bf16: bool = typer.Option(
        True, "--bf16/--no-bf16",
        help="bf16 autocast where it is faster: timed against fp32 at the start of the run "
        "(emulated bf16 on AVX2-only CPUs is slower than fp32).",
    ),
    teacher_topk: int = typer.Option(
        64, help="Cache the teacher's top-k log-probabilities per batch under "
        "$AUTOCOMPRESS_HOME/teacher-outputs and reuse them for every student on the same "
        "teacher and data (0 = run the teacher live).",
    ),
    fsdp: bool = typer.Option(
        False, "--fsdp",
        help="Under torchrun, shard student, teacher and optimizer over processes (FSDP2) "
        "instead of replicating them (DDP).",
    ),
    keep_checkpoints: bool = typer.Option(
        False, help="Keep OUT.work (checkpoints) after a successful run."
    ),
    threads: int | None = typer.Option(None, help="torch CPU threads per process."),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output directory."),
) -> None:
    """Distil a teacher into a (pruned) student: forward KL on logits, resumable.

    Runs in one process, or on several with torchrun (DDP, or --fsdp), e.g.
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

    if threads:
        torch.set_num_threads(threads)
    ctx = distributed.init_from_env()
    try:
        config = DistillConfig(
            tokens=tokens, seq_len=seq_len, batch_size=batch_size, grad_accum=grad_accum,
            lr=lr, warmup_steps=warmup_steps, temperature=temperature, alpha=alpha,
            layer_map=_parse_layer_map(layer_map), eval_every=eval_every,
            eval_batches=eval_batches, ckpt_every=ckpt_every, seed=seed, bf16=bf16,
            teacher_topk=teacher_topk, parallel="fsdp" if fsdp else "ddp",
            keep_checkpoints=keep_checkpoints,
        )
        teacher_model, teacher_tok = load_causal_lm(teacher)
        student_model, student_tok = load_causal_lm(student)
        tokenizer = student_tok or teacher_tok
        if tokenizer is None:
            raise AutoCompressError(
                "neither the teacher nor the student directory has a tokenizer",
                "save the teacher's tokenizer (tokenizer.save_pretrained) into one of them",
            )
        if not ctx.enabled and torch.cuda.is_available():
            student_model.to("cuda")  # a single process uses the GPU when there is one
        # Rank 0 builds the corpus and token caches first; the others then read them.
        dataset = None
        for turn in (True, False):
            if ctx.is_main == turn:
                dataset = DistillData.from_corpus(tokenizer, ensure_corpus(data), seq_len,
                                                  heldout_windows=eval_batches * batch_size)
            distributed.barrier(ctx)
        result = distill(teacher_model, student_model, dataset, config, out,
                         tokenizer=tokenizer, resume=resume, overwrite=overwrite)
        if ctx.is_main:
            _print_distill_summary(result)
    finally:
        distributed.shutdown()


def _parse_layer_map(text: str | None) -> dict[int, int] | None:
    from autocompress.errors import AutoCompressError

    if not text:
        return None
    try:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        return {int(s): int(t) for s, t in pairs}
    except ValueError:
        raise AutoCompressError(
            f"cannot read --layer-map {text!r}", "write STUDENT:TEACHER pairs, e.g. 1:2,2:4"
        ) from None


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
