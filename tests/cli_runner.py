"""Run the `autocompress` console script in-process, as tests of its exit codes need."""

from __future__ import annotations

import sys

import pytest


def cli(capsys, monkeypatch, *args) -> tuple[int, str]:
    """Run ``autocompress ARGS`` as the console script does; (exit code, stderr)."""
    from autocompress.cli import main  # lazy: after the test has set its environment

    monkeypatch.setattr(sys, "argv", ["autocompress", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    code = exit_info.value.code
    return (0 if code is None else code), capsys.readouterr().err
