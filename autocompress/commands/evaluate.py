"""`autocompress eval`: run the benchmark suite on a model and write its JSON."""

from __future__ import annotations

from pathlib import Path

import typer

_TASKS_HELP = (
    "Comma-separated tasks or sets. Local (no network): next_line, identifier, docstring, "
    "indent, heldout (bits/byte + next-token accuracy), or the set `local` (all of them, the "
    "default). lm-eval benchmarks by name where their data is reachable (hub or local HF "
    "cache): e.g. hellaswag,arc_challenge, or the set `minitron` = mmlu, hellaswag, "
    "arc_challenge, winogrande, gsm8k, truthfulqa_mc2, humaneval, mbpp."
)


def eval_command(
    model: str = typer.Option(..., "--model", "-m",
                              help="Model directory (save_pretrained), or `default` for the "
                                   "bundled teacher."),
    json_out: Path = typer.Option(None, "--json",
                                  help="Write the result JSON here (atomically)."),
    tasks: str = typer.Option(None, "--tasks", help=_TASKS_HELP),
    limit: int = typer.Option(None, "--limit", min=1,
                              help="At most N items per task (quick checks; scores get noisier)."),
    corpus: Path = typer.Option(None, "--corpus",
                                help="Corpus directory (default: $AUTOCOMPRESS_HOME/corpus, "
                                     "built on first use)."),
    tokenizer: Path = typer.Option(None, "--tokenizer",
                                   help="Tokenizer directory, if the model directory has none."),
    num_items: int = typer.Option(300, "--num-items", min=1,
                                  help="Items per local multiple-choice task."),
    seed: int = typer.Option(0, "--seed", help="Seed of the local task construction."),
    seq_len: int = typer.Option(256, "--seq-len", min=8,
                                help="Context length (tokens) for local tasks and held-out "
                                     "windows; the default teacher was trained at 256."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="lm-eval batch size."),
    device: str = typer.Option("auto", "--device",
                               help="cpu, cuda, cuda:1...; auto = cuda when available."),
    threads: int = typer.Option(None, "--threads", min=1, help="torch CPU threads."),
    allow_code_execution: bool = typer.Option(
        False, "--allow-code-execution",
        help="Let humaneval/mbpp execute model-written code (use a sandbox)."),
) -> None:
    """Evaluate a model: local code benchmarks through lm-eval, held-out bits/byte and
    next-token accuracy, optional standard lm-eval benchmarks; prints a table.

    Each score comes with its standard error and the chance level. The JSON is
    {"model", "tasks": {NAME: {"score", "stderr", "chance", ...}}, "mc_mean",
    "mc_chance_mean", "bits_per_byte", "next_token_acc", ...}.
    """
    import torch
    from rich.console import Console

    from autocompress.errors import AutoCompressError
    from autocompress.evaluation import EvalConfig, evaluate, write_json
    from autocompress.evaluation.report import results_table
    from autocompress.modeling import load_causal_lm

    if json_out is not None:  # a directory named as the JSON file is refused before the work
        from autocompress.atomic import check_out_file

        check_out_file(json_out, "--json")
    if threads:
        torch.set_num_threads(threads)
    cfg = EvalConfig(num_items=num_items, seed=seed, seq_len=seq_len, batch_size=batch_size,
                     allow_code_execution=allow_code_execution)
    lm, tok = load_causal_lm(model)
    if tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer))
    if tok is None:
        raise AutoCompressError(f"{model} has no tokenizer",
                                "pass --tokenizer DIR (the tokenizer the model was trained with)")
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    lm.to(dev)
    result = evaluate(lm, tok, tasks=tasks, limit=limit, corpus_dir=corpus, config=cfg,
                      model_name=str(model), quiet=False)
    console = Console()
    console.print(results_table(result))
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"wrote {json_out}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("eval")(eval_command)
