"""Closing the loop on the target: measure the chosen architecture, correct its budgets.

The search trusts the cost model, and an optimiser finds the places where a model
is optimistic. So before an architecture leaves the search it is built with
random weights and timed on the target with the verification harness (speed does
not depend on weight values). Where a timing misses its budget, that budget is
scaled by the model's error on *this* architecture (predicted / measured, less a
small margin) and the architecture is picked again.

The check is the strict side of a guard band: a pick passes only if its
measurement *plus* the measurement's noise is within budget, while ``verify``
fails a model only if it is over *beyond* the noise; a pick that merely measured
under budget once would fail verify about as often as not. Timing is paired with
the cost model's reference (``costmodel.measure``) to keep that noise small on a
shared CPU. Pairing does not remove the drift *between* sessions: the same
architecture timed during a search and again in ``verify`` differed by up to 5% on this
project's 2-core machines (results/compare.json: search-time vs verify TPOT of every
pick, −2% to +5%), well beyond one session's noise (about 1%). So every timing the
search acts on carries a ``drift`` allowance on top of its noise (``with_drift``), and a
pick is timed a second time after it was chosen (``SpecTimer.confirm``: the first of
several near-limit candidates to meet a budget is likely one that read low; where that
second timing misses, a third decides). The Minitron baseline gets the same allowance and
the same confirmation of its pick, so the two stay matched. Targets this machine cannot
time (GPU spec sheets) skip the loop. Why the loop exists: lab/measurement-history.md.

On a busy machine (other jobs on the cores) the loop must not chase the load. Paired
timing acts on the ratio of each architecture to the reference, times the reference's
quiet time, so the load mostly cancels; what it leaves shows as a wider noise. A reading
therefore gets one of three verdicts (``verdict``): *met* (within budget, noise and drift
included: the strict side above), *missed* (over budget by more than its session's noise:
the cost model is optimistic here, so the loop re-aims), or *within noise* (neither: the
reading cannot tell). A reading within noise is taken again, after a bounded wait for a
quiet window where the machine is busy (``SpecTimer.recheck``); if it still cannot tell,
the pick is kept on the cost model's prediction and the loop says so. A re-aim never
budgets for more noise than a quiet session shows (``BusyMachine.busy_noise``), so a
noisy session does not aim lower. ``SpecTimer.summary`` is the search report's record of
the load, the noise and what was done (one warning line where the machine was busy).

Pairing cancels the load only in part: beside one process spinning on one of 2 cores, the
paired reading of an architecture came out 6-10% under its quiet one (a bias, not noise),
and each timing took three times as long. So where other processes keep more than half a
core busy beyond those the timing leaves free (``BusyMachine.busy_cores``, read just
before each timing), the timer waits a bounded while for them to leave and otherwise does
not time: the reading is then the cost model's prediction plus its error on its fit's
probes and the drift allowance (``untimed``), which the loop judges like any other. So a
pick aims under each budget by that much, and nothing is re-aimed by a timing the load
made; ``verify`` measures the result later.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch import ArchSpec
from autocompress.costmodel.gate import machine_load, quiet_window
from autocompress.progress import Bar

TIMING_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
# Memory is judged as measured where a reading measured it: llama.cpp reports its buffers
# exactly (no noise, no drift); the hf-eager readings here skip memory (tracing every
# allocation of each candidate costs more than the cost model's error on it), so a memory
# budget there stays the cost model's.
MEMORY = "memory_gb"
# Aim this far under a budget the architecture missed: the measurement is noisy.
MARGIN = 0.02
# The verdicts of a reading against its budgets (``verdict``).
MET, WITHIN_NOISE, MISSED = "met", "within noise", "missed"


Reading = tuple[dict[str, float], dict[str, float]]  # (metrics, noise of each metric)


class BusyMachine(BaseModel):
    """How the measured loop times architectures on a machine that other jobs share."""

    model_config = ConfigDict(extra="forbid")
    busy_load: float = Field(
        1.25, ge=0, description="1-minute load average per core above which the machine "
        "counts as busy (the search's own threads make about 1.0 on their cores)")
    busy_cores: float | None = Field(
        0.5, ge=0, description="Cores that other processes at normal priority keep busy "
        "beyond those a timing leaves free (read over half a second before each timing) "
        "above which the target is not timed after the wait below: the cost model's "
        "prediction plus its error stands instead. None: always time.")
    busy_noise: float = Field(
        0.03, ge=0, description="Relative noise of a timing (its session's, the drift "
        "allowance apart) above which the session counts as noisy; paired timing on quiet "
        "cores shows about 1%. A re-aim budgets for no more noise than this.")
    wait_s: float = Field(
        20.0, ge=0, description="Longest wait, all told in one search, for a quiet window: "
        "for other processes to leave the cores before a timing, or before timing again a "
        "pick that read within noise of a budget.")
    poll_s: float = Field(5.0, gt=0, description="How often the load is read while waiting.")


class MeasuredRound(BaseModel):
    """One architecture timed on the target, against the budgets of the limits."""

    params: int
    predicted: dict[str, float]
    measured: dict[str, float]
    noise: dict[str, float] = {}
    budgets: dict[str, float]
    met: bool
    aim: dict[str, float] = {}  # the bounds the pick aimed at (budgets less margins, re-aims)
    stage: str = "pick"  # "aim": a cheap pick timed to calibrate the aim (``calibrate_aim``)
    verdict: str = ""  # MET, MISSED or WITHIN_NOISE (``verdict``; empty: not judged so)
    why: str = ""  # the reading against its budget, in words (what the progress line says)
    timed: bool = True  # False: the machine was too busy, ``measured`` is ``untimed``'s


def measure_spec(spec: ArchSpec, base_config: Any, cost_model, workload,
                 repeats: int = 9, drift: float = 0.0) -> tuple[dict[str, float], dict[str, float]]:
    """Time ``spec`` (random weights) on the cost model's target, as the model was fitted
    (same thread count and timing statistic). Returns (metrics, noise of each metric), the
    noise widened by ``drift`` (see ``with_drift``)."""
    from autocompress.costmodel.timing_lock import timing_lock

    with timing_lock():  # no other run's timing on this machine meanwhile, when asked
        metrics, noise = _measure_spec(spec, base_config, cost_model, workload, repeats)
    return metrics, with_drift(metrics, noise, drift)


def with_drift(measured: dict[str, float], noise: dict[str, float],
               drift: float) -> dict[str, float]:
    """``noise`` plus ``drift`` × the measurement, for every timing metric: how far a later
    session (``verify``) may find it from this one."""
    return {m: n + drift * measured[m] if m in TIMING_METRICS else n
            for m, n in noise.items()}


def measures_memory(cost_model) -> bool:
    """Whether a reading on this cost model's target measures memory: llama.cpp's (the
    engine reports its buffers) and vLLM's (its weights and KV blocks) do, hf-eager's do
    not (see ``MEMORY``)."""
    return cost_model.target.engine.name in ("llama.cpp", "vllm")


def _measure_spec(spec: ArchSpec, base_config: Any, cost_model, workload, repeats: int):
    from autocompress.costmodel.measure import fitted_statistic, measure_as_fitted
    from autocompress.modeling import build_model
    from autocompress.verify import measurement_device, measurement_noise

    model = build_model(spec, base_config, seed=0).eval()
    if cost_model.target.engine.name == "llama.cpp":  # timed in the engine, as a GGUF
        import tempfile
        from pathlib import Path

        from autocompress.costmodel.measure_llamacpp import (
            measure_gguf_as_fitted,
            write_timing_gguf,
        )

        with tempfile.TemporaryDirectory(prefix="ac-search-") as tmp:
            path = write_timing_gguf(model, Path(tmp), "candidate", cost_model.target.dtype)
            measurement, statistic = measure_gguf_as_fitted(path, workload, cost_model,
                                                            repeats=repeats)
        return measurement.metrics(statistic), measurement_noise(measurement)
    if cost_model.target.engine.name == "vllm":  # served by vLLM, as verify will
        from autocompress.costmodel.measure_vllm import measure_models_vllm

        measurement = measure_models_vllm([model], [workload], cost_model.target.dtype,
                                          repeats=repeats, progress=False)[0][0]
        return measurement.metrics(fitted_statistic(cost_model)), measurement_noise(measurement)
    model.to(measurement_device(cost_model.target))
    measurement, statistic = measure_as_fitted(model, workload, cost_model, repeats=repeats,
                                               memory=False)
    noise = measurement_noise(measurement)
    if measurement.paired is not None:  # how far the load moved the absolute timings
        noise[REFERENCE_SPREAD] = measurement.paired.reference_tpot_ms.spread
    metrics = measurement.metrics(statistic)
    del metrics[MEMORY]  # not measured (memory=False): the cost model's stands
    return metrics, noise


# A key of a reading's noise (paired timing only): the relative spread (IQR / median) of the
# reference's decode steps in that session, i.e. how much the machine's load moved absolute
# timings; the ratios the search acts on are steadier (their noise is the metric's own).
REFERENCE_SPREAD = "reference_spread"
# A key of a reading's noise: set (to 1.0) where the architecture was not timed (``untimed``).
UNTIMED = "untimed"


def untimed(predicted: dict[str, float], error: dict[str, float]) -> Reading:
    """The reading of an architecture the machine was too busy to time: the cost model's
    ``predicted`` timings, with ``error`` (relative, per metric: ``untimed_error``) as the
    noise, so the strict side holds a pick to prediction plus error."""
    metrics = {m: float(predicted[m]) for m in TIMING_METRICS}
    noise = {m: error.get(m, 0.0) * v for m, v in metrics.items()}
    return metrics, {**noise, UNTIMED: 1.0}


def timing_threads(cost_model) -> int:
    """The threads a timing on this cost model's target runs on: llama.cpp's own count,
    else the count the model was fitted with (``measure_as_fitted``), else torch's."""
    if cost_model.target.engine.name == "llama.cpp":
        return cost_model.target.threads
    fit = getattr(cost_model, "fit", None)
    if fit is not None:
        return fit.threads
    import torch  # lazy: this module's other users time nothing

    return torch.get_num_threads()


