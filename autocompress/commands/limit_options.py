"""The ``--limit`` option of every command that takes limits, declared once.

A command asks for ``limits: Limits`` and is registered as
``app.command(name, cls=aliased(LIMIT_ALIASES))(limit_options(command))``; the wrapper
puts one repeatable ``--limit`` option in its place and calls the command with the
``Limits`` it makes. Each entry is ``METRIC=VALUE`` (``--limit tpot=5 --limit memory=0.5``;
the metric says the direction: throughput is a lower bound, the others upper bounds) or a
JSON/YAML file of them. The five options it replaces (``--max-tpot-ms`` ...) stay one
release as hidden old spellings.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import typer

from autocompress.commands.aliases import Alias
from autocompress.errors import AutoCompressError
from autocompress.limits import LIMIT_METRICS, Limits, limits_from_options

# Short metric name -> Limits field: ttft, tpot, e2e (ms), throughput (tokens/s), memory (GB).
SHORT_NAMES: dict[str, str] = {metric.split("_")[0]: field
                               for field, (metric, _) in LIMIT_METRICS.items()}
LIMIT_HELP = (
    "A limit as METRIC=VALUE, repeatable: tpot, ttft, e2e (ms, upper bounds), throughput "
    "(generated tokens/s over all concurrent requests, a lower bound), memory (peak GB); "
    "or a JSON/YAML file of Limits fields. E.g. --limit tpot=5 --limit memory=0.5."
)
# The default of a command's ``limits`` parameter when called directly.
NO_LIMITS = Limits()

# The old options, now hidden: each becomes `--limit METRIC=VALUE`.
LIMIT_ALIASES: dict[str, Alias] = {
    "--max-ttft-ms": Alias("--limit", "ttft"),
    "--max-tpot-ms": Alias("--limit", "tpot"),
    "--max-e2e-ms": Alias("--limit", "e2e"),
    "--min-throughput": Alias("--limit", "throughput"),
    "--min-throughput-tok-s": Alias("--limit", "throughput"),
    "--max-memory-gb": Alias("--limit", "memory"),
}

FRACTION_HELP = (
    "Set a limit at this fraction of the teacher's predicted cost on the workload's main "
    "metric (e.g. 0.5 = half the teacher's TPOT); combines with --limit."
)


def budget_fraction_option() -> typer.models.OptionInfo:
    """The ``--budget-fraction`` option (a fresh one per command, as typer expects)."""
    return typer.Option(None, "--budget-fraction", help=FRACTION_HELP)


def parse_limits(entries: list[str] | None) -> Limits:
    """``--limit`` entries (``METRIC=VALUE`` or a file, later ones win) as ``Limits``."""
    from autocompress.commands.settings import read_entries

    data = read_entries([e for e in entries or [] if "=" not in e], option="--limit")  # files
    for entry in entries or []:
        if "=" in entry:
            name, _, value = entry.partition("=")
            data[_field(name.strip())] = value.strip()
    return limits_from_options(None, **data)


def _field(name: str) -> str:
    """A metric's name in any of its spellings (tpot, tpot_ms, max_tpot_ms, max-tpot-ms)."""
    key = name.lower().replace("-", "_")
    if key in LIMIT_METRICS:
        return key
    short = key.removeprefix("max_").removeprefix("min_").split("_")[0]
    if short in SHORT_NAMES:
        return SHORT_NAMES[short]
    raise AutoCompressError(f"no limit {name!r}",
                            f"use one of {', '.join(SHORT_NAMES)}, e.g. --limit tpot=5")


def limit_options(command: Callable) -> Callable:
    """Replace ``command``'s ``limits: Limits`` parameter by the ``--limit`` option."""
    signature = inspect.signature(command, eval_str=True)
    option = inspect.Parameter("limit_entries", inspect.Parameter.KEYWORD_ONLY,
                               annotation=list[str],
                               default=typer.Option([], "--limit", metavar="METRIC=VALUE",
                                                    help=LIMIT_HELP))
    params = [option if p.name == "limits" else p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
              for p in signature.parameters.values()]

    @functools.wraps(command)
    def wrapper(limit_entries: list[str], **kwargs):
        return command(limits=parse_limits(limit_entries), **kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
