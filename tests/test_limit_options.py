"""The --limit option every limit-taking command shares (declared once)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from autocompress.commands.aliases import aliased
from autocompress.commands.limit_options import LIMIT_ALIASES, limit_options
from autocompress.limits import Limits


def _app(seen: list) -> typer.Typer:
    def command(name: str = typer.Option("x"), limits: Limits = Limits()) -> None:
        seen.append((name, limits))

    app = typer.Typer()
    app.command(cls=aliased(LIMIT_ALIASES))(limit_options(command))
    return app


@pytest.mark.parametrize("args, expected", [
    ([], Limits()),
    (["--limit", "tpot=3", "--limit", "memory=0.5"], Limits(max_tpot_ms=3, max_memory_gb=0.5)),
    (["--limit", "throughput=40"], Limits(min_throughput_tok_s=40)),
    (["--limit", "max_ttft_ms=7", "--limit", "ttft=8"], Limits(max_ttft_ms=8)),  # later wins
    # The options --limit replaced, kept one release as hidden old spellings:
    (["--max-tpot-ms", "3", "--max-memory-gb", "0.5"], Limits(max_tpot_ms=3, max_memory_gb=0.5)),
    (["--min-throughput", "40"], Limits(min_throughput_tok_s=40)),
    (["--min-throughput-tok-s", "40"], Limits(min_throughput_tok_s=40)),
])
def test_limit_options_make_the_limits(args, expected):
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["--name", "y", *args])
    assert result.exit_code == 0, result.output
    assert seen == [("y", expected)]
    old = [arg for arg in args if arg in LIMIT_ALIASES]
    assert result.stderr.count("is an old spelling") == len(old)


def test_every_limit_is_named_in_the_help_and_the_old_options_are_hidden():
    result = CliRunner().invoke(_app([]), ["--help"], terminal_width=200)
    for metric in ("tpot", "ttft", "e2e", "throughput", "memory"):
        assert metric in result.output
    for flag in LIMIT_ALIASES:
        assert flag not in result.output
    assert set(Limits.model_fields) == {
        "max_ttft_ms", "max_tpot_ms", "max_e2e_ms", "min_throughput_tok_s", "max_memory_gb"}


def test_the_commands_that_take_limits_all_use_them():
    from autocompress.cli import app

    runner = CliRunner()
    for command in (["search"], ["baseline", "minitron"], ["run"], ["verify"]):
        out = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        assert "--limit " in out and "throughput" in out, command
        assert "--max-tpot-ms" not in out and "--min-throughput-tok-s" not in out, command