def untimed_error(cost_model, drift: float) -> dict[str, float]:
    """The relative uncertainty of a prediction standing in for a timing, per timing metric:
    the cost model's error on its fit's probes (end-to-end latency takes the larger of its
    two parts'; none where it was not fitted here) plus the ``drift`` allowance a timing
    carries, since ``verify``'s session may read slower than the fit's as it may a search's."""
    fit = getattr(cost_model, "fit", None)
    mape = fit.train_mape if fit is not None else {}
    error = {m: mape.get(m, 0.0) / 100 for m in ("ttft_ms", "tpot_ms")}
    error["e2e_ms"] = max(error.values())
    return {m: e + drift for m, e in error.items()}


def is_untimed(noise: dict[str, float]) -> bool:
    return bool(noise.get(UNTIMED))


def judged(budgets: dict[str, float], measured: dict[str, float]) -> list[str]:
    """The budgets a reading can judge: every timing budget, and memory where the reading
    measured it (``MEMORY``)."""
    return [m for m in budgets if m in TIMING_METRICS or (m == MEMORY and m in measured)]


def judged_on(budgets: dict[str, float], cost_model) -> list[str]:
    """The budgets a reading on this cost model's target will judge (before any reading)."""
    return judged(budgets, {MEMORY: 0.0} if measures_memory(cost_model) else {})


