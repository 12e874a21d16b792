"""`autocompress teacher ...`: train the bundled default teacher."""

from __future__ import annotations

from pathlib import Path

import typer

teacher_app = typer.Typer(help="Train and describe the default code teacher.",
                          no_args_is_help=True)


@teacher_app.command("train")
def train(
    tokens: int = typer.Option(3_000_000, help="Training token budget."),
    out: Path = typer.Option(None, help="Output model dir (default: the bundled teacher dir)."),
    threads: int = typer.Option(2, help="torch intra-op threads."),
    no_prefect: bool = typer.Option(False, "--no-prefect",
                                    help="Run the library call directly, without a Prefect flow."),
) -> None:
    """Train the default teacher (Llama, 8 layers, h=256, GQA 8/2) on the corpus.

    Resumable: an interrupted run continues from its last checkpoint under
    $AUTOCOMPRESS_HOME/teacher-work when started again with the same settings.
    """
    from autocompress.paths import default_teacher_dir, home
    from autocompress.teacher import TeacherConfig, train_teacher

    cfg = TeacherConfig(tokens=tokens, threads=threads)
    out = out or default_teacher_dir()
    if no_prefect:
        card = train_teacher(out, cfg, home() / "teacher-work")
    else:
        from flows.teacher import train_teacher_flow

        card = train_teacher_flow(tokens=tokens, threads=threads, out_dir=str(out))
    typer.echo(f"teacher written to {out}: {card['params']:,} parameters, "
               f"{card['tokens_seen']:,} tokens, held-out {card['final_eval']}")


@teacher_app.command("card")
def card(
    model: str = typer.Option("default", help="Teacher dir (with training.json)."),
    eval_json: Path = typer.Option(None, help="Scores from `autocompress eval --json`."),
) -> None:
    """Write the model card (README.md) from the training record and the scores."""
    from autocompress.paths import resolve_model_dir
    from autocompress.teacher import write_model_card

    path = write_model_card(resolve_model_dir(model), eval_json)
    typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.add_typer(teacher_app, name="teacher")
