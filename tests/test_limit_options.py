"""The limit options every limit-taking command shares (declared once)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from autocompress.commands.limit_options import limit_options
from autocompress.limits import Limits


def _app(seen: list) -> typer.Typer:
    def command(name: str = typer.Option("x"), limits: Limits = Limits()) -> None:
        seen.append((name, limits))

    app = typer.Typer()
    app.command()(limit_options(command))
    return app


@pytest.mark.parametrize("args, expected", [
    ([], Limits()),
    (["--max-tpot-ms", "3", "--max-memory-gb", "0.5"], Limits(max_tpot_ms=3, max_memory_gb=0.5)),
    (["--min-throughput", "40"], Limits(min_throughput_tok_s=40)),
    (["--min-throughput-tok-s", "40"], Limits(min_throughput_tok_s=40)),  # the old spelling
])
def test_limit_options_make_the_limits(args, expected):
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["--name", "y", *args])
    assert result.exit_code == 0, result.output
    assert seen == [("y", expected)]


def test_every_limit_field_has_an_option_and_the_alias_is_hidden():
    result = CliRunner().invoke(_app([]), ["--help"], terminal_width=200)
    for flag in ("--max-ttft-ms", "--max-tpot-ms", "--max-e2e-ms", "--min-throughput",
                 "--max-memory-gb"):
        assert flag in result.output
    assert "--min-throughput-tok-s" not in result.output
    assert set(Limits.model_fields) == {
        "max_ttft_ms", "max_tpot_ms", "max_e2e_ms", "min_throughput_tok_s", "max_memory_gb"}


def test_the_commands_that_take_limits_all_use_them():
    from autocompress.cli import app

    runner = CliRunner()
    for command in (["search"], ["baseline", "minitron"], ["run"], ["verify"]):
        out = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        assert "--min-throughput " in out and "--max-memory-gb" in out, command
        assert "--min-throughput-tok-s" not in out, command
