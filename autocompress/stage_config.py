"""Each stage's settings: its typed config, its defaults and how ``options`` become it.

``{"search": {"timing_drift": 0.2}, "distill": {"tokens": 50000}}`` maps a stage to its
settings (``--options``, the flows' ``options``). ``stage_settings`` is the one place a
stage's settings become its config, over the stage's defaults: those that follow the
teacher's size (``stage_sizes``) and those a config needs filled in (the distillation
budget). The flows' stages and ``autocompress.compress`` both call it, so a run in
process and a flow run use the same settings.

A stage reads its settings only when the flow reaches it, minutes in; so every entry that
takes options (``autocompress run``, ``bench compare``, the flows) calls ``check_options``
first: an unknown stage, an unknown key or a bad value stops the run in one line, reported
as the stage itself would report it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autocompress.arch_search.config import SearchConfig
from autocompress.costmodel.gate import NoiseRetry
from autocompress.distill import DEFAULT_TOKENS, DistillConfig
from autocompress.errors import AutoCompressError, invalid_input
from autocompress.evaluation.suite import EvalConfig
from autocompress.importance import CalibrationConfig
from autocompress.stage_sizes import (
    distill_sizes,
    eval_sizes,
    importance_sizes,
    search_sizes,
    with_defaults,
)

Config = TypeVar("Config", bound=BaseModel)
EXAMPLE = '\'{"costmodel": {"n_probes": 8}, "search": {"timing_drift": 0.05}}\''


class FitOptions(BaseModel):
    """Arguments of ``costmodel.fit.fit_cost_model`` the flow exposes."""

    model_config = ConfigDict(extra="forbid")

    workloads: list[str] | None = Field(None, description="default: the run's workload (a "
                                        "flow that names none: the CPU presets)")
    n_probes: int = 20
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    paired: bool = Field(True, description="time probes in lockstep with the teacher's "
                         "architecture (see autocompress.costmodel.measure)")


class ValidationOptions(BaseModel):
    """Arguments of ``validate_cost_model`` plus the gate the flow enforces."""

    model_config = ConfigDict(extra="forbid")

    workloads: list[str] | None = Field(None, description="default: the flow's workload")
    n: int = 12
    repeats: int = 3
    warmup: int = 1
    seed: int = 1000
    # The gate: the search trusts the cost model only if it ranks architectures
    # like the hardware does and is not grossly off. None disables a check.
    max_mape: float | None = Field(30.0, description="% on the workload's primary metrics")
    min_kendall_tau: float | None = 0.5
    gated_metrics: list[str] = ["tpot", "ttft"]
    noise_retry: NoiseRetry = Field(default_factory=NoiseRetry,
                                    description="re-measure a failure on a busy machine")


class VerifyOptions(BaseModel):
    """Arguments of ``verify.verify`` the flow exposes (more repeats than its default:
    the flow's verdict decides whether the model is registered)."""

    model_config = ConfigDict(extra="forbid")

    repeats: int = Field(9, ge=1)
    warmup: int = Field(1, ge=0)
    threads: int | None = Field(None, ge=1, description="default: the cost model's count")
    seed: int = 0
    sessions: int = Field(3, ge=1, description="timing sessions pooled (median of each "
                          "metric): one session on a shared host can read 5-18% off")


# The stages that take options, and the config each turns them into.
STAGE_CONFIGS: dict[str, type[BaseModel]] = {
    "costmodel": FitOptions,
    "validation": ValidationOptions,
    "importance": CalibrationConfig,
    "search": SearchConfig,
    "distill": DistillConfig,
    "verify": VerifyOptions,
}
# The benchmark suite's sizes come as the flows' ``eval_config``, not as options.
EVAL_STAGE = "evaluate"


def _distill_defaults(teacher_params: float | None) -> dict[str, Any]:
    # DistillConfig requires a token budget; the stage fills in the recipe's.
    return {"tokens": DEFAULT_TOKENS, **distill_sizes(teacher_params)}


# The defaults of a stage beyond its config's own: they follow the teacher's size.
TEACHER_SIZE_DEFAULTS: dict[str, Callable[[float | None], dict[str, Any]]] = {
    "importance": importance_sizes,
    "search": search_sizes,
    "distill": _distill_defaults,
    EVAL_STAGE: eval_sizes,
}


def stage_settings(stage: str, options: dict[str, Any] | None,
                   teacher_params: float | None = None) -> Any:
    """``options`` of ``stage`` over its defaults for a teacher of ``teacher_params``
    parameters (None: the reference sizes), as the stage's config."""
    config = EvalConfig if stage == EVAL_STAGE else STAGE_CONFIGS[stage]
    defaults = TEACHER_SIZE_DEFAULTS.get(stage, lambda _params: {})(teacher_params)
    return stage_config(stage, config, options, defaults)


def stage_config(stage: str, config: type[Config], options: dict[str, Any] | None,
                 defaults: dict[str, Any] | None = None) -> Config:
    """``options`` of ``stage`` over ``defaults`` as a ``config``; a bad setting is an
    ``AutoCompressError`` naming the stage and the field."""
    try:
        return config.model_validate(with_defaults(options, defaults or {}))
    except ValidationError as err:
        raise invalid_input(err, f"{stage} options", _hint(stage, config, err)) from None


def _hint(stage: str, config: type[BaseModel], err: ValidationError) -> str:
    """What to do about the first problem: the names a misspelt key may take, else the field."""
    loc = [str(part) for part in err.errors()[0]["loc"]]
    model = config
    for part in loc[:-1]:  # the (nested) model the last key belongs to
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    path = ".".join([stage, *loc])
    if err.errors()[0]["type"] == "extra_forbidden":
        return f"{path.rsplit('.', 1)[0]} takes {', '.join(model.model_fields)}"
    return f"correct {path} in the options, or leave it out for its default"


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
        stage_settings(stage, settings)
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
    stage_config(EVAL_STAGE, EvalConfig, config)
    return dict(config or {})