def missed_budgets(budgets: dict[str, float], measured: dict[str, float],
                   noise: dict[str, float] | None = None) -> list[str]:
    """The budgets ``measured`` misses, its noise included (the strict side)."""
    noise = noise or {}
    return [m for m in judged(budgets, measured)
            if measured[m] + noise.get(m, 0.0) > budgets[m]]


def session_noise(measured: dict[str, float], noise: dict[str, float],
                  drift: float = 0.0) -> dict[str, float]:
    """The noise of each timing metric in its own session: ``noise`` less the ``drift``
    allowance that ``with_drift`` added."""
    return {m: max(0.0, noise[m] - drift * measured[m]) for m in TIMING_METRICS
            if m in noise and m in measured}


def verdict(budgets: dict[str, float], measured: dict[str, float],
            noise: dict[str, float] | None = None, drift: float = 0.0) -> str:
    """``MET`` where every timing budget holds on the strict side (measurement, noise and
    drift allowance within it); ``MISSED`` where a budget is over, drift allowed for, by
    more than the session's noise (the only case worth a re-aim); else ``WITHIN_NOISE``:
    the reading cannot tell this architecture from one at the budget."""
    noise = noise or {}
    if not missed_budgets(budgets, measured, noise):
        return MET
    if is_untimed(noise):  # no timing to be within the noise of: the prediction decides
        return MISSED
    own = session_noise(measured, noise, drift)
    over = [m for m in judged(budgets, measured)
            if _with_allowance(measured, m, drift) - budgets[m] > own.get(m, 0.0)]
    return MISSED if over else WITHIN_NOISE


