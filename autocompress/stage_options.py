"""The flows' per-stage options (``--options``), checked before any stage runs.

``{"search": {"timing_drift": 0.2}, "distill": {"tokens": 50000}}`` maps a stage to its
settings. A stage reads them only when the flow reaches it, minutes in; so every entry
that takes options (``autocompress run``, ``bench compare``, ``bench/targets.py`` and
the flows themselves) calls ``check_options`` first: an unknown stage, an unknown key or
a bad value stops the run in one line, through the same ``stage_config`` each stage uses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from autocompress.arch_search.config import SearchConfig
from autocompress.distill import DEFAULT_TOKENS, DistillConfig
from autocompress.errors import AutoCompressError
from autocompress.evaluation.suite import EvalConfig
from autocompress.importance import CalibrationConfig
from autocompress.stage_config import FitOptions, ValidationOptions, VerifyOptions, stage_config

# The stages that take options, and the config each turns them into.
STAGE_CONFIGS: dict[str, type[BaseModel]] = {
    "costmodel": FitOptions,
    "validation": ValidationOptions,
    "importance": CalibrationConfig,
    "search": SearchConfig,
    "distill": DistillConfig,
    "verify": VerifyOptions,
}
# Settings a config requires that its stage fills in when the options leave them out.
STAGE_DEFAULTS: dict[str, dict[str, Any]] = {"distill": {"tokens": DEFAULT_TOKENS}}
EXAMPLE = '\'{"costmodel": {"n_probes": 8}, "search": {"timing_drift": 0.05}}\''


def check_options(options: Any) -> dict[str, dict[str, Any]]:
    """``{stage: settings}`` checked against every stage's config; a copy of it."""
    if not options:
        return {}
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise AutoCompressError("options must map stage names to objects", f"e.g. {EXAMPLE}")
    unknown = sorted(set(options) - set(STAGE_CONFIGS))
    if unknown:
        raise AutoCompressError(f"no stage {', '.join(map(repr, unknown))} takes options",
                                f"the stages that do: {', '.join(STAGE_CONFIGS)}")
    for stage, settings in options.items():
        stage_config(stage, STAGE_CONFIGS[stage], settings, STAGE_DEFAULTS.get(stage))
    return {stage: dict(settings) for stage, settings in options.items()}


def parse_options(text: str | None) -> dict[str, dict[str, Any]]:
    """``--options``: inline JSON or ``@path`` to a JSON file, checked."""
    if not text:
        return {}
    try:
        data = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as err:
        raise AutoCompressError(f"cannot read --options: {err}",
                                f"pass JSON like {EXAMPLE} or @file.json") from None
    return check_options(data)


def check_eval_config(config: Any) -> dict[str, Any]:
    """The flows' ``eval_config`` (the benchmark suite's sizes) checked as the evaluate
    stage will read it; a copy of it."""
    if config is not None and not isinstance(config, dict):
        raise AutoCompressError("eval_config must be an object of the suite's settings",
                                f"it takes {', '.join(EvalConfig.model_fields)}")
    stage_config("evaluate", EvalConfig, config)
    return dict(config or {})
