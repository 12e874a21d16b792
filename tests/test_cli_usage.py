"""The CLI's usage errors: every --help renders; bad values are one line and exit 2 (#13)."""

from __future__ import annotations

import json
import sys

import pytest
import typer
from cli_runner import cli
from typer.testing import CliRunner

from autocompress.cli import app

runner = CliRunner()


def _command_paths(command, prefix: tuple[str, ...] = ()) -> list[tuple]:
    paths = [prefix]
    if getattr(command, "commands", None):  # a group
        for name, sub in command.commands.items():
            paths.extend(_command_paths(sub, (*prefix, name)))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


def test_the_command_tree_is_walked():
    assert ("costmodel", "predict") in COMMANDS and ("verify",) in COMMANDS
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "autocompress")
def test_every_help_renders(path):
    result = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, f"{' '.join(path)} --help failed:\n{result.output}"
    # `bench compare` hands --help to bench/compare.py's argparse ("usage:").
    assert "usage" in result.output.lower() and "--help" in result.output


def test_commands_named_in_help_and_docs_exist():
    """Every `autocompress A B` the code's help texts and the README mention is a command
    (a help once sent users to a `costmodel targets` that did not exist)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [root / "README.md", *(root / "autocompress").rglob("*.py"),
             *(root / "bench").glob("*.py"), *(root / "flows").glob("*.py")]
    mention = re.compile(r"`autocompress ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
    groups = {path[0] for path in COMMANDS if len(path) == 2}
    missing = set()
    for file in files:
        for first, second in mention.findall(file.read_text()):
            known = ((first, second) in COMMANDS if first in groups and second
                     else (first,) in COMMANDS)
            if not known:
                missing.add(f"{file.relative_to(root)}: autocompress {first} {second}".strip())
    assert not missing, sorted(missing)
    assert ("costmodel", "targets") in COMMANDS


NEMOTRON = {"model_type": "nemotron-nas", "hidden_size": 64, "num_attention_heads": 4,
            "vocab_size": 100, "block_configs": [{"attention": {"n_heads_in_group": 2},
                                                  "ffn": {"ffn_mult": 1.0}}]}
LAYER = {"attention": {"num_heads": 4, "num_kv_heads": 2}, "ffn": {"intermediate_size": 64}}


def _json(tmp_path, name, data):
    import json

    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_predict_refuses_bad_shapes_and_workloads(tmp_path, capsys, monkeypatch):
    gpu = ["--target", "h100-sxm/vllm/bf16", "--workload", "interactive"]
    good = _json(tmp_path, "good.json", NEMOTRON)
    code, _ = cli(capsys, monkeypatch, "costmodel", "predict", "--model", good, *gpu,
                  "--format", "json")
    assert code == 0
    bad_runs = {
        "isl": (good, ["--config", "isl=-5"]),
        "osl": (good, ["--config", "osl=0"]),
        "batch: ": (good, ["--config", "concurrency=-1"]),
        "tp": (good, ["--config", "tp=0"]),
        "tp=3": (good, ["--config", "tp=3"]),  # 4 heads, 2 KV heads: not on 3 GPUs
        "num_attention_heads": (_json(tmp_path, "nokey.json", {
            k: v for k, v in NEMOTRON.items() if k != "num_attention_heads"}), []),
        "at least 1": (_json(tmp_path, "zero.json", {**NEMOTRON, "num_attention_heads": 0}), []),
        "does not divide": (_json(tmp_path, "six.json", {**NEMOTRON, "num_attention_heads": 6,
                                                         "block_configs": [{"attention": {
                                                             "n_heads_in_group": 4},
                                                             "ffn": {"ffn_mult": 1.0}}]}), []),
        "not a multiple": (_json(tmp_path, "gqa.json", {"hidden_size": 64, "layers": [
            {**LAYER, "attention": {"num_heads": 6, "num_kv_heads": 4}}]}), []),
        "no layers": (_json(tmp_path, "empty.json", {"hidden_size": 64, "layers": []}), []),
        "'ffn'": (_json(tmp_path, "noffn.json", {"hidden_size": 64, "layers": [
            {"attention": LAYER["attention"]}]}), []),
        "true/false": (_json(tmp_path, "bool.json", {"hidden_size": 64, "layers": [
            {**LAYER, "attention": {"num_heads": True, "num_kv_heads": 1}}]}), []),
    }
    for expected, (model, extra) in bad_runs.items():
        code, err = cli(capsys, monkeypatch, "costmodel", "predict", "--model", model, *gpu,
                        *extra)
        lines = err.strip().splitlines()
        assert code == 2, (expected, err)
        assert lines[0].startswith("error: ") and expected in lines[0], (expected, err)
        assert len(lines) == 2 and lines[1].startswith("hint: "), err
        assert "Traceback" not in err


def test_a_workload_about_another_metric_prices_that_metric(tmp_path, capsys, monkeypatch):
    """``PRESET:METRIC``: the preset's traffic with another main metric; an unknown metric
    is a usage error naming the metrics there are."""
    good = _json(tmp_path, "good.json", NEMOTRON)
    target = ["--target", "h100-sxm/vllm/bf16", "--format", "json"]
    monkeypatch.setattr(sys, "argv", ["autocompress", "costmodel", "predict", "--model",
                                      str(good), *target, "--workload", "local-coding:ttft_ms"])
    from autocompress.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main()
    payload = json.loads(capsys.readouterr().out)
    assert exit_info.value.code in (0, None) and payload["workload"]["main_metric"] == "ttft_ms"
    assert payload["workload"]["isl"] == 32768  # the preset's traffic
    code, err = cli(capsys, monkeypatch, "costmodel", "predict", "--model", good, *target,
                    "--workload", "local-coding:latency")
    lines = err.strip().splitlines()
    assert code == 2 and "unknown main metric 'latency'" in lines[0], err
    assert lines[1].startswith("hint: write PRESET:METRIC with METRIC one of ttft_ms"), err


def test_verify_usage_errors_exit_2_before_measuring(tmp_path, capsys, monkeypatch):
    runs = [["--limit", "tpot=-1"], ["--limit", "tpot=0"], ["--limit", "memory=-0.5"],
            ["--limit", "speed=3"], ["--config", "repeats=0"], ["--config", "warmup=-1"],
            ["--config", "isl=-5"], ["--config", "osl=0"], ["--config", "batch=0"]]
    files = {"cannot read": "{", "does not hold a mapping": "[1]",
             "Extra inputs": '{"max_tpt_ms": 4}', "valid number": '{"max_tpot_ms": "fast"}'}
    for index, text in enumerate(files.values()):
        (tmp_path / f"{index}.json").write_text(text)
        runs.append(["--limit", str(tmp_path / f"{index}.json")])
    runs.append(["--limit", str(tmp_path / "missing.json")])
    # A model that does not exist: any measurement would fail differently.
    for extra in runs:
        code, err = cli(capsys, monkeypatch, "verify", "--model", tmp_path / "no-model", *extra)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 2, (extra, err)
        assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), (extra, err)


def test_every_stage_option_is_checked_before_any_stage_runs(tmp_path, capsys, monkeypatch,
                                                            autocompress_home):
    """A bad setting of a late stage stops `run`, `bench compare` and bench/targets.py in one
    line, before Prefect starts (its home is made first) or any stage publishes an artifact."""
    prefect_home = tmp_path / "prefect"
    monkeypatch.setenv("PREFECT_HOME", str(prefect_home))
    monkeypatch.delenv("AUTOCOMPRESS_STORE", raising=False)
    bad = {'{"search": {"timing_drift": 0.7}}': "invalid search options: timing_drift: Input "
                                                "should be less than 0.5 (got 0.7)",
           '{"serch": {"timing_drift": 0.1}}': "serch: Extra inputs are not permitted",
           '{"search": {"dnas": {"stepz": 3}}}': "search options: dnas.stepz: Extra inputs",
           '{"verify": {"repeat": 3}}': "verify options: repeat: Extra inputs",
           '{"distill": {"tokens": 0}}': "distill options: tokens: Input should be greater",
           '{"validation": {"noise_retry": {"rounds": -1}}}': "noise_retry.rounds"}
    runs = [["run", "--budget-fraction", "0.5", "--config", text] for text in bad]
    runs.append(["bench", "compare", "--options", '{"search": {"timing_drift": 0.7}}'])
    for args, expected in zip(runs, [*bad.values(), "search options: timing_drift"],
                              strict=True):
        code, err = cli(capsys, monkeypatch, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 2, (args, err)
        assert lines[0].startswith("error: ") and expected in lines[0], (args, err)
        assert lines[1].startswith("hint: "), (args, err)
    from autocompress.cli import report_errors
    from bench.targets import main as targets_main

    with pytest.raises(SystemExit) as exit_info:  # as `python bench/targets.py` runs it
        report_errors(lambda: targets_main(["pareto", "--out", str(tmp_path / "out"),
                                            "--options", '{"verify": {"repeats": 0}}']))
    assert exit_info.value.code == 2 and "verify options: repeats" in capsys.readouterr().err
    assert not prefect_home.exists() and not (autocompress_home / "artifacts").exists()
    assert not (tmp_path / "out").exists()


def test_valid_stage_options_pass_and_the_flows_check_them_too():
    from autocompress.errors import AutoCompressError
    from autocompress.stage_config import STAGE_CONFIGS, check_options
    from bench.targets import OPTIONS
    from flows.compress import seeded

    every = {"costmodel": {"workloads": ["interactive-cpu"], "n_probes": 8, "paired": False},
             "validation": {"n": 6, "max_mape": 40, "noise_retry": {"rounds": 1}},
             "importance": {"batch_size": 4, "criterion": "taylor"},
             "search": {"timing_drift": 0.05, "dnas": {"steps": 3}, "selection": {"top_k": 2}},
             "distill": {"lr": 5e-4, "bf16": False},  # tokens: the stage's default
             "verify": {"repeats": 3, "threads": 1}}
    assert set(every) == set(STAGE_CONFIGS)
    for valid in (every, OPTIONS, {}):
        assert check_options(valid) == valid
    assert seeded(every, 3)["distill"] == {"seed": 3, "lr": 5e-4, "bf16": False}
    # A flow started without the CLI (a deployment, a sweep) refuses it before its stages.
    with pytest.raises(AutoCompressError, match="search options: timing_drift"):
        seeded({"search": {"timing_drift": 0.7}}, 0)


def test_a_bad_eval_config_stops_the_flow_before_any_stage(tmp_path, monkeypatch,
                                                           autocompress_home):
    """The suite's sizes are checked when the flow starts, not at its evaluate stage."""
    from autocompress.errors import AutoCompressError
    from autocompress.stage_config import check_eval_config
    from flows.compress import compress

    assert check_eval_config({"num_items": 20}) == {"num_items": 20}
    assert check_eval_config(None) == {}
    monkeypatch.delenv("AUTOCOMPRESS_STORE", raising=False)
    for bad, expected in (({"num_itemz": 20}, "evaluate options: num_itemz: Extra inputs"),
                          ({"num_items": 0}, "evaluate options: num_items"),
                          ([20], "eval_config must be an object")):
        with pytest.raises(AutoCompressError, match=expected):
            compress.fn(budget_fraction=0.5, eval_config=bad, track=False)
    assert not (autocompress_home / "artifacts").exists()
