"""The command line stays small and consistent (#50, item 8).

One flag for a model (``--model``; ``--teacher`` only beside it, where a command takes a
student and its teacher), ``--json PATH`` always an output file (``--format json`` prints),
deep settings through ``--config``, at most ``MAX_VISIBLE_OPTIONS`` options in ``--help``
over all commands, and the old spellings still working for one release with a note.
"""

from __future__ import annotations

import json
import sys

import pytest
import typer
from typer.testing import CliRunner

from autocompress.cli import app

MAX_VISIBLE_OPTIONS = 120
# Parameter names that hold a model a command reads.
MODEL_PARAMS = {"model", "teacher", "student", "model_dir", "teacher_dir"}

runner = CliRunner()


def _leaves(command, path: tuple[str, ...] = ()):
    """(path, command) of every command that runs (groups are walked, not listed)."""
    if getattr(command, "commands", None):
        for name, sub in command.commands.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path, command


COMMANDS = list(_leaves(typer.main.get_command(app)))


def _visible_options(command) -> list:
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden]


def test_the_visible_options_stay_few():
    counts = {" ".join(path): len(_visible_options(cmd)) for path, cmd in COMMANDS}
    assert len(counts) >= 30  # every command is counted
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= MAX_VISIBLE_OPTIONS, f"{total} visible options; largest: {largest}"


@pytest.mark.parametrize("path, command", COMMANDS, ids=lambda v: " ".join(v)
                         if isinstance(v, tuple) else "")
def test_a_model_is_always_given_as_model(path, command):
    """A model input is the option --model; a second one (a student's teacher) is --teacher."""
    models = [p for p in command.params if p.name in MODEL_PARAMS and not p.hidden]
    for param in models:
        assert param.param_type_name == "option", (path, param.name)
    flags = sorted(flag for p in models for flag in p.opts if flag.startswith("--"))
    assert flags in ([], ["--model"], ["--model", "--teacher"]), (path, flags)


@pytest.mark.parametrize("path, command", COMMANDS, ids=lambda v: " ".join(v)
                         if isinstance(v, tuple) else "")
def test_json_is_an_output_file_and_data_is_data(path, command):
    for param in _visible_options(command):
        if "--json" in param.opts:
            assert not param.is_flag and not param.multiple, (path, "--json must be one PATH")
            assert "write" in (param.help or "").lower(), (path, param.help)
        assert "--corpus" not in param.opts, (path, "the corpus is --data")


@pytest.mark.parametrize("path, command", COMMANDS, ids=lambda v: " ".join(v)
                         if isinstance(v, tuple) else "")
def test_an_old_spelling_never_hides_a_current_option(path, command):
    """An old spelling is rewritten before parsing: it must not be a flag the command has."""
    old = set(getattr(command, "old_spellings", {}))
    flags = {flag for p in command.params for flag in (*p.opts, *p.secondary_opts)}
    assert not old & flags, (path, old & flags)
    if path == ("search",):  # the walk sees the old spellings
        assert {"--teacher", "--steps", "--max-tpot-ms"} <= old
    for alias in getattr(command, "old_spellings", {}).values():
        assert alias.new in flags, (path, alias.new)  # and it leads to one the command has


