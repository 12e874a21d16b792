"""One stage's settings as its typed config, and the option models of the stages whose
library call takes plain arguments (the cost-model fit, its validation, verify).

``stage_config`` is the one place a stage's ``options`` dict becomes its config: each
stage of the flows calls it, and ``autocompress.stage_options.check_options`` calls it
for every stage before a flow starts, so both report a bad setting the same way.

This module stays light on purpose: a stage's cache key hashes the code it imports
(``tasks.code_key``), so the map of every stage's config (which imports the search,
distillation and importance code) lives in ``stage_options``, not here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autocompress.costmodel.gate import NoiseRetry
from autocompress.errors import invalid_input
from autocompress.stage_sizes import with_defaults

Config = TypeVar("Config", bound=BaseModel)


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