def _with_allowance(measured: dict[str, float], metric: str, drift: float) -> float:
    """A reading with the drift allowed for: timings drift between sessions, memory not."""
    return measured[metric] * (1 + drift if metric in TIMING_METRICS else 1)


def round_values(predicted: dict[str, float], measured: dict[str, float],
                 noise: dict[str, float]) -> dict[str, dict[str, float]]:
    """A round's predicted, measured and noise figures: the timings, and memory where the
    reading measured it."""
    metrics = [*TIMING_METRICS, *([MEMORY] if MEMORY in measured else [])]
    return {"predicted": {m: float(predicted[m]) for m in metrics},
            "measured": {m: float(measured[m]) for m in metrics},
            "noise": {m: float(noise.get(m, 0.0)) for m in metrics}}


def aim_noise(measured: dict[str, float], noise: dict[str, float], drift: float,
              busy: BusyMachine) -> dict[str, float]:
    """The noise a re-aim budgets for: the drift allowance plus the session's noise, the
    latter at most what a quiet session shows (``busy.busy_noise``), so that a noisy
    session does not aim at a smaller model than a quiet one would."""
    own = session_noise(measured, noise, drift)
    return {m: drift * measured[m] + min(n, busy.busy_noise * measured[m])
            for m, n in own.items()}


