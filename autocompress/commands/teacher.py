"""`autocompress teacher ...`: the named teachers; train and describe the default one."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from autocompress.commands import format_option, print_json
from autocompress.commands.aliases import (
    PRINT_JSON,
    aliased,
    model_or_positional,
    old_positional,
    renamed,
    setting,
)
from autocompress.commands.settings import config_option, load_settings

teacher_app = typer.Typer(help="Named teachers (list, build) and the default code teacher "
                          "(train, card).", no_args_is_help=True)


@teacher_app.command("list", cls=aliased(PRINT_JSON))
def list_teachers(fmt: str = format_option("the teachers")) -> None:
    """The named teachers (usable wherever a --model is asked for) with size and scores.

    Sizes come from the config (no weights are loaded, nothing is built); scores
    are the recorded ones (bench/real_teacher.py, the default teacher's eval.json).
    """
    from rich.console import Console
    from rich.table import Table

    from autocompress.teachers import describe_named

    rows = describe_named()
    if print_json(fmt):
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
def build(
    model: str = typer.Option(None, "--model", "-m",
                              help="A named teacher, e.g. smollm2-135m. Required."),
    old_name: str = old_positional(),
) -> None:
    """Build (or find) a named teacher's model directory and print its path."""
    from autocompress.errors import AutoCompressError
    from autocompress.teachers import NAMED_TEACHERS, resolve_named

    name = model_or_positional(model, old_name)

    if name not in NAMED_TEACHERS:
        raise AutoCompressError(f"no named teacher {name!r}",
                                f"pick one of {', '.join(NAMED_TEACHERS)}")
    typer.echo(str(resolve_named(name)))


TRAIN_CONFIG_EXAMPLE = (
    "Keys of TeacherConfig, e.g. tokens=3000000, threads=2, num_layers=8, hidden_size=256, "
    "vocab_size=4096, lr=0.002, seed=0; and eval_tasks=local, eval_limit=N (the teacher's "
    "scores), register_as=NAME (null: not in MLflow), prefect=false (the library call directly, "
    "without the Prefect flow)."
)
# The command's own defaults where they differ from TeacherConfig's.
TRAIN_DEFAULTS = {"tokens": 3_000_000, "threads": 2}
TRAIN_ALIASES = {
    "--corpus": renamed("--data"),
    "--tokens": setting("tokens"), "--threads": setting("threads"),
    "--eval-tasks": setting("eval_tasks"), "--eval-limit": setting("eval_limit"),
    "--no-register": setting("register_as", "null"), "--no-prefect": setting("prefect", "false"),
}


def _train_settings():
    """TeacherConfig (strict: an unknown key is an error) plus the command's own settings."""
    from pydantic import ConfigDict

    from autocompress.teacher import TeacherConfig

    class TrainSettings(TeacherConfig):
        model_config = ConfigDict(extra="forbid")

        eval_tasks: str | None = None
        eval_limit: int | None = None
        register_as: str | None = "autocompress-teacher"
        prefect: bool = True

    return TrainSettings


@teacher_app.command("train", cls=aliased(TRAIN_ALIASES))
def train(
    out: Path = typer.Option(None, help="Output model dir (default: the bundled teacher dir)."),
    data: Path = typer.Option(None, "--data",
                              help="Corpus dir (default $AUTOCOMPRESS_HOME/corpus)."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace a non-empty --out (the bundled teacher too)."),
    config: list[str] = config_option(TRAIN_CONFIG_EXAMPLE),
) -> None:
    """Train the default teacher (Llama, 8 layers, h=256, GQA 8/2) on the corpus.

    Through the ``train_teacher`` Prefect flow (corpus, train, evaluate,
    register) unless prefect=false. Resumable: an interrupted run continues from
    its last checkpoint when started again with the same settings.
    """
    from autocompress.atomic import check_out_dir
    from autocompress.paths import default_teacher_dir, home
    from autocompress.teacher import TeacherConfig, train_teacher

    settings = load_settings(_train_settings(), config, "teacher train", base=TRAIN_DEFAULTS)
    own = {"eval_tasks", "eval_limit", "register_as", "prefect"}
    cfg = TeacherConfig.model_validate(settings.model_dump(exclude=own))
    out = check_out_dir(out or default_teacher_dir(), overwrite)
    if not settings.prefect:
        train_teacher(out, cfg, home() / "teacher-work", corpus_dir=data)
    else:
        from autocompress.commands.pipeline import _prepare_environment

        _prepare_environment()
        from flows.train_teacher import train_teacher as train_teacher_flow

        train_teacher_flow(config=cfg.model_dump(), corpus_dir=str(data) if data else None,
                           eval_tasks=settings.eval_tasks, eval_limit=settings.eval_limit,
                           register_as=settings.register_as,
                           install_to=str(out))
    record = json.loads((out / "training.json").read_text())
    typer.echo(f"teacher written to {out}: {record['params']:,} parameters, "
               f"{record['tokens_seen']:,} tokens, held-out {record['final_eval']}")


@teacher_app.command("card", cls=aliased({"--eval-json": renamed("--scores")}))
def card(
    model: str = typer.Option("default", "--model", "-m",
                              help="Teacher dir (with training.json)."),
    scores: Path = typer.Option(None, "--scores",
                                help="Scores written by `autocompress eval --json FILE`."),
) -> None:
    """Write the default teacher's model card (README.md) from its training record and scores."""
    from autocompress.model_source import resolve_model_dir
    from autocompress.teacher import write_model_card

    path = write_model_card(resolve_model_dir(model), scores)
    typer.echo(f"wrote {path}")


@teacher_app.command("register")
def register_command(
    model: Path = typer.Option(None, "--model", "-m",
                               help="A Hugging Face model directory. Required."),
    name: str = typer.Option("autocompress-teacher", help="MLflow registry name."),
    old_model_dir: Path = old_positional(),
) -> None:
    """Register a model directory as a teacher and emit autocompress.teacher.registered.

    Under `autocompress serve` (PREFECT_API_URL set) the event starts the
    `on-new-teacher` deployment, which compresses this teacher.
    """
    from autocompress.tracking import check_registry_name
    from flows.train_teacher import register_teacher

    check_registry_name(name, "--name")  # before anything is published
    model_dir = model_or_positional(model, old_model_dir)
    report = register_teacher(model_dir=str(model_dir), register_as=name)
    registered = report.outputs["registered"]
    typer.echo(f"registered {registered.name}@{registered.version}; {report.notes[-1]}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.add_typer(teacher_app, name="teacher")