def test_json_path_writes_a_file_and_format_json_prints(tmp_path, monkeypatch):
    out = tmp_path / "profile.json"
    result = runner.invoke(app, ["hardware", "profile", "--no-bench", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["cpu"]["logical_cores"] >= 1
    printed = runner.invoke(app, ["costmodel", "presets", "--format", "json"])
    assert printed.exit_code == 0 and "interactive-cpu" in json.loads(printed.stdout)


def cli(capsys, monkeypatch, *args) -> tuple[int, str, str]:
    """Run ``autocompress ARGS`` as the console script does: (exit code, stdout, stderr)."""
    from autocompress.cli import main

    monkeypatch.setattr(sys, "argv", ["autocompress", *map(str, args)])
    code = 0
    try:
        main()
    except SystemExit as exit_info:
        code = exit_info.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_an_old_spelling_still_works_and_says_what_to_use(capsys, monkeypatch):
    code, out, err = cli(capsys, monkeypatch, "costmodel", "targets", "--json")
    assert code == 0 and json.loads(out)  # still prints the JSON it printed before
    assert err.strip() == ("note: --json is an old spelling, kept for one release; use "
                           "--format json instead")
    code, out, err = cli(capsys, monkeypatch, "arch", "show", "default", "--format", "json")
    assert code == 0 and json.loads(out)["hidden_size"] > 0
    assert "use --model default instead" in err and len(err.strip().splitlines()) == 1


def test_old_options_land_in_the_config(capsys, monkeypatch, tmp_path):
    """`--max-tpot-ms -1` becomes `--limit tpot=-1` and `--steps 0` `dnas.steps=0`: the
    values reach the same checks (a note per old option, then the one-line error)."""
    code, _, err = cli(capsys, monkeypatch, "search", "--teacher", tmp_path / "none",
                       "--out", tmp_path / "a.json", "--steps", "0")
    lines = err.strip().splitlines()
    assert code == 2 and "use --model instead" in lines[0]
    assert "use --config dnas.steps=VALUE instead" in lines[1]
    assert lines[2].startswith("error: invalid search settings (--config): dnas.steps")
    code, _, err = cli(capsys, monkeypatch, "verify", "--model", tmp_path / "none",
                       "--max-tpot-ms", "-1")
    lines = err.strip().splitlines()
    assert code == 2 and "use --limit tpot=VALUE instead" in lines[0]
    assert lines[1].startswith("error: invalid limits: max_tpot_ms")


@pytest.mark.parametrize("command", [
    ["search", "--model", "default", "--out", "{tmp}/a.json"],
    ["baseline", "minitron", "--model", "default", "--out", "{tmp}/a.json", "--params", "1M"],
    ["distill", "--model", "default", "--teacher", "default", "--tokens", "10",
     "--out", "{tmp}/d"],
    ["eval", "--model", "default"],
    ["verify", "--model", "default"],
    ["importance", "--model", "default", "--out", "{tmp}/i.safetensors"],
    ["prune", "--model", "default", "--arch", "{tmp}/a.json", "--out", "{tmp}/p"],
    ["run", "--budget-fraction", "0.5"],
    ["teacher", "train"],
    ["costmodel", "fit"],
    ["costmodel", "validate"],
    ["costmodel", "predict", "--model", "default", "--workload", "interactive"],
], ids=lambda c: " ".join(c[:2]))
def test_an_unknown_config_key_is_one_line_and_exit_2(command, capsys, monkeypatch, tmp_path):
    """From a file and as KEY=VALUE: the key is named before any work starts."""
    config = tmp_path / "settings.yaml"
    config.write_text("colour: blue\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    for entry in (str(config), "colour=blue"):
        code, out, err = cli(capsys, monkeypatch, *args, "--config", entry)
        lines = err.strip().splitlines()
        assert code == 2, (command, entry, out, err)
        assert len(lines) == 2 and lines[0].startswith("error: invalid "), err
        assert "colour: Extra inputs are not permitted" in lines[0], err
        assert lines[1].startswith("hint: "), err


def test_config_files_and_entries_merge_and_later_wins(tmp_path):
    from autocompress.arch_search.config import SearchConfig
    from autocompress.commands.settings import load_settings

    file = tmp_path / "search.yaml"
    file.write_text("dnas:\n  steps: 40\n  seed: 3\nspace:\n  head_fractions: [1, 0.5]\n")
    config = load_settings(SearchConfig, [str(file), "dnas.steps=12", '{"score": "probability"}'],
                           "search")
    assert (config.dnas.steps, config.dnas.seed, config.score) == (12, 3, "probability")
    assert config.space.head_fractions == [1.0, 0.5]
    assert config.selection == SearchConfig().selection  # what no entry names keeps its default


def test_a_repeated_old_option_appends_to_its_list():
    """`costmodel fit --workload a --workload b` (the old spelling) keeps both workloads."""
    from autocompress.commands.aliases import rewrite
    from autocompress.commands.costmodel import FIT_ALIASES
    from autocompress.commands.settings import read_entries

    args = rewrite(["--workload", "interactive-cpu", "-w", "datacenter-cpu"], FIT_ALIASES)
    assert args == ["--config", "workloads[]=interactive-cpu",
                    "--config", "workloads[]=datacenter-cpu"]
    assert read_entries(args[1::2]) == {"workloads": ["interactive-cpu", "datacenter-cpu"]}


def test_limit_entries_take_every_spelling_and_a_file(tmp_path):
    from autocompress.commands.limit_options import parse_limits
    from autocompress.errors import AutoCompressError
    from autocompress.limits import Limits

    file = tmp_path / "limits.json"
    file.write_text('{"max_memory_gb": 0.5, "max_tpot_ms": 9}')
    assert parse_limits([str(file), "tpot=3", "throughput_tok_s=40", "max-e2e-ms=100"]) == \
        Limits(max_tpot_ms=3, max_memory_gb=0.5, min_throughput_tok_s=40, max_e2e_ms=100)
    with pytest.raises(AutoCompressError, match="no limit 'speed'"):
        parse_limits(["speed=3"])
