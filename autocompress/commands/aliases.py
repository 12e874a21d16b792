"""Old option spellings, kept for one release as hidden aliases.

The command line was made consistent (one ``--model``, one ``--data``, ``--json PATH``
always an output file, deep settings through ``--config``). Scripts written against the
old spellings keep working for one release: a command registered with
``cls=aliased(ALIASES)`` rewrites each old spelling into the new one before the options
are parsed, and says on stderr, in one line, what to write instead. The old spellings are
not options of the command, so ``--help`` does not show them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import typer
from typer.core import TyperCommand


@dataclass(frozen=True)
class Alias:
    """What an old spelling becomes.

    ``new`` is the option that replaces it. With ``key`` the old option's value becomes a
    ``KEY=VALUE`` entry of ``new`` (a ``--limit`` or ``--config`` setting). ``value`` is
    the fixed value of an old on/off flag (it takes no value on the command line);
    ``convert`` rewrites a value whose old form the new option does not read as is.
    """

    new: str
    key: str | None = None
    value: str | None = None
    convert: Callable[[str], str] | None = None

    def instead(self) -> str:
        """The new spelling, as the deprecation line shows it."""
        if self.key is None:
            return f"{self.new} {self.value}" if self.value is not None else self.new
        shown = self.value if self.value is not None else "VALUE"
        return f"{self.new} {self.key}={shown}"


def renamed(new: str) -> Alias:
    """An option that only changed its name (it takes the same value)."""
    return Alias(new)


def setting(key: str, value: str | None = None,
            convert: Callable[[str], str] | None = None) -> Alias:
    """An option whose setting moved into ``--config`` under ``key``."""
    return Alias("--config", key, value, convert)


def as_list(text: str) -> str:
    """``1,0.5`` (an old comma list) -> ``[1,0.5]`` (a YAML list)."""
    return f"[{text}]"


def as_mapping(text: str) -> str:
    """``1:2,2:4`` (old STUDENT:TEACHER pairs) -> ``{1: 2, 2: 4}`` (a YAML mapping)."""
    return "{" + text.replace(":", ": ") + "}"


def deprecation_line(old: str, alias: Alias) -> str:
    """The one line an old spelling prints on stderr."""
    return (f"note: {old} is an old spelling, kept for one release; "
            f"use {alias.instead()} instead")


def rewrite(args: list[str], aliases: dict[str, Alias]) -> list[str]:
    """``args`` with every old spelling replaced by its new one (one note per old one)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":  # everything after it is a value, never an option
            return out + args[i:]
        flag, has_inline, inline = arg.partition("=")
        alias = aliases.get(flag) if arg.startswith("-") else None
        if alias is None:
            out.append(arg)
            i += 1
            continue
        if alias.value is not None:  # an old on/off flag
            value, i = alias.value, i + 1
        elif has_inline:
            value, i = inline, i + 1
        elif i + 1 < len(args):
            value, i = args[i + 1], i + 2
        else:  # no value: the new option reports it as missing
            out.append(alias.new)
            i += 1
            continue
        typer.echo(deprecation_line(flag, alias), err=True)
        if alias.convert is not None:
            value = alias.convert(value)
        out += [alias.new, f"{alias.key}={value}" if alias.key else value]
    return out


def aliased(aliases: dict[str, Alias]) -> type[TyperCommand]:
    """A command class that accepts the old spellings in ``aliases`` (old -> Alias)."""

    class AliasedCommand(TyperCommand):
        def parse_args(self, ctx, args):
            return super().parse_args(ctx, rewrite(list(args), aliases))

    AliasedCommand.old_spellings = dict(aliases)  # what the command still accepts
    return AliasedCommand


# `--json` once printed JSON on these commands; it is now always an output file.
PRINT_JSON = {"--json": Alias("--format", value="json")}


# A model once given as the command's argument (`arch show DIR`) is now `--model DIR`.


def old_positional() -> typer.models.ArgumentInfo:
    """The hidden argument that still takes a model given the old way, by position."""
    return typer.Argument(None, hidden=True, metavar="")


def model_or_positional(model: str | None, old: str | None, flag: str = "--model") -> str:
    """The model of ``--model``, or of the old positional argument (with its note)."""
    from autocompress.errors import AutoCompressError

    if old is not None:
        if model is not None:
            raise AutoCompressError(f"the model is given twice ({flag} {model} and {old})",
                                    f"give it once, as {flag}")
        typer.echo(f"note: a model given by position is an old spelling, kept for one "
                   f"release; use {flag} {old} instead", err=True)
        return old
    if model is None:
        raise AutoCompressError(f"missing option {flag}", f"pass {flag} MODEL")
    return model
