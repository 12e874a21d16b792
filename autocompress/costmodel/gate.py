"""Judging a cost model's validation when the machine may be busy.

The validation gate (``tasks.costmodel.validate_costmodel``) refuses a cost
model that mis-ranks measured architectures. On a shared machine, though, the
measurements can move by more than the differences between architectures and a
good model looks bad. ``judge_with_retries`` tells the two apart: a failure
measured while timings were noisy (spread known per metric) or while the
machine was busy is measured again — after a bounded wait for quiet, with more
repeats — before it counts; a failure on steady measurements is final at once.
The bounded wait (``quiet_window``) also serves the search's measured loop
(``arch_search.measured``), which waits for quiet before timing again a pick that
read within noise of its budget.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from autocompress.costmodel.validate import ValidationReport


class NoiseRetry(BaseModel):
    """When a failed gate may be the machine's fault, and how hard to try again."""

    model_config = ConfigDict(extra="forbid")
    max_spread: float = Field(0.08, description="relative IQR above which a timing is noisy")
    rounds: int = Field(2, ge=0, description="extra measuring rounds at most")
    repeats_factor: int = Field(2, ge=1, description="repeats multiply by this each round")
    wait_s: float = Field(120.0, ge=0, description="longest wait for a quiet machine, per round")
    busy_load: float = Field(1.0, description="1-minute load per core that counts as busy")


def machine_load() -> float:
    """Runnable processes per core over the last minute (0 where unknown)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def quiet_window(wait_s: float, busy_load: float, poll_s: float = 5.0,
                 load: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] | None = None) -> tuple[float, float]:
    """Sleep until the load drops to ``busy_load`` per core or under, at most ``wait_s``
    seconds. Returns (seconds waited, load per core at the end). ``load``, ``sleep`` and
    ``clock`` default to the machine's own (tests script them)."""
    load = load or machine_load
    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    started = clock()
    deadline = started + wait_s
    while load() > busy_load and clock() < deadline:
        sleep(min(poll_s, max(0.0, deadline - clock())))
    return clock() - started, load()


def wait_for_quiet(policy: NoiseRetry, log: Callable[[str], None], poll_s: float = 5.0) -> None:
    """Sleep until the load drops under ``busy_load`` per core, at most ``wait_s``."""
    _, load = quiet_window(policy.wait_s, policy.busy_load, poll_s)
    log(f"load is {load:.1f} per core; measuring again")


def judge_with_retries(
    measure: Callable[[int], ValidationReport],
    judge: Callable[[ValidationReport], list[str]],
    repeats: int,
    gated: Sequence[str],
    policy: NoiseRetry | None = None,
    log: Callable[[str], None] = print,
) -> tuple[ValidationReport, list[str]]:
    """``measure(repeats)`` and ``judge`` it; re-measure while it fails on a noisy machine.

    Returns the last report and its failures (empty: passed). A failure with
    steady measurements on a quiet machine is returned at once: the model is bad.
    """
    policy = policy or NoiseRetry()
    report = measure(repeats)
    failures = judge(report)
    for round_ in range(1, policy.rounds + 1):
        noisy = {m: report.spread[m] for m in gated
                 if report.spread.get(m, 0.0) > policy.max_spread}
        load = machine_load()
        if not failures or (not noisy and load <= policy.busy_load):
            break
        repeats *= policy.repeats_factor
        why = ", ".join(f"{m} spread {v:.0%}" for m, v in noisy.items()) or \
            f"load {load:.1f} per core"
        log(f"validation gate failed ({'; '.join(failures)}) on a noisy machine ({why}): "
            f"waiting up to {policy.wait_s:.0f} s for it to calm down, then measuring again "
            f"with {repeats} repeats (round {round_} of {policy.rounds})")
        wait_for_quiet(policy, log)
        report = measure(repeats)
        failures = judge(report)
    return report, failures
