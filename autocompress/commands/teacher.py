"""`autocompress teacher ...`: the named teachers; train and describe the default one."""

from __future__ import annotations

import json
from pathlib import Path

import typer

teacher_app = typer.Typer(help="Named teachers (list, build) and the default code teacher "
                          "(train, card).", no_args_is_help=True)


@teacher_app.command("list")
def list_teachers(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The named teachers (usable as --teacher / --model NAME) with size and scores.

    Sizes come from the config (no weights are loaded, nothing is built); scores
    are the recorded ones (bench/real_teacher.py, the default teacher's eval.json).
    """
    from rich.console import Console
    from rich.table import Table

    from autocompress.teachers import describe_named

    rows = describe_named()
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(title="named teachers")
    for column in ("name", "params", "layers", "vocab", "MC mean ± s.e.", "bits/byte",
                   "state"):
        table.add_column(column)
    for row in rows:
        mc = (f"{row['mc_mean']:.3f} ± {row['mc_mean_stderr']:.3f}"
              if row.get("mc_mean") is not None else "–")
        bpb = f"{row['bits_per_byte']:.3f}" if row.get("bits_per_byte") is not None else "–"
        params = f"{row['params'] / 1e6:.1f}M" if row.get("params") else "–"
        table.add_row(row["name"], params, str(row.get("layers") or "–"),
                      str(row.get("vocab") or "–"), mc, bpb, row["state"])
    console = Console()
    console.print(table)
    for row in rows:
        console.print(f"{row['name']}: {row['description']}; {row['detail']}", soft_wrap=True)


@teacher_app.command("build")
def build(name: str = typer.Argument(..., help="A named teacher, e.g. smollm2-135m.")) -> None:
    """Build (or find) a named teacher's model directory and print its path."""
    from autocompress.errors import AutoCompressError
    from autocompress.teachers import NAMED_TEACHERS, resolve_named

    if name not in NAMED_TEACHERS:
        raise AutoCompressError(f"no named teacher {name!r}",
                                f"pick one of {', '.join(NAMED_TEACHERS)}")
    typer.echo(str(resolve_named(name)))


@teacher_app.command("train")
def train(
    tokens: int = typer.Option(3_000_000, help="Training token budget."),
    out: Path = typer.Option(None, help="Output model dir (default: the bundled teacher dir)."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace a non-empty --out (the bundled teacher too)."),
    threads: int = typer.Option(2, help="torch intra-op threads."),
    config: str = typer.Option(None, help="TeacherConfig overrides as JSON, e.g. "
                               '\'{"num_layers": 4, "vocab_size": 2048}\'.'),
    corpus: Path = typer.Option(None, help="Corpus dir (default $AUTOCOMPRESS_HOME/corpus)."),
    eval_tasks: str = typer.Option(None, help="Benchmarks for the teacher's scores "
                                   "(default: the local suite)."),
    eval_limit: int = typer.Option(None, help="Cap items per benchmark (quick runs)."),
    no_register: bool = typer.Option(False, "--no-register",
                                     help="Do not register the teacher in MLflow."),
    no_prefect: bool = typer.Option(False, "--no-prefect",
                                    help="Run the library call directly, without a Prefect flow."),
) -> None:
    """Train the default teacher (Llama, 8 layers, h=256, GQA 8/2) on the corpus.

    Through the ``train_teacher`` Prefect flow (corpus, train, evaluate,
    register) unless --no-prefect. Resumable: an interrupted run continues from
    its last checkpoint when started again with the same settings.
    """
    from autocompress.paths import default_teacher_dir, home
    from autocompress.teacher import train_teacher

    cfg = _teacher_config(config, tokens=tokens, threads=threads)
    from autocompress.atomic import check_out_dir

    out = check_out_dir(out or default_teacher_dir(), overwrite)
    if no_prefect:
        train_teacher(out, cfg, home() / "teacher-work", corpus_dir=corpus)
    else:
        from autocompress.commands.pipeline import _prepare_environment

        _prepare_environment()
        from flows.train_teacher import train_teacher as train_teacher_flow

        train_teacher_flow(config=cfg.model_dump(), corpus_dir=str(corpus) if corpus else None,
                           eval_tasks=eval_tasks, eval_limit=eval_limit,
                           register_as=None if no_register else "autocompress-teacher",
                           install_to=str(out))
    record = json.loads((out / "training.json").read_text())
    typer.echo(f"teacher written to {out}: {record['params']:,} parameters, "
               f"{record['tokens_seen']:,} tokens, held-out {record['final_eval']}")


def _teacher_config(text: str | None, **fields):
    """TeacherConfig from --config JSON plus the explicit options; bad JSON is a user error."""
    from pydantic import ValidationError

    from autocompress.errors import AutoCompressError
    from autocompress.teacher import TeacherConfig

    try:
        overrides = json.loads(text) if text else {}
        return TeacherConfig.model_validate({**overrides, **fields})
    except (ValueError, ValidationError) as err:
        first = str(err).strip().splitlines()[0]
        raise AutoCompressError(f"bad --config: {first}",
                                'pass JSON of TeacherConfig fields, e.g. \'{"num_layers": 4}\''
                                ) from None


@teacher_app.command("card")
def card(
    model: str = typer.Option("default", help="Teacher dir (with training.json)."),
    eval_json: Path = typer.Option(None, help="Scores from `autocompress eval --json`."),
) -> None:
    """Write the default teacher's model card (README.md) from its training record and scores."""
    from autocompress.model_source import resolve_model_dir
    from autocompress.teacher import write_model_card

    path = write_model_card(resolve_model_dir(model), eval_json)
    typer.echo(f"wrote {path}")


@teacher_app.command("register")
def register_command(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory."),
    name: str = typer.Option("autocompress-teacher", help="MLflow registry name."),
) -> None:
    """Register a model directory as a teacher and emit autocompress.teacher.registered.

    Under `autocompress serve` (PREFECT_API_URL set) the event starts the
    `on-new-teacher` deployment, which compresses this teacher.
    """
    from autocompress.tracking import check_registry_name
    from flows.train_teacher import register_teacher

    check_registry_name(name, "--name")  # before anything is published
    report = register_teacher(model_dir=str(model_dir), register_as=name)
    registered = report.outputs["registered"]
    typer.echo(f"registered {registered.name}@{registered.version}; {report.notes[-1]}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.add_typer(teacher_app, name="teacher")
