"""Deployment limits: the numbers a compressed model must meet on its target.

One ``Limits`` object is shared by the search (checked against the cost model's
*prediction*) and by ``verify`` (checked against *measurements*). Metric names
are those of ``CostModel.predict`` / ``costmodel predict``: ``ttft_ms``,
``tpot_ms``, ``e2e_ms``, ``throughput_tok_s``, ``memory_gb``.

Every limit is optional; an unset limit is not checked. Latencies and memory are
upper bounds (``max_*``), throughput is a lower bound (``min_*``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autocompress.errors import AutoCompressError, invalid_input

# limit field -> (metric name, direction). "max": value must be <= limit.
LIMIT_METRICS: dict[str, tuple[str, Literal["max", "min"]]] = {
    "max_ttft_ms": ("ttft_ms", "max"),
    "max_tpot_ms": ("tpot_ms", "max"),
    "max_e2e_ms": ("e2e_ms", "max"),
    "min_throughput_tok_s": ("throughput_tok_s", "min"),
    "max_memory_gb": ("memory_gb", "max"),
}

METRICS: tuple[str, ...] = tuple(metric for metric, _ in LIMIT_METRICS.values())
# metric name -> its limit field (the inverse of LIMIT_METRICS).
LIMIT_OF_METRIC: dict[str, str] = {metric: name for name, (metric, _) in LIMIT_METRICS.items()}


class LimitCheck(BaseModel):
    """The outcome of comparing one metric with its limit."""

    metric: str
    direction: Literal["max", "min"]
    limit: float
    value: float
    tolerance: float = 0.0
    # How far inside the limit the value is, as a fraction of the limit
    # (negative = violated). Handy for ranking candidates in the search.
    margin: float
    ok: bool


class Limits(BaseModel):
    """Upper bounds on latency/memory and a lower bound on throughput."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # `inf` is no limit

    max_ttft_ms: float | None = Field(None, gt=0, description="Time to first token, ms.")
    max_tpot_ms: float | None = Field(None, gt=0, description="Time per output token, ms.")
    max_e2e_ms: float | None = Field(None, gt=0, description="End-to-end request latency, ms.")
    min_throughput_tok_s: float | None = Field(
        None, gt=0, description="Generated tokens per second over all concurrent requests."
    )
    max_memory_gb: float | None = Field(None, gt=0, description="Peak memory, GB (1e9 bytes).")

    def is_empty(self) -> bool:
        """True when no limit is set (everything passes)."""
        return all(getattr(self, name) is None for name in LIMIT_METRICS)

    def by_metric(self) -> dict[str, float]:
        """The set limits keyed by metric name, e.g. ``{"tpot_ms": 20.0}``."""
        out = {}
        for name, (metric, _) in LIMIT_METRICS.items():
            value = getattr(self, name)
            if value is not None:
                out[metric] = float(value)
        return out

    def check(
        self,
        values: Mapping[str, float],
        tolerance: Mapping[str, float] | None = None,
    ) -> list[LimitCheck]:
        """Compare ``values`` (metric name -> number) with every set limit.

        ``tolerance`` (metric -> absolute amount, same unit) widens each limit:
        a measured value passes when it is within the limit plus its
        measurement noise. Pass nothing for an exact check of a prediction.
        """
        tolerance = tolerance or {}
        checks = []
        for name, (metric, direction) in LIMIT_METRICS.items():
            limit = getattr(self, name)
            if limit is None:
                continue
            if metric not in values or values[metric] is None:
                raise AutoCompressError(
                    f"limit {name} is set but no {metric} value was given",
                    hint=f"provide {metric} or drop the {name} limit",
                )
            value = float(values[metric])
            tol = max(0.0, float(tolerance.get(metric, 0.0)))
            if direction == "max":
                ok = value <= limit + tol
                margin = (limit - value) / limit
            else:
                ok = value >= limit - tol
                margin = (value - limit) / limit
            checks.append(
                LimitCheck(
                    metric=metric, direction=direction, limit=float(limit), value=value,
                    tolerance=tol, margin=margin, ok=ok,
                )
            )
        return checks

    def describe(self) -> str:
        """Short human text, e.g. ``tpot_ms <= 20, memory_gb <= 8``."""
        if self.is_empty():
            return "no limits"
        parts = []
        for name, (metric, direction) in LIMIT_METRICS.items():
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{metric} {'<=' if direction == 'max' else '>='} {value:g}")
        return ", ".join(parts)


def limits_from_options(file: str | Path | None = None, **options: float | None) -> Limits:
    """Limits from an optional JSON file, overridden by the options that are set.

    Every problem (unreadable file, unknown field, a limit that is not a
    positive number) is a usage error naming the field and the value.
    """
    base: dict = {}
    if file is not None:
        try:
            base = json.loads(Path(file).read_text())
        except (OSError, ValueError) as err:
            raise AutoCompressError(f"cannot read the limits file {file}: {err}",
                                    hint=_LIMITS_HINT) from None
        if not isinstance(base, dict):
            raise AutoCompressError(f"the limits file {file} does not hold a JSON object",
                                    hint=_LIMITS_HINT)
    try:
        return Limits(**{**base, **{k: v for k, v in options.items() if v is not None}})
    except ValidationError as err:
        raise invalid_input(err, "limits", _LIMITS_HINT) from None


_LIMITS_HINT = ("limits are positive numbers, e.g. --limit tpot=5 or a file "
                '{"max_tpot_ms": 5, "max_memory_gb": 0.5}; fields: ' + ", ".join(LIMIT_METRICS))


# Teacher readings further apart than this are two hosts: one absolute limit is then two
# budgets (hosts of one name here read the same teacher 2.7-5.3 ms, docs/results-history.md).
HOST_DRIFT = 0.10
HOST_REFUSAL = "the same limit is another budget on this host"  # check_same_host's words
HOST_REFUSAL_HINT = ("run at the budget fraction on this host and re-time the earlier file's "
                     "architectures under its limits (`autocompress bench retime`), or accept "
                     "the drift (`bench compare --allow-host-drift`)")


def host_drift(a: float, b: float, tolerance: float = HOST_DRIFT) -> bool:
    """Whether two readings of one model are further apart than ``tolerance`` (relative)."""
    return max(a, b) > min(a, b) * (1 + tolerance)


def check_same_host(limits: Limits, teacher_here: Mapping[str, float],
                    teacher_there: Mapping[str, float], where: str = "another run",
                    tolerance: float = HOST_DRIFT) -> None:
    """Refuse ``limits`` carried from ``where`` when the teacher read any limited metric more
    than ``tolerance`` away there: the same absolute limit is another fraction of the
    teacher, another budget, on this host, so the methods paired under it would not be
    compared at one budget."""
    for metric in limits.by_metric():
        there, here = teacher_there.get(metric), teacher_here.get(metric)
        if there and here and host_drift(there, here, tolerance):
            raise AutoCompressError(
                f"the limits from {where} were set where the teacher read {metric} "
                f"{there:.3g}; here it reads {here:.3g} ({here / there - 1:+.0%}), so "
                + HOST_REFUSAL,
                hint=HOST_REFUSAL_HINT)
