"""Verification: does the compressed model meet its limits on the real target?

The model is measured with THE measuring harness of the cost model
(``costmodel.measure.measure_model``: the same prefill/decode loop, the same
interleaving and robust statistics as cost-model fitting and validation), then
compared with the limits and with the cost model's prediction for the same
architecture, target and workload.

Pass rule. A measured latency is a median of ``repeats`` runs on a shared,
noisy machine, so a limit passes when it is met by the median *or lies within
the median's 95% confidence interval*: ``median − noise ≤ limit`` (and
``median + noise ≥ limit`` for throughput), with ``noise = 1.58 · IQR / √n``
(the box-plot notch of McGill, Tukey & Larsen, 1978). End-to-end latency and
throughput inherit the noise of TTFT and TPOT (propagated to first order).
Memory is measured deterministically (to a few pages), so its noise is 0: a
memory limit must be met exactly.

What is timed. The ``hf-eager`` engine is the model's own forward passes, as
``generate`` makes them: one prefill, then one decode step per token with a
``DynamicCache`` and a greedy argmax. ``generate``'s own per-token work (logits
processors, stopping criteria, mask and cache bookkeeping in Python) is not
included: it does not depend on the architecture the search chooses, and leaving
it out keeps verify, cost-model fitting and paired timing on one harness. It is
not small on tiny models: an independent ``generate()`` timing of the bundled
teacher (issue 20: 128-token prompt, 32 new tokens, 2 threads, median of 7) gave
TTFT 13.8 / TPOT 3.45 ms where verify reported 12.5 / 2.93 ms. The report says so
(``measurement.what``).

Sessions. On a shared host the same model timed in two back-to-back sessions can
differ by 5-18% while each session's own notch is ~1% (lab/measurement-history.md),
so ``sessions`` > 1 times the model that many times, one full session each, and
reports the median over sessions of every metric (memory: the first session's,
it is exact) with each session's readings and their spread. The pass rule is
applied to that median with the sessions' median notch: a steadier reading, not
a wider allowance.

Predictions come from the target's fitted cost model (``autocompress costmodel
fit``) or, without one, from the analytic spec-sheet model, which is not fitted
to this machine; the report says which (``prediction_note``) and, for a fitted
one, its error on its own probes.

Targets measured here: ``cpu-local/hf-eager/*`` on this CPU,
``<gpu>/hf-eager/*`` on the local CUDA device when there is one, and
``cpu-local/llama.cpp/*``: a ``.gguf`` file is run in the engine as it is (its
type must be the target's); a model directory is first exported to GGUF of the
target's type (``gguf_export``), so what is verified is what the engine serves.
``cpu-local/vllm/*``: the model is exported to nemotron-nas (a nemotron-nas
directory is served as it is) and served by vLLM's CPU build from its own
environment, timed by streamed requests (``costmodel.measure_vllm``). Other
serving engines (vLLM on a GPU, TensorRT-LLM) are not driven here; verifying on
them is an error with a hint rather than a silently wrong number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from autocompress.costmodel.model import unfitted_note
from autocompress.errors import AutoCompressError
from autocompress.hardware import LOCAL_CPU, engine_kernels
from autocompress.limits import LimitCheck, Limits

# Box-plot notch: median ± 1.58·IQR/√n covers the median with ~95% confidence.
NOTCH = 1.58
RULE = ("pass when every limit holds for the median, or lies within its 95% confidence "
        "interval (median ± 1.58·IQR/√n); with several timing sessions, the median over "
        "sessions and their median interval; memory has no noise allowance")

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class VerifyReport(BaseModel):
    """Measured vs limits vs predicted; the JSON of ``autocompress verify``."""

    model: str
    target: str
    workload: dict
    measured: dict[str, float]
    predicted: dict[str, float] | None
    limits: dict[str, float | None]
    noise: dict[str, float]
    ok: bool
    checks: list[LimitCheck]
    violations: list[str] = Field(description="Metrics whose limit is violated.")
    prediction_error: dict[str, float] = Field(
        default_factory=dict, description="(predicted − measured) / measured per metric."
    )
    prediction_note: str | None = None
    cost_model: str | None = None
    measurement: dict = Field(default_factory=dict, description="Quartiles, method, threads.")
    rule: str = RULE


def median_noise(stat) -> float:
    """Half-width of the ~95% confidence interval of a median (box-plot notch)."""
    return NOTCH * stat.iqr / math.sqrt(stat.n) if stat.n > 1 else 0.0


def measurement_noise(measurement) -> dict[str, float]:
    """Noise of every metric of a ``Measurement``, in the metric's own unit."""
    ttft = median_noise(measurement.ttft_ms)
    tpot = median_noise(measurement.tpot_ms)
    steps = measurement.workload.decode_steps
    tpot_median = measurement.tpot_ms.median
    throughput = measurement.throughput_tok_s * tpot / tpot_median if tpot_median else 0.0
    return {
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "e2e_ms": math.hypot(ttft, steps * tpot),
        "throughput_tok_s": throughput,
        "memory_gb": 0.0,
    }


