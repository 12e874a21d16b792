"""CLI: `autocompress export` (write a model in a format serving engines read)."""

from __future__ import annotations

from pathlib import Path

import typer

from autocompress.commands import MODEL_HELP


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("export")(export_command)


def export_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write."),
    fmt: str = typer.Option(
        "nemotron-nas",
        "--format",
        "-f",
        help="Target format. `nemotron-nas`: DeciLMForCausalLM block_configs (vLLM, "
        "TensorRT-LLM, llama.cpp `deci`).",
    ),
    ffn_format: str = typer.Option(
        "ffn_mult",
        help="How FFN widths are written: `ffn_mult` (classic, widths must be "
        "multiples of 256) or `intermediate_size` (newer checkpoints, exact).",
    ),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output directory."),
) -> None:
    """Export a model to a heterogeneous format serving engines read.

    Refuses, naming the layer, what the format cannot represent; also writes
    per_layer_config.json (transformers v5 per-layer overrides).
    """
    from rich.console import Console

    from autocompress.errors import AutoCompressError
    from autocompress.export import export_nemotron_nas

    if fmt != "nemotron-nas":
        raise AutoCompressError(f"unknown export format {fmt!r}", hint="use --format nemotron-nas")
    if ffn_format not in ("ffn_mult", "intermediate_size"):
        raise AutoCompressError(
            f"unknown --ffn-format {ffn_format!r}", hint="use ffn_mult or intermediate_size"
        )
    report = export_nemotron_nas(model, out, ffn_format=ffn_format, overwrite=overwrite)
    console = Console()
    console.print(f"wrote {report.out_dir} ({report.format}, {report.num_params:,} parameters)")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
