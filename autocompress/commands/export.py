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
        "TensorRT-LLM, llama.cpp `deci`). `gguf`: one llama.cpp file (`llama` when "
        "homogeneous, else `deci`) with the tokenizer; --out may name the .gguf file.",
    ),
    dtype: str = typer.Option(
        "f32", "--dtype", help="gguf only: f32, f16, q8_0 or q4_0 (2-D weights)."),
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

    if fmt == "gguf":
        from autocompress.gguf_export import export_gguf

        written = export_gguf(model, out, dtype, overwrite=overwrite)
        Console().print(f"wrote {written.path} (GGUF {written.architecture}, {written.dtype}, "
                        f"{written.num_layers} layers; tokenizer: {written.tokenizer})")
        for note in written.notes:
            Console().print(f"note: {note}")
        return
    if fmt != "nemotron-nas":
        raise AutoCompressError(f"unknown export format {fmt!r}",
                                hint="use --format nemotron-nas or gguf")
    if ffn_format not in ("ffn_mult", "intermediate_size"):
        raise AutoCompressError(
            f"unknown --ffn-format {ffn_format!r}", hint="use ffn_mult or intermediate_size"
        )
    report = export_nemotron_nas(model, out, ffn_format=ffn_format, overwrite=overwrite)
    console = Console()
    console.print(f"wrote {report.out_dir} ({report.format}, {report.num_params:,} parameters)")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
