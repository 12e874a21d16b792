"""CLI: `autocompress importance`, `prune` and `arch show` (prune a teacher to an architecture)."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import BaseModel, ConfigDict, Field

from autocompress.commands import MODEL_HELP, format_option, print_json
from autocompress.commands.aliases import (
    PRINT_JSON,
    aliased,
    model_or_positional,
    old_positional,
    renamed,
    setting,
)
from autocompress.commands.settings import config_option, load_settings

IMPORTANCE_CONFIG_EXAMPLE = (
    "Keys of CalibrationConfig, e.g. seq_len=256, batch_size=8, num_batches=16, "
    "removal_batches=2 (loss on removal of each layer/block; 0 skips it), seed=0, "
    "criterion=taylor|activation (|w·dL/dw| or Minitron's forward-only activations)."
)
PRUNE_CONFIG_EXAMPLE = (
    "Keys: depth_metric=cosine|loss (how layers to drop are picked), random_channels=true "
    "(ignore importance, keep random channels: an ablation), seed=0 (of the random channels)."
)

# Old spellings (one release).
IMPORTANCE_ALIASES = {
    "--seq-len": setting("seq_len"), "--batch-size": setting("batch_size"),
    "--batches": setting("num_batches"), "--removal-batches": setting("removal_batches"),
    "--seed": setting("seed"), "--criterion": setting("criterion"),
}
PRUNE_ALIASES = {
    "--teacher": renamed("--model"), "-t": renamed("--model"),
    "--depth-metric": setting("depth_metric"), "--seed": setting("seed"),
    "--random-channels": setting("random_channels", "true"),
}


class PruneSettings(BaseModel):
    """The settings of ``prune_checkpoint`` that are not its inputs."""

    model_config = ConfigDict(extra="forbid")

    depth_metric: str = Field("cosine", pattern="^(cosine|loss)$")
    random_channels: bool = False
    seed: int = 0


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("importance", cls=aliased(IMPORTANCE_ALIASES))(importance_command)
    app.command("prune", cls=aliased(PRUNE_ALIASES))(prune_command)
    arch_app = typer.Typer(
        help="Inspect model architectures (per-layer shapes).", no_args_is_help=True
    )
    arch_app.command("show", cls=aliased(PRINT_JSON))(arch_show_command)
    app.add_typer(arch_app, name="arch")


# ---------------------------------------------------------------- importance


def importance_command(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="File to write (.safetensors)."),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="Corpus directory (from `autocompress data prepare`); its calibration split is "
        "used. Default: the standard-library corpus in AUTOCOMPRESS_HOME (built if absent).",
    ),
    config: list[str] = config_option(IMPORTANCE_CONFIG_EXAMPLE),
) -> None:
    """Compute Minitron importance (neurons, heads, KV groups, hidden channels, depth).

    Activations in fp32 (and gradients for criterion=taylor); the file is reused by
    `autocompress prune --importance` and by the search.
    """
    from rich.console import Console

    from autocompress.atomic import check_out_file
    from autocompress.importance import CalibrationConfig, importance_for_checkpoint

    check_out_file(out, example="importance.safetensors")  # before the calibration passes
    calib = load_settings(CalibrationConfig, config, "importance",
                          base={"corpus_dir": str(data) if data else None})
    imp = importance_for_checkpoint(model, calib, out_path=out)
    console = Console()
    console.print(f"wrote {out} ({imp.num_tokens} tokens, base loss {imp.base_loss:.4f})")
    _print_depth(console, imp)


def _print_depth(console, imp) -> None:
    from rich.table import Table

    table = Table(title="Depth importance (higher = more important)")
    for column in (
        "layer",
        "1-cos layer",
        "1-cos attn",
        "1-cos ffn",
        "Δloss layer",
        "Δloss attn",
        "Δloss ffn",
    ):
        table.add_column(column, justify="right")
    for i in range(imp.arch.num_layers):
        values = [
            imp.layer_cosine,
            imp.attention_cosine,
            imp.ffn_cosine,
            imp.layer_loss,
            imp.attention_loss,
            imp.ffn_loss,
        ]
        table.add_row(str(i), *[_fmt(float(v[i])) for v in values])
    console.print(table)


def _fmt(value: float) -> str:
    return "—" if value != value else f"{value:.4f}"  # NaN -> dash


# --------------------------------------------------------------------- prune


def prune_command(
    model: str = typer.Option(..., "--model", "-m", help="The teacher to prune. " + MODEL_HELP),
    arch: Path = typer.Option(
        ...,
        "--arch",
        "-a",
        help='ArchSpec JSON: {"hidden_size": H, "layers": [{"attention": {"num_heads": N, '
        '"num_kv_heads": K} | null, "ffn": {"intermediate_size": I} | null}, ...]}. '
        "Fewer layers than the teacher drops the least important layers.",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the pruned model."),
    importance: Path | None = typer.Option(
        None,
        "--importance",
        "-i",
        help="Importance file from `autocompress importance`; computed on the default "
        "calibration data when omitted.",
    ),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="Corpus directory for computing importance when --importance is omitted "
        "(default: the standard-library corpus).",
    ),
    overwrite: bool = typer.Option(False, help="Replace a non-empty output directory."),
    config: list[str] = config_option(PRUNE_CONFIG_EXAMPLE),
) -> None:
    """Prune a teacher to an ArchSpec: slice heads, KV groups, FFN neurons, hidden channels.

    Writes a HeteroForCausalLM (loads with AutoModelForCausalLM) plus tokenizer and a
    surgery.json record; keep-everything pruning reproduces the teacher exactly.
    """
    from rich.console import Console

    from autocompress.arch import ArchSpec
    from autocompress.importance import CalibrationConfig
    from autocompress.prune import prune_checkpoint

    settings = load_settings(PruneSettings, config, "prune")
    spec = ArchSpec.from_json(arch)
    record = prune_checkpoint(
        model,
        spec,
        out,
        importance=importance,
        calibration=CalibrationConfig(corpus_dir=str(data) if data else None),
        random_channels=settings.random_channels,
        seed=settings.seed,
        depth_metric=settings.depth_metric,
        overwrite=overwrite,
    )
    Console().print(
        f"wrote {out}: {record['student_params']:,} parameters "
        f"({record['student_params'] / record['teacher_params']:.1%} of the teacher), "
        f"teacher layers kept {record['layer_map']}"
    )


# --------------------------------------------------------------------- arch


def arch_show_command(
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Required."),
    fmt: str = format_option("the ArchSpec JSON"),
    old_model: str = old_positional(),
) -> None:
    """Show a model's per-layer shapes (heads, KV heads, FFN width, parameters)."""
    from rich.console import Console

    from autocompress.arch import ArchSpec
    from autocompress.errors import AutoCompressError
    from autocompress.modeling.loading import load_config

    model = model_or_positional(model, old_model)
    source, config = load_config(model)
    spec = ArchSpec.from_hf_config(config)
    if print_json(fmt):
        typer.echo(spec.to_json())
        return
    if not spec.layers:
        raise AutoCompressError(f"{source} has no layers")
    Console().print(_arch_table(spec, source, config))


def _arch_table(spec, source: str, config):
    from rich.table import Table

    arch_name = ", ".join(getattr(config, "architectures", None) or [config.model_type])
    table = Table(
        title=f"{arch_name} — {source}",
        caption=(
            f"hidden {spec.hidden_size} · head_dim {spec.head_dim} · vocab {spec.vocab_size} · "
            f"tied {bool(spec.tie_word_embeddings)} · qk_norm {bool(spec.qk_norm)} · "
            f"KV heads total {spec.kv_heads_total()} · params {spec.num_params():,}"
        ),
    )
    for column in ("layer", "heads", "KV heads", "group", "FFN width", "params"):
        table.add_column(column, justify="right")
    for i, layer in enumerate(spec.layers):
        att, ffn = layer.attention, layer.ffn
        table.add_row(
            str(i),
            str(att.num_heads) if att else "no-op",
            str(att.num_kv_heads) if att else "—",
            str(att.num_heads // att.num_kv_heads) if att else "—",
            str(ffn.intermediate_size) if ffn else "no-op",
            f"{spec.layer_params(i):,}",
        )
    table.add_row("emb+head+norm", "", "", "", "", f"{spec.embedding_params():,}", end_section=True)
    return table
