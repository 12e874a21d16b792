"""The limit options of every command that takes limits, declared once.

A command asks for ``limits: Limits`` and is registered as
``app.command(name)(limit_options(command))``; the wrapper puts one option per
``Limits`` field in its place (``--max-ttft-ms``, ``--max-tpot-ms``, ``--max-e2e-ms``,
``--min-throughput``, ``--max-memory-gb``) and calls the command with the ``Limits``
they make (unset options stay unset).
``--min-throughput-tok-s``, the spelling ``autocompress run`` once used, is kept as a
hidden alias of ``--min-throughput``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import typer

from autocompress.limits import Limits, limits_from_options

# Limits field -> (option, help). Every field of Limits, in the order --help shows.
LIMIT_OPTIONS: dict[str, tuple[str, str]] = {
    "max_ttft_ms": ("--max-ttft-ms", "Limit: time to first token (ms)."),
    "max_tpot_ms": ("--max-tpot-ms", "Limit: time per output token (ms)."),
    "max_e2e_ms": ("--max-e2e-ms", "Limit: end-to-end request latency (ms)."),
    "min_throughput_tok_s": (
        "--min-throughput", "Limit: generated tokens/s over all concurrent requests (lower "
        "bound)."),
    "max_memory_gb": ("--max-memory-gb", "Limit: peak memory (GB = 1e9 bytes)."),
}
# The default of a command's ``limits`` parameter when called directly (e.g. by ``demo``).
NO_LIMITS = Limits()

# Old spellings still accepted, hidden from --help: field -> option.
HIDDEN_ALIASES = {"min_throughput_tok_s": "--min-throughput-tok-s"}

FRACTION_HELP = (
    "Set a limit at this fraction of the teacher's predicted cost on the workload's main "
    "metric (e.g. 0.5 = half the teacher's TPOT); combines with explicit limits."
)


def budget_fraction_option() -> typer.models.OptionInfo:
    """The ``--budget-fraction`` option (a fresh one per command, as typer expects)."""
    return typer.Option(None, "--budget-fraction", help=FRACTION_HELP)


def limit_options(command: Callable) -> Callable:
    """Replace ``command``'s ``limits: Limits`` parameter by the limit options."""
    signature = inspect.signature(command, eval_str=True)
    names = {field: f"limit_{field}" for field in LIMIT_OPTIONS}
    aliases = {field: f"alias_{field}" for field in HIDDEN_ALIASES}
    options = [inspect.Parameter(names[field], inspect.Parameter.KEYWORD_ONLY,
                                 annotation=float | None,
                                 default=typer.Option(None, flag, help=text))
               for field, (flag, text) in LIMIT_OPTIONS.items()]
    options += [inspect.Parameter(aliases[field], inspect.Parameter.KEYWORD_ONLY,
                                  annotation=float | None,
                                  default=typer.Option(None, flag, hidden=True))
                for field, flag in HIDDEN_ALIASES.items()]
    params = []
    for param in signature.parameters.values():
        if param.name == "limits":
            params += options
        else:
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))

    @functools.wraps(command)
    def wrapper(**kwargs):
        values = {field: kwargs.pop(name) for field, name in names.items()}
        for field, name in aliases.items():
            alias = kwargs.pop(name)
            if values[field] is None:
                values[field] = alias
        return command(limits=limits_from_options(**values), **kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