def measurement_device(target) -> torch.device:
    """Where ``target`` is measured on this machine; raises when it cannot be."""
    if target.engine.name != "hf-eager":
        raise AutoCompressError(
            f"cannot measure the {target.engine.name} engine here: verify drives "
            "transformers (hf-eager) forward passes",
            hint=f"verify with {target.hardware.name}/hf-eager/{target.dtype} on the machine "
            "itself, or measure with the engine's own benchmark",
        )
    if target.dtype not in _TORCH_DTYPES:
        raise AutoCompressError(f"dtype {target.dtype} cannot be measured with hf-eager",
                                hint="use fp32, bf16 or fp16")
    if target.hardware.name == LOCAL_CPU:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise AutoCompressError(
            f"target {target.name} is a GPU, and this machine has none",
            hint="run verify on a machine with that GPU, or use cpu-local/hf-eager/fp32",
        )
    return torch.device("cuda", 0)


def verify(
    model_dir: str | Path,
    target,
    workload,
    limits: Limits,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    seed: int = 0,
    cost_model=None,
    sessions: int = 1,
) -> VerifyReport:
    """Measure ``model_dir`` on ``target`` for ``workload`` and check ``limits``.

    ``target`` / ``workload`` may be names (``cpu-local/hf-eager/fp32``,
    ``interactive-cpu``) or objects. ``threads`` defaults to the thread count
    the target's fitted cost model was measured with (else torch's current
    setting), so measurement and prediction describe the same machine state.
    ``cost_model`` defaults to ``CostModel.for_target(target)``. ``sessions``: how
    many timing sessions are pooled (median of each metric; see the module docstring).
    """
    from autocompress.costmodel.measure import measure_as_fitted
    from autocompress.costmodel.model import CostModel
    from autocompress.costmodel.target import Target
    from autocompress.costmodel.timing_lock import timing_lock
    from autocompress.costmodel.workload import get_workload
    from autocompress.modeling import arch_spec_of, load_causal_lm

    target = Target.parse(target) if isinstance(target, str) else target
    workload = get_workload(workload) if isinstance(workload, str) else workload
    cost_model = cost_model or CostModel.for_target(target)
    if sessions < 1:
        raise AutoCompressError(f"sessions must be at least 1, not {sessions}",
                                hint="time the model in one session or more")
    with timing_lock():  # no other run's timing on this machine meanwhile, when asked
        serving = None
        if target.engine.name == "llama.cpp":
            spec, runs = _measure_in_llamacpp(model_dir, target, workload, cost_model, repeats,
                                              warmup, seed, threads, sessions)
        elif target.engine.name == "vllm" and target.hardware.name == LOCAL_CPU:
            spec, runs, serving = _measure_in_vllm(model_dir, target, workload, cost_model,
                                                   repeats, warmup, seed, sessions)
        else:
            device = measurement_device(target)
            model, _ = load_causal_lm(model_dir, dtype=_TORCH_DTYPES[target.dtype],
                                      with_tokenizer=False)
            model.to(device)
            spec = arch_spec_of(model)
            runs = [measure_as_fitted(model, workload, cost_model, repeats=repeats,
                                      warmup=warmup, seed=seed, threads=threads,
                                      memory=session == 0) for session in range(sessions)]
    predicted, note = _predict(cost_model, spec, workload)
    note = "; ".join(filter(None, [cost_model_note(cost_model), note]))
    measured, noise, per_session = pool_sessions(runs)
    measurement, statistic = runs[0]
    checks = limits.check(measured, noise)
    return VerifyReport(
        model=str(model_dir), target=target.name, workload=workload.model_dump(mode="json"),
        measured=measured, predicted=predicted, limits=limits.model_dump(), noise=noise,
        ok=all(c.ok for c in checks), checks=checks,
        violations=[c.metric for c in checks if not c.ok],
        prediction_error=_relative_errors(predicted, measured),
        prediction_note=note, cost_model=cost_model.version,
        measurement={**_measurement_detail(measurement, statistic, target.engine.name),
                     **_sessions_detail(per_session, measured),
                     **({"serving": serving} if serving else {})},
    )