class SpecTimer:
    """``measure(spec)`` once per architecture: the final pick times its short list and the
    closed loop then re-uses the winner's timing instead of taking it again.

    ``confirm(spec, meets)`` times an architecture a second time, once. Why: among several
    candidates near a budget, the one whose timing met it is likely one that read low (a
    winner's curse). A timing taken *after* the choice carries no such bias, so a pick
    must meet its budgets there too, and that reading stands for the architecture from
    then on (the closed loop and the reports read it). Where the second timing misses,
    a third decides, and the median of the three stands: timing sessions on a shared host
    spread by ±5% (lab/measurement-history.md), so an architecture at the limit misses in
    one of two timings about as often as not, and one such miss sends the search's whole
    short list back to be re-aimed lower. (It does not remove a systematic offset: the
    search's picks at interactive-cpu @ 60% still read 6-7% over ``verify`` in every
    seed with it.)

    ``recheck(spec, meets)`` is ``confirm`` for a reading within noise of a budget, after a
    bounded wait for a quiet window where the machine is busy. Every timing records the
    machine's load and the reading's noise; ``summary`` reports them.

    Given ``others`` (the cores other processes keep busy in the timing's way, None where
    unknown: ``hardware.cores_in_the_way``) and ``fallback`` (an architecture's ``untimed``
    reading), an architecture is not timed while others keep more than ``busy.busy_cores``
    busy after a bounded wait: its reading is the fallback, kept only until the machine is
    quiet enough to time it."""

    def __init__(self, measure: Callable[[ArchSpec], Reading], drift: float = 0.0,
                 busy: BusyMachine | None = None, load: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] | None = None,
                 others: Callable[[], float | None] | None = None,
                 fallback: Callable[[ArchSpec], Reading] | None = None):
        self._measure = measure
        self.drift = drift  # the allowance ``measure`` adds to its noise (``with_drift``)
        self.busy = busy or BusyMachine()
        # The machine's load per core, and the wait's sleep and clock (tests script them).
        self._load = load or machine_load
        self._sleep, self._clock = sleep, clock
        self._others, self._fallback = others, fallback
        self.untimed = 0  # readings the machine was too busy to take
        self.others_seen = 0.0  # the most cores others took in a due timing's way
        self._memo: dict[str, Reading] = {}
        self._readings: dict[str, list[Reading]] = {}  # every timing of a confirmed one
        self.seconds = 0.0  # spent timing on the target
        self.timings = 0
        self.conditions: list[dict[str, Any]] = []  # each timing: the load and the noise
        self.waited_s = 0.0  # spent waiting for a quiet window (at most busy.wait_s)
        self.actions: list[str] = []  # what was done about a busy machine, in order
        self.warned: str | None = None  # the warning printed, once

    def __call__(self, spec: ArchSpec) -> Reading:
        key = spec.to_json(indent=None)
        if key not in self._memo or is_untimed(self._memo[key][1]):
            self._memo[key] = self._timed(spec)
        return self._memo[key]

    def confirm(self, spec: ArchSpec,
                meets: Callable[[dict[str, float], dict[str, float]], bool] | None = None
                ) -> Reading:
        """The reading of ``spec`` that stands after a second, independent timing (taken
        once): the second's, or, where ``meets(metrics, noise)`` says it missed, the median
        of three (a third timing, also taken once)."""
        key = spec.to_json(indent=None)
        first = self(spec)
        if is_untimed(first[1]):  # nothing timed to confirm
            return first
        readings = self._readings.setdefault(key, [first])
        if len(readings) == 1:
            readings.append(self._timed(spec))
        if len(readings) == 2 and meets is not None and not meets(*readings[1]):
            readings.append(self._timed(spec))
        from autocompress.verify import median_reading

        self._memo[key] = readings[1] if len(readings) == 2 else median_reading(readings)
        return self._memo[key]

    def recheck(self, spec: ArchSpec,
                meets: Callable[[dict[str, float], dict[str, float]], bool]) -> Reading:
        """The reading of ``spec`` that stands after taking a reading within noise again:
        where the machine is busy, first a wait for a quiet window (bounded by what is left
        of ``busy.wait_s``), then ``confirm``. An architecture already timed again keeps
        the reading that stands (no architecture is timed more than three times)."""
        if len(self._readings.get(spec.to_json(indent=None), [])) >= 2:
            return self(spec)
        left = self.busy.wait_s - self.waited_s
        if self._load() > self.busy.busy_load and left > 0:
            waited, load = quiet_window(left, self.busy.busy_load, self.busy.poll_s,
                                        self._load, self._sleep, self._clock)
            self.waited_s += waited
            self.actions.append(f"waited {waited:.0f} s for a quiet window (load then "
                                f"{load:.1f} per core)")
        self.actions.append("timed a reading within noise of a budget again")
        return self.confirm(spec, meets)

    def _timed(self, spec: ArchSpec) -> Reading:
        if self._too_busy():
            self.untimed += 1
            return self._fallback(spec)
        started = time.perf_counter()
        load = self._load()
        try:
            reading = self._measure(spec)
        finally:
            self.seconds += time.perf_counter() - started
            self.timings += 1
        self._record(max(load, self._load()), *reading)
        return reading

    def _too_busy(self) -> bool:
        """Whether other processes keep more than ``busy.busy_cores`` busy, after waiting for
        them to leave (bounded by what is left of ``busy.wait_s``); says what it did."""
        if self._others is None or self._fallback is None or self.busy.busy_cores is None:
            return False
        taken = self._others()
        if taken is None or taken <= self.busy.busy_cores:
            return False
        self.others_seen = max(self.others_seen, taken)
        left = self.busy.wait_s - self.waited_s
        if left > 0:
            def others() -> float:
                seen = self._others()
                return float("inf") if seen is None else seen

            waited, taken = quiet_window(left, self.busy.busy_cores, self.busy.poll_s,
                                         others, self._sleep, self._clock)
            self.waited_s += waited
            quiet = taken <= self.busy.busy_cores
            self.actions.append(f"waited {waited:.0f} s for other processes to leave the "
                                f"cores ({'they did' if quiet else 'they did not'})")
            if quiet:
                return False
        self.actions.append(f"other processes took {self.others_seen:.1f} of the cores the "
                            "timing needs: not timed, the cost model's prediction plus its "
                            "error stands")
        return True

    def _record(self, load: float, measured: dict[str, float],
                noise: dict[str, float]) -> None:
        """Keep the machine's conditions during one timing: its load, each timing metric's
        relative noise in this session, and how far the load moved absolute timings."""
        own = session_noise(measured, noise, self.drift)
        self.conditions.append({
            "load_per_core": round(load, 3),
            "noise": {m: round(n / measured[m], 5) for m, n in own.items() if measured[m]},
            REFERENCE_SPREAD: noise.get(REFERENCE_SPREAD)})

    def summary(self, metrics: list[str] | tuple[str, ...] = TIMING_METRICS) -> dict[str, Any]:
        """What the timings met on this machine, for the search's report: the highest load,
        the noise of ``metrics`` (the budgets' timings), the wait, what was done, and a
        one-line ``warning`` where the machine was busy (else None)."""
        cores = os.cpu_count() or 1
        load = max((c["load_per_core"] for c in self.conditions), default=self._load())
        noise = {m: max((c["noise"].get(m, 0.0) for c in self.conditions), default=0.0)
                 for m in metrics if m in TIMING_METRICS}
        spreads = [c[REFERENCE_SPREAD] for c in self.conditions
                   if c[REFERENCE_SPREAD] is not None]
        busy = load > self.busy.busy_load or self.untimed > 0 or any(
            n > self.busy.busy_noise for n in noise.values())
        out = {"busy": busy, "timings": self.timings, "untimed": self.untimed,
               "cores_in_the_way": round(self.others_seen, 2),
               "load_per_core": round(load, 3),
               "load_average": round(load * cores, 2), "cores": cores, "noise": noise,
               "reference_spread": max(spreads, default=None), "waited_s": self.waited_s,
               "actions": list(self.actions), "conditions": self.conditions}
        out["warning"] = _busy_warning(out) if busy else None
        return out

    def warn(self, metrics: list[str] | tuple[str, ...] = TIMING_METRICS) -> str | None:
        """Print the busy machine's warning line once per timer (a later one differs only in
        its figures: a log that repeats it is noise); return it (None: quiet)."""
        warning = self.summary(metrics)["warning"]
        if warning and self.warned is None and not os.environ.get("AUTOCOMPRESS_QUIET"):
            print(f"warning: {warning}", flush=True)
        self.warned = self.warned or warning
        return warning


