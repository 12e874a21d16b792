"""`autocompress data ...`: build and inspect the code corpus."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

data_app = typer.Typer(help="Build and inspect the training / calibration / held-out corpus.",
                       no_args_is_help=True)


@data_app.command("prepare")
def prepare(
    out: Path = typer.Option(None, help="Corpus directory (default: $AUTOCOMPRESS_HOME/corpus)."),
    source: str = typer.Option(
        None, help="A `datasets` source (hub id, or local json/jsonl/parquet/txt files). "
        "Default: the Python standard library of this interpreter, without its tests."),
    text_column: str = typer.Option("text", help="Column holding the text, for --source."),
) -> None:
    """Collect the corpus and split it 90/4/6 into train / calibration / held-out.

    The split is by a stable hash of each file's path, so it never changes when
    files are added elsewhere. A manifest with every file's sha256 and a corpus
    fingerprint is written last.
    """
    from autocompress.data.corpus import build_corpus
    from autocompress.paths import default_corpus_dir

    out = out or default_corpus_dir()
    manifest = build_corpus(out, source=source, text_column=text_column)
    table = Table(title=f"corpus {manifest.source} → {out}")
    for col in ("split", "files", "MB"):
        table.add_column(col, justify="right")
    for split, n in manifest.num_files.items():
        table.add_row(split, str(n), f"{manifest.num_bytes[split] / 1e6:.2f}")
    console = Console()
    console.print(table)
    console.print(f"fingerprint {manifest.fingerprint}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.add_typer(data_app, name="data")
