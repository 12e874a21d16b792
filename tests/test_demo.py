"""`autocompress demo`: the main job sized down, with the baseline one flag away."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autocompress.cli import app
from autocompress.commands import demo as demo_module
from autocompress.commands import pipeline
from autocompress.defaults import DEFAULT_TARGET, DEFAULT_WORKLOAD
from autocompress.stage_config import check_options, stage_settings


def _numbers(settings: dict, prefix: str = ""):
    """(dotted name, value) of every number in nested ``settings``."""
    for key, value in settings.items():
        if isinstance(value, dict):
            yield from _numbers(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def _default(stage: str, dotted: str):
    """The full run's value of a stage setting (``stage_settings`` with no options)."""
    value = stage_settings(stage, None)
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_the_demo_shrinks_stages_with_valid_options_only():
    """Every demo setting is a valid stage option and smaller than the full run's default."""
    options = demo_module.demo_options(DEFAULT_WORKLOAD)
    assert check_options(options) == options
    assert options["costmodel"]["workloads"] == [DEFAULT_WORKLOAD]
    for stage, settings in demo_module.DEMO_OPTIONS.items():
        for dotted, value in _numbers(settings):
            assert value < _default(stage, dotted), f"{stage}.{dotted} is not shrunk"


def test_the_demo_runs_without_the_baseline_and_passes_every_run_parameter(monkeypatch):
    """Through the CLI, as `make demo` calls it: every parameter of `run` arrives as a real
    value (not typer's OptionInfo), the baseline is off unless asked, and the demo then
    says what it skipped and how to run the full version."""
    import inspect

    import typer.models

    seen: list[dict] = []
    parameters = set(inspect.signature(pipeline.run).parameters)
    monkeypatch.setattr(pipeline, "run", lambda **kwargs: seen.append(kwargs))
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    (given,) = seen
    assert set(given) == parameters
    assert not any(isinstance(v, typer.models.OptionInfo) for v in given.values())
    assert given["target"] == [DEFAULT_TARGET] and given["workload"] == DEFAULT_WORKLOAD
    assert given["baseline"] is False and given["budgets"] is None
    assert given["eval_limit"] == demo_module.DEMO_EVAL_LIMIT and given["limits"].is_empty()
    assert json.loads(given["options"]) == demo_module.demo_options(DEFAULT_WORKLOAD)
    assert "Minitron baseline was skipped (add --baseline)" in result.output
    assert "Full version: autocompress run" in result.output

    seen.clear()
    result = CliRunner().invoke(app, ["demo", "--baseline"])
    assert result.exit_code == 0 and seen[0]["baseline"] is True
    assert "baseline was skipped" not in result.output