def pool_sessions(runs: list) -> tuple[dict[str, float], dict[str, float], list[dict]]:
    """(median over sessions of each metric, median of their noises, each session's
    metrics) of ``[(Measurement, statistic), ...]``."""
    per_session = [measurement.metrics(statistic) for measurement, statistic in runs]
    noises = [measurement_noise(measurement) for measurement, _ in runs]
    measured, noise = median_reading(list(zip(per_session, noises, strict=True)))
    return measured, noise, per_session


def median_reading(readings: list[tuple[dict[str, float], dict[str, float]]]
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """(median of each metric, median of each noise) over several timings ``[(metrics,
    noise), ...]`` of one model; memory comes from the first (the only one that measures
    it)."""
    import statistics

    first = readings[0][0]
    measured = {k: statistics.median(m[k] for m, _ in readings if m.get(k) is not None)
                if k != "memory_gb" else v for k, v in first.items()}
    noise = {k: statistics.median(n.get(k, 0.0) for _, n in readings) for k in readings[0][1]}
    return measured, noise


def _sessions_detail(per_session: list[dict], measured: dict[str, float]) -> dict:
    """Each session's timings and their spread ((max − min) / pooled median)."""
    timings = ("ttft_ms", "tpot_ms")
    spread = {k: (max(m[k] for m in per_session) - min(m[k] for m in per_session))
              / measured[k] for k in timings if measured.get(k)}
    return {"sessions": [{k: m[k] for k in timings if k in m} for m in per_session],
            "session_spread": spread}


def cost_model_note(cost_model) -> str:
    """Which cost model predicted, and how far to trust it."""
    target = cost_model.target
    fit = cost_model.fit
    if cost_model.source == "analytic" or fit is None:
        return f"predicted: {unfitted_note(target)}"
    mape = ", ".join(f"{k} {v:.1f}%" for k, v in sorted(fit.train_mape.items()))
    return (f"predicted by the cost model fitted {fit.created[:10]} on {fit.n_probes} probes "
            f"({fit.threads} threads, {fit.timing} timing; error on its probes: {mape}); "
            "`autocompress costmodel validate` measures its error on new architectures")


def _measure_in_llamacpp(model_dir, target, workload, cost_model, repeats, warmup, seed,
                         threads, sessions: int = 1):
    """(spec, [(Measurement, statistic)] per session) of a GGUF file, or of a model
    exported to one."""
    import tempfile

    from autocompress.costmodel.measure_llamacpp import measure_gguf_as_fitted
    from autocompress.gguf_export import export_gguf, read_gguf_spec

    def measure(path):
        return [measure_gguf_as_fitted(path, workload, cost_model, repeats=repeats,
                                       warmup=warmup, seed=seed, threads=threads)
                for _ in range(sessions)]

    if Path(model_dir).is_dir() and (Path(model_dir) / "model.gguf").is_file() \
            and not (Path(model_dir) / "config.json").is_file():
        model_dir = Path(model_dir) / "model.gguf"  # an exported GGUF directory
    if Path(model_dir).suffix == ".gguf":
        spec, dtype = read_gguf_spec(model_dir)
        if dtype != target.dtype:
            raise AutoCompressError(f"{model_dir} holds {dtype} weights, not {target.dtype}",
                                    hint=f"verify with --target cpu-local/llama.cpp/{dtype}")
        return spec, measure(model_dir)
    with tempfile.TemporaryDirectory(prefix="ac-verify-") as tmp:
        report = export_gguf(model_dir, Path(tmp) / "model.gguf", target.dtype)
        return read_gguf_spec(report.path)[0], measure(report.path)


def _measure_in_vllm(model_dir, target, workload, cost_model, repeats, warmup, seed,
                     sessions: int = 1):
    """(spec, [(Measurement, the fit's statistic)] per session, {each session's vLLM-style
    percentiles, vLLM's log-probabilities against PyTorch's}) of a model served by vLLM:
    exported to nemotron-nas first unless it is one (what vLLM
    cannot compute exactly is refused there, before any engine starts); one server per
    session."""
    import tempfile

    from autocompress.costmodel.measure import fitted_statistic
    from autocompress.costmodel.measure_vllm import measure_in_vllm
    from autocompress.export import spec_from_nemotron_nas
    from autocompress.vllm_engine import export_for_vllm, vllm_python

    vllm_python()  # not installed: one line saying how, before an export is paid for
    with tempfile.TemporaryDirectory(prefix="ac-verify-") as tmp:
        served = export_for_vllm(model_dir, Path(tmp) / "nemotron-nas")
        spec = spec_from_nemotron_nas(json.loads((served / "config.json").read_text()))
        results = [measure_in_vllm(served, workload, target.dtype, repeats=repeats,
                                   warmup=warmup, seed=seed + session)
                   for session in range(sessions)]
    runs = [(reading.measurement, fitted_statistic(cost_model)) for reading in results]
    return spec, runs, {"sessions": [reading.serving.model_dump() for reading in results],
                        "logits": results[0].logits}


def _predict(cost_model, spec, workload) -> tuple[dict[str, float] | None, str | None]:
    """The cost model's metrics, or None and why (verify still measures)."""
    try:
        prediction = cost_model.predict(spec, workload)
    except AutoCompressError as err:
        return None, f"no prediction: {err.message}"
    metrics = prediction.metrics()
    values = {k: float(metrics[k]) for k in ("ttft_ms", "tpot_ms", "e2e_ms",
                                              "throughput_tok_s", "memory_gb")}
    note = None
    if not prediction.fits:
        note = f"the cost model predicts it does not fit: {prediction.reason}"
    return values, note


def _relative_errors(predicted: dict | None, measured: dict[str, float]) -> dict[str, float]:
    if not predicted:
        return {}
    return {k: (predicted[k] - v) / v for k, v in measured.items()
            if k in predicted and v and math.isfinite(v) and math.isfinite(predicted[k])}


# What each measurable engine times (see the module docstring and costmodel/measure*.py).
WHAT_IS_TIMED = {
    "hf-eager": ("forward passes as generate makes them (prefill, then one decode step per "
                 "token with a DynamicCache, greedy argmax); generate's own per-token Python "
                 "work is not included"),
    "vllm": ("the nemotron-nas export served by vLLM's OpenAI server (eager): batch "
             "concurrent streamed requests per round, continuously batched; TTFT (queued to "
             "first token) and TPOT (first to last token over osl - 1) as vLLM's engine "
             "times them, each a round's mean over its requests; memory as vLLM accounts "
             "it (weights + the KV blocks the sequences hold)"),
    "llama.cpp": ("the GGUF served by llama.cpp: one llama_decode of the whole prompt batch "
                  "(plus each sequence's argmax), then one decode call per output token for "
                  "all sequences; memory as the engine reports its buffers"),
}


def _measurement_detail(measurement, statistic: str, engine: str) -> dict:
    return {
        "what": WHAT_IS_TIMED[engine],
        "kernels": engine_kernels(engine),  # hosts here differ: AVX2 only, or AVX-512 and AMX
        "ttft_ms": measurement.ttft_ms.model_dump(),
        "tpot_ms": measurement.tpot_ms.model_dump(),
        "memory_method": measurement.memory_method,
        "memory_detail": measurement.memory_detail,
        "repeats": measurement.repeats,
        "warmup": measurement.warmup,
        "threads": measurement.threads,
        "device": measurement.device,
        "statistic": statistic,
        "timing": measurement.timing,
        "paired": measurement.paired.model_dump() if measurement.paired else None,
    }