def _busy_warning(summary: dict[str, Any]) -> str:
    """The one line that says the machine was too busy to time quietly, and what was done."""
    noise = ", ".join(f"{m.split('_')[0]} ±{n:.1%}" for m, n in summary["noise"].items()
                      if summary["timings"])
    spread = summary["reference_spread"]
    how = ("timed paired: acted on each ratio to the reference times the reference's quiet "
           f"time (absolute timings spread {spread:.0%})" if spread is not None
           else "timed unpaired" if summary["timings"] else None)
    untimed = (f"{summary['untimed']} reading(s) not timed: check the result with "
               "`autocompress verify` on a quiet machine" if summary["untimed"] else None)
    done = "; ".join(dict.fromkeys(a for a in [how, *summary["actions"], untimed] if a))
    return (f"machine busy while timing on the target: load average "
            f"{summary['load_average']:.1f} on {summary['cores']} cores"
            f"{f', noise {noise}' if noise else ''}; {done}")


def corrected_budgets(inner: dict[str, float], budgets: dict[str, float],
                      predicted: dict[str, float], measured: dict[str, float],
                      noise: dict[str, float] | None = None) -> dict[str, float] | None:
    """None when every timing budget is met as measured (``measured + noise ≤ budget``);
    else tightened ``inner`` budgets.

    A missed budget ``B`` with prediction ``p`` and measurement ``m`` becomes
    ``B · p / m · (1 − MARGIN)``: the budget the cost model must aim at for the
    measurement to land under ``B`` if its error on similar architectures is the same.
    """
    missed = missed_budgets(budgets, measured, noise)
    if not missed:
        return None
    noise = noise or {}
    tightened = dict(inner)
    for metric in missed:
        # Aim so that the measurement, noise included, lands under the budget.
        high = measured[metric] + noise.get(metric, 0.0)
        aim = budgets[metric] * predicted[metric] / high * (1 - MARGIN)
        tightened[metric] = min(inner[metric], aim)
    return tightened


