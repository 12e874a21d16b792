"""`autocompress eval`: run the benchmark suite on a model and write its JSON."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import Field

from autocompress.commands import MODEL_HELP
from autocompress.commands.aliases import aliased, renamed, setting
from autocompress.commands.settings import config_option, load_settings

_TASKS_HELP = (
    "Comma-separated tasks or sets. Local (no network): next_line, identifier, docstring, "
    "indent, heldout (bits/byte + next-token accuracy), or the set `local` (all of them, the "
    "default). lm-eval benchmarks by name where their data is reachable (hub or local HF "
    "cache): e.g. hellaswag,arc_challenge, or the set `minitron` = mmlu, hellaswag, "
    "arc_challenge, winogrande, gsm8k, truthfulqa_mc2, humaneval, mbpp."
)


EVAL_CONFIG_EXAMPLE = (
    "limit=N (at most N items per task: quick checks, noisier scores); keys of EvalConfig, "
    "e.g. num_items=300, seed=0, seq_len=256, batch_size=16, "
    "allow_code_execution=false (humaneval/mbpp run model-written code: use a sandbox); "
    "and device=auto|cpu|cuda:1, threads=N, tokenizer=DIR (when the model directory has none)."
)

# Old spellings (one release): the corpus was --corpus; deep settings moved to --config.
EVAL_ALIASES = {
    "--corpus": renamed("--data"),
    **{f"--{key.replace('_', '-')}": setting(key) for key in (
        "num_items", "seed", "seq_len", "batch_size", "device", "threads", "tokenizer")},
    # `--limit` is a latency limit on every other command: here it is a setting.
    "--limit": setting("limit"),
    "--allow-code-execution": setting("allow_code_execution", "true"),
}


def _eval_settings():
    """EvalConfig plus the items per task, where the model runs and its tokenizer."""
    from autocompress.evaluation import EvalConfig

    class EvalSettings(EvalConfig):
        limit: int | None = Field(None, ge=1)
        device: str = "auto"
        threads: int | None = Field(None, ge=1)
        tokenizer: Path | None = None

    return EvalSettings


def eval_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    data: Path = typer.Option(None, "--data",
                              help="Corpus directory (default: $AUTOCOMPRESS_HOME/corpus, "
                                   "built on first use)."),
    tasks: str = typer.Option(None, "--tasks", help=_TASKS_HELP),
    json_out: Path = typer.Option(None, "--json",
                                  help="Write the result JSON to this file (atomically)."),
    config: list[str] = config_option(EVAL_CONFIG_EXAMPLE),
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
    settings = load_settings(_eval_settings(), config, "eval")
    cfg = EvalConfig.model_validate(settings.model_dump(exclude={"limit", "device",
                                                                 "threads", "tokenizer"}))
    if settings.threads:
        torch.set_num_threads(settings.threads)
    lm, tok = load_causal_lm(model)
    if settings.tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(settings.tokenizer))
    if tok is None:
        raise AutoCompressError(f"{model} has no tokenizer", "pass --config tokenizer=DIR "
                                "(the tokenizer the model was trained with)")
    device = settings.device
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    lm.to(dev)
    result = evaluate(lm, tok, tasks=tasks, limit=settings.limit, corpus_dir=data, config=cfg,
                      model_name=str(model), quiet=False)
    console = Console()
    console.print(results_table(result))
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"wrote {json_out}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("eval", cls=aliased(EVAL_ALIASES))(eval_command)
