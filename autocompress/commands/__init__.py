"""CLI command modules, one per area; each exposes register(app)."""

import typer

MODEL_HELP = ("Model directory (Llama, Mistral, Qwen2, Qwen3 or compressed), a named teacher "
              "(`default`, `smollm2-135m`; see `autocompress teacher list`), a registered model "
              "(models:/NAME/VERSION) or a hub id "
              "(org/name, where a network exists).")


def format_option(what: str) -> typer.models.OptionInfo:
    """``--format table|json``: how a command prints (``--json PATH`` always writes a file)."""
    return typer.Option("table", "--format", help=f"table, or json to print {what} as JSON.")


def print_json(fmt: str) -> bool:
    """Whether ``--format`` asks for JSON (anything else than table|json is a usage error)."""
    from autocompress.errors import AutoCompressError

    if fmt not in ("table", "json"):
        raise AutoCompressError(f"unknown --format {fmt!r}", "use --format table or json")
    return fmt == "json"