def measured_round(spec: ArchSpec, cost_model, workload, budgets: dict[str, float],
                   inner: dict[str, float], measure, stage: str = "pick"
                   ) -> tuple[MeasuredRound, dict[str, float] | None]:
    """Time ``spec``, picked under ``inner``: the round, and the tightened bounds for the
    next pick (None: it met the budgets as measured)."""
    predicted = cost_model.predict(spec, workload).metrics()
    measured, noise = measure(spec)
    tightened = corrected_budgets(inner, budgets, predicted, measured, noise)
    return MeasuredRound(
        params=spec.num_params(), met=tightened is None, budgets=budgets, aim=dict(inner),
        stage=stage, **round_values(predicted, measured, noise)), tightened


def calibrate_aim(
    aim_pick: Callable[[dict[str, float]], Any],
    spec_of: Callable[[Any], ArchSpec],
    cost_model,
    workload,
    budgets: dict[str, float],
    inner: dict[str, float],
    rounds: int,
    measure: Callable[[ArchSpec], tuple[dict[str, float], dict[str, float]]],
) -> tuple[dict[str, float], list[MeasuredRound]]:
    """Re-aim ``inner`` on a cheap pick before the expensive one: ``aim_pick(bounds)`` (e.g.
    repair's answer, no training) is timed and the bounds tightened by the cost model's
    error on it until it meets the budgets as measured, at most ``rounds`` timings.
    Returns the bounds to aim the final pick at, and the timed rounds.

    Why: the final pick short-distills its whole short list before timing it, and the
    short list sits at the aim. Where the cost model is optimistic by a few per cent at
    the limit, every candidate misses and the whole list is trained again at the re-aimed
    bounds (on a 30-layer teacher, ten short distillations per round). One timing of the
    largest candidate finds that error first."""
    _, history, inner = timed_rounds(aim_pick, spec_of, cost_model, workload, budgets, inner,
                                     rounds, measure, "aim")
    return inner, history


def closed_loop(
    pick: Callable[[dict[str, float]], Any],
    spec_of: Callable[[Any], ArchSpec],
    cost_model,
    workload,
    budgets: dict[str, float],
    inner: dict[str, float],
    rounds: int,
    measure: Callable[[ArchSpec], tuple[dict[str, float], dict[str, float]]],
) -> tuple[Any, list[MeasuredRound]]:
    """Pick under ``inner``, measure, tighten and re-pick, at most ``rounds`` times.

    ``pick(budgets)`` returns a choice, ``spec_of(choice)`` its ArchSpec and
    ``measure(spec)`` its timings on the target and their noise. Returns the last choice and every
    round; the last round says whether the choice met the budgets as measured.
    """
    choice, history, _ = timed_rounds(pick, spec_of, cost_model, workload, budgets, inner,
                                      rounds, measure, "pick")
    return choice, history


# What the progress line of each measured loop is called.
LOOP_BARS = {"aim": "calibrate aim", "pick": "measured loop"}


def timed_rounds(pick, spec_of, cost_model, workload, budgets: dict[str, float],
                 inner: dict[str, float], rounds: int, measure, stage: str):
    """Up to ``rounds`` timed picks, each re-aimed only where the last one missed by more
    than its noise (``verdict``): the last choice, the rounds, and the bounds a next pick
    would aim at (``inner`` if the last one met or could not tell). A progress line says
    each round's verdict and why; a busy machine's warning is printed once."""
    timer = measure if isinstance(measure, SpecTimer) else SpecTimer(measure)
    choice = pick(inner)
    history: list[MeasuredRound] = []
    bar = Bar(LOOP_BARS.get(stage, stage), rounds)
    for number in range(1, rounds + 1):
        timed, tightened = judged_round(spec_of(choice), cost_model, workload, budgets, inner,
                                        timer, stage)
        history.append(timed)
        after = ("re-aiming" if number < rounds else "no round left") \
            if timed.verdict == MISSED else "done"
        bar.update(number, f"round {number} of at most {rounds}: {timed.why}; {after}")
        if timed.verdict != MISSED:
            break
        inner = tightened
        if number < rounds:
            choice = pick(inner)
    bar.close()
    timer.warn(list(budgets))
    return choice, history, inner


