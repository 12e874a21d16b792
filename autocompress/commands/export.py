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
        "TensorRT-LLM, llama.cpp `deci`, transformers remote code). `gguf`: one llama.cpp "
        "file (`llama` when homogeneous, else `deci`) with the tokenizer; --out may name "
        "the .gguf file.",
    ),
    dtype: str = typer.Option(
        "f32", "--dtype", help="gguf only: f32, f16, q8_0 or q4_0 (2-D weights)."),
    engine: list[str] = typer.Option(
        None,
        "--engine",
        "-e",
        help="nemotron-nas only: serving engine the export must load exactly: vllm, "
        "trtllm, llama.cpp, hf (repeatable). Refuses, naming the rule, what that engine "
        "cannot compute. Default: the most widely loadable form, listing its engines.",
    ),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output directory."),
) -> None:
    """Export a model to a heterogeneous format serving engines read.

    nemotron-nas: writes stand-ins (zero-output blocks, zero-padded FFNs, a copied
    LM head) where an engine would otherwise mis-read the model, refuses (naming
    the rule) what no exact form exists for; also writes per_layer_config.json.
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
    report = export_nemotron_nas(model, out, engines=engine or None, overwrite=overwrite)
    console = Console()
    console.print(f"wrote {report.out_dir} ({report.format}, {report.num_params:,} parameters)")
    console.print(f"loads exactly in: {', '.join(report.engines)}")
    for key, where in report.stand_ins.items():
        console.print(f"stand-in {key}: {where}", markup=False)
    for lines in report.refused.values():
        console.print(f"not for {lines[0]}", markup=False)