def judged_round(spec: ArchSpec, cost_model, workload, budgets: dict[str, float],
                 inner: dict[str, float], timer: SpecTimer, stage: str = "pick"
                 ) -> tuple[MeasuredRound, dict[str, float] | None]:
    """Time ``spec``, picked under ``inner``, and judge the reading (``verdict``); one that
    cannot tell is taken again (``SpecTimer.recheck``). Returns the round and, where it
    missed, the tightened bounds for the next pick (else None). A pick whose reading still
    cannot tell is kept on the cost model's prediction, and the timer records that."""
    predicted = cost_model.predict(spec, workload).metrics()
    measured, noise = timer(spec)
    said = verdict(budgets, measured, noise, timer.drift)
    if said == WITHIN_NOISE:
        measured, noise = timer.recheck(
            spec, lambda m, n: not missed_budgets(budgets, m, n))
        said = verdict(budgets, measured, noise, timer.drift)
    tightened = None
    if said == MISSED:  # an untimed reading aims under the budget by the model's error
        tightened = corrected_budgets(inner, budgets, predicted, measured, noise if is_untimed(
            noise) else aim_noise(measured, noise, timer.drift, timer.busy))
    why = _why(said, budgets, predicted, measured, noise, timer.drift, cost_model)
    if said == WITHIN_NOISE:
        timer.actions.append(f"kept a pick the timing cannot judge: {why}")
    return MeasuredRound(
        params=spec.num_params(), met=said == MET, verdict=said, why=why, budgets=budgets,
        aim=dict(inner), stage=stage, timed=not is_untimed(noise),
        **round_values(predicted, measured, noise)), tightened


def _why(said: str, budgets: dict[str, float], predicted: dict[str, float],
         measured: dict[str, float], noise: dict[str, float], drift: float,
         cost_model) -> str:
    """The reading of the budget closest to being broken, against it, in words."""
    timed = judged(budgets, measured) or list(TIMING_METRICS)
    metric = max(timed, key=lambda m: (_with_allowance(measured, m, drift) + noise.get(m, 0.0))
                 / budgets.get(m, measured[m] or 1.0))
    if metric not in budgets:
        return said
    budget = f"{budgets[metric]:.3g} budget"
    if is_untimed(noise):
        relation = "over" if said == MISSED else "within"
        return (f"not timed (machine busy): {metric} predicted {measured[metric]:.3g} + "
                f"{noise[metric]:.2g} (its error and drift), {relation} its {budget}")
    own = session_noise(measured, noise, drift).get(metric, 0.0)
    reading = f"{metric} read {measured[metric]:.3g} ± {own:.2g}"
    if said == MET:
        return f"met: {reading}, within its {budget} (drift {drift:.0%} allowed for)"
    if said == MISSED:
        # The drift allowance is on the reading's side: say so, or a reading under its
        # budget (3.64 against 3.67) reads as a miss with no reason given.
        if metric not in TIMING_METRICS:  # memory: exact, no drift
            return f"missed: {reading}, over its {budget}"
        with_drift = _with_allowance(measured, metric, drift)
        return (f"missed: {reading}, {with_drift:.3g} with {drift:.0%} drift allowed for, "
                f"over its {budget} by more than its noise")
    fit = getattr(cost_model, "fit", None)
    error = fit.train_mape.get(metric) if fit is not None else None
    trust = (f"error on its fit's probes {error:.1f}%" if error is not None
             else "not fitted here")
    return (f"within noise: {reading} cannot tell it from its {budget}; the cost model "
            f"predicts {predicted[metric]:.3g} ({trust})")
