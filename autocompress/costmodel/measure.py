"""THE measuring harness: TTFT, TPOT and peak memory of real forward passes.

Used by cost-model fitting, cost-model validation and ``verify``, so all three
measure the same thing the cost model predicts (see ``workload``):

- **TTFT**: one prefill forward of ``batch × isl`` random tokens into a fresh
  ``DynamicCache`` (``logits_to_keep=1``, as ``generate`` does), plus the argmax
  that picks the first token.
- **TPOT**: ``osl − 1`` decode steps feeding the chosen token back with the
  cache; the median step of a run, then the median over repetitions.
- **Peak memory**: on CUDA, ``torch.cuda.max_memory_allocated`` over one run
  (weights included). On the CPU torch keeps no allocator statistics, so we
  count tensors: during one extra (untimed) run a ``TorchDispatchMode`` sees
  every op's outputs, adds the bytes of each new storage and subtracts them
  when the storage is freed. Peak memory = parameter and buffer bytes + the
  peak of those live bytes (KV cache, activations, logits). It is exact and
  repeatable, the CPU analogue of ``max_memory_allocated``; it leaves out
  allocator slack and scratch buffers a kernel frees before returning (the
  process RSS would add those, but it depends on malloc's history, so it is not
  repeatable).

Timing runs of several models are **interleaved** (round-robin, in a shuffled
order each round) so that a slow phase of a shared machine hits all candidates
alike; statistics are medians with quartiles (``RobustStat``).

**Paired timing** (``reference=``; the default on the CPU). On a shared CPU the
absolute speed of a model changes from one second to the next (neighbours' use of
the shared cache and memory bus), in phases shorter than a run, so interleaving
alone does not help. Each run therefore steps the model and a fixed *reference*
model in lockstep: prefill one, prefill the other (three times, into fresh
caches), then one decode step of each, alternately, with their own caches, the
order flipped every round. Both see the same phase of the machine, and the ratio
of their times is steady where each absolute time is not. A paired measurement
reports

    time = median over runs of (model time / reference time)
           × the reference's 10th-percentile time, pooled over the whole grid,

the model's speed expressed through the reference's *uncontended* speed (the
steadiest absolute figure). Pooled over a fit's or a validation's hundreds of
runs that floor is steady, over the dozen runs of one model it is not; so
``verify`` and the search's measured check scale by the floor the cost model was
fitted with (``Measurement.with_scale``). The model's own absolute timings and
the reference's are kept in ``Measurement.paired``. The reference is the
teacher's architecture with random weights (speed does not depend on the
values); the cost model records it so that ``verify`` and the search's measured
check time against the same one. The measurements behind these choices are in
lab/measurement-history.md.
"""

from __future__ import annotations

import inspect
import math
import random
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, Field
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from autocompress.arch import ArchSpec
from autocompress.costmodel.workload import Workload
from autocompress.hardware import RobustStat
from autocompress.progress import Bar

GB = 1e9
T = TypeVar("T")


STATISTICS = ("median", "floor")
# How many prefills each paired run times per model (one prefill is a single
# sample, where a decode step's figure is a median over many steps).
PAIRED_PREFILLS = 3
# Decode steps of the short trial run that picks a model's stack padding (``quiet_padding``).
TRIAL_OSL = 4


class PairedTiming(BaseModel):
    """What a paired measurement saw (see the module docstring)."""

    ttft_ratio: RobustStat = Field(description="Over runs, of model / reference prefill.")
    tpot_ratio: RobustStat = Field(description="Over runs, of median step / reference's.")
    reference_ttft_ms: RobustStat = Field(description="Reference prefills, whole grid.")
    reference_tpot_ms: RobustStat = Field(description="Reference decode steps, whole grid.")
    absolute_ttft_ms: RobustStat = Field(description="The model's own prefill times.")
    absolute_tpot_ms: RobustStat = Field(description="The model's own per-run median step.")
    reference_params: int
    scale_ms: dict[str, float] = Field(
        default_factory=dict, description="The reference times the ratios are multiplied by.")
    scale_source: str = Field(
        default="session", description="session: the reference's floor in these runs; "
        "fit: the cost model's calibration (``Measurement.with_scale``).")

    def session_scale(self) -> dict[str, float]:
        """The reference's uncontended (10th-percentile) times in these runs, ms."""
        return {"ttft_ms": _floor(self.reference_ttft_ms),
                "tpot_ms": _floor(self.reference_tpot_ms)}


class Measurement(BaseModel):
    """Measured metrics of one model on one workload.

    Two statistics of the same runs: ``median`` (what a user sees on this machine
    now) and ``floor`` (TTFT: 10th percentile of the runs; TPOT: 10th percentile
    of all decode steps), which estimates the uncontended speed when other jobs
    share the CPU (their interference only ever adds time).
    """

    workload: Workload
    ttft_ms: RobustStat = Field(description="Over runs.")
    tpot_ms: RobustStat = Field(description="Over runs, of each run's median step.")
    tpot_steps_ms: RobustStat | None = Field(default=None, description="Over all steps.")
    memory_bytes: float
    memory_method: str
    memory_detail: dict[str, float] = Field(default_factory=dict)
    repeats: int
    warmup: int
    threads: int
    device: str
    paired: PairedTiming | None = Field(
        default=None, description="Set when timed against a reference (then ttft_ms and "
        "tpot_ms are ratio × the reference's uncontended time)."
    )

    @property
    def timing(self) -> str:
        return "paired" if self.paired is not None else "absolute"

    def with_scale(self, scale_ms: dict[str, float], source: str = "fit") -> Measurement:
        """A paired measurement expressed through other reference times (ms).

        A short session's reference floor moves by ±10 % with the machine's load
        (a dozen runs of one model); the ratios do not. ``verify`` and the search's
        measured check therefore scale by the reference times the cost model was
        fitted with, pooled over every probe.
        """
        if self.paired is None:
            raise ValueError("only a paired measurement can be rescaled")
        ttft = scale_ms["ttft_ms"] / self.paired.scale_ms["ttft_ms"]
        tpot = scale_ms["tpot_ms"] / self.paired.scale_ms["tpot_ms"]
        return self.model_copy(update={
            "ttft_ms": self.ttft_ms.scaled(ttft),
            "tpot_ms": self.tpot_ms.scaled(tpot),
            "tpot_steps_ms": self.tpot_steps_ms.scaled(tpot) if self.tpot_steps_ms else None,
            "paired": self.paired.model_copy(update={"scale_ms": dict(scale_ms),
                                                     "scale_source": source}),
        })

    @property
    def e2e_ms(self) -> float:
        return self.ttft_ms.median + self.workload.decode_steps * self.tpot_ms.median

    @property
    def throughput_tok_s(self) -> float:
        return 1000.0 * self.workload.batch / self.tpot_ms.median

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / GB

    def metrics(self, statistic: str = "median") -> dict[str, float]:
        """Keyed like ``CostPrediction.metrics``; ``statistic``: median or floor."""
        if statistic == "floor":
            ttft = _floor(self.ttft_ms)
            tpot = _floor(self.tpot_steps_ms or self.tpot_ms)
        elif statistic == "median":
            ttft, tpot = self.ttft_ms.median, self.tpot_ms.median
        else:
            raise ValueError(f"statistic must be one of {STATISTICS}, not {statistic!r}")
        return {
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": ttft + self.workload.decode_steps * tpot,
            "throughput_tok_s": 1000.0 * self.workload.batch / tpot if tpot else math.inf,
            "memory_gb": self.memory_gb,
        }


def _floor(stat: RobustStat) -> float:
    return stat.p10 if stat.p10 is not None else stat.median


# ------------------------------------------------------------------ one run


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5 names the cache argument ``cache``; older code ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefill(model: torch.nn.Module, input_ids: torch.Tensor, cache):
    """Forward the prompt into ``cache``; returns (output, first token)."""
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1,
                **{_cache_kwarg(model): cache})
    return out, out.logits[:, -1].argmax(-1, keepdim=True)


def _decode(model: torch.nn.Module, token: torch.Tensor, cache):
    """One decode step; returns (output, next token)."""
    out = model(input_ids=token, use_cache=True, **{_cache_kwarg(model): cache})
    return out, out.logits[:, -1].argmax(-1, keepdim=True)


def generate_once(model: torch.nn.Module, input_ids: torch.Tensor, osl: int):
    """Prefill + ``osl − 1`` greedy decode steps. Returns (ttft_s, step_seconds, cache)."""
    device = input_ids.device
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        _sync(device)
        start = time.perf_counter()
        _, token = _prefill(model, input_ids, cache)
        _sync(device)
        ttft = time.perf_counter() - start
        steps = []
        for _ in range(osl - 1):
            start = time.perf_counter()
            _, token = _decode(model, token, cache)
            _sync(device)
            steps.append(time.perf_counter() - start)
    return ttft, steps, cache


class RunTimes(BaseModel):
    """Seconds of one run of a model (and of the reference, when paired; else empty)."""

    prefills: list[float]
    reference_prefills: list[float]
    steps: list[float]
    reference_steps: list[float]


def generate_paired(model: torch.nn.Module, reference: torch.nn.Module, input_ids: torch.Tensor,
                    reference_ids: torch.Tensor, osl: int, prefills: int = PAIRED_PREFILLS,
                    reference_first: bool = False) -> RunTimes:
    """Time ``model`` and ``reference`` in lockstep (prompts of the same shape).

    ``prefills`` alternating prefills of each into fresh caches, then ``osl − 1``
    greedy decode steps, one of each in turn, from the last prefill's caches.
    ``reference_first`` flips the order inside every pair, so that neither model
    always runs right after the other's cache-evicting step.
    """
    device = input_ids.device
    nets = [reference, model] if reference_first else [model, reference]
    prompts = [reference_ids, input_ids] if reference_first else [input_ids, reference_ids]
    times: list[dict[str, list[float]]] = [{"prefill": [], "step": []} for _ in nets]
    with torch.inference_mode():
        for _ in range(prefills):
            caches, tokens = [], []
            for net, prompt, record in zip(nets, prompts, times, strict=True):
                cache = DynamicCache(config=net.config)
                _sync(device)
                start = time.perf_counter()
                _, token = _prefill(net, prompt, cache)
                _sync(device)
                record["prefill"].append(time.perf_counter() - start)
                caches.append(cache)
                tokens.append(token)
        for _ in range(osl - 1):
            for i, (net, record) in enumerate(zip(nets, times, strict=True)):
                start = time.perf_counter()
                _, tokens[i] = _decode(net, tokens[i], caches[i])
                _sync(device)
                record["step"].append(time.perf_counter() - start)
    mine, theirs = (times[1], times[0]) if reference_first else (times[0], times[1])
    return RunTimes(prefills=mine["prefill"], reference_prefills=theirs["prefill"],
                     steps=mine["step"], reference_steps=theirs["step"])


def prompt_ids(model: torch.nn.Module, workload: Workload, seed: int = 0) -> torch.Tensor:
    """Deterministic random prompt tokens of shape ``[batch, isl]`` on the model's device."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (workload.batch, workload.isl), generator=generator)
    return ids.to(_device_of(model))


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def timing_reference(spec: ArchSpec | dict, dtype: torch.dtype = torch.float32,
                     device: torch.device | str = "cpu") -> torch.nn.Module:
    """The reference model of paired timing: ``spec`` (complete) with random weights."""
    from autocompress.modeling import build_model

    spec = spec if isinstance(spec, ArchSpec) else ArchSpec.model_validate(spec)
    return build_model(spec, None, seed=0, dtype=dtype).to(device)


# ------------------------------------------------------------------ memory


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters and buffers, shared (tied) tensors counted once."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


def _cache_tensors(cache) -> list[torch.Tensor]:
    """The key and value tensors a ``DynamicCache`` holds."""
    tensors = []
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                tensors.append(tensor)
    return tensors


def _cache_bytes(cache) -> int:
    return sum(tensor.nbytes for tensor in _cache_tensors(cache))


class _LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of CPU tensor storages created while active and still alive.

    Every op's outputs pass through ``__torch_dispatch__``; a storage seen for the
    first time adds its size, and a finalizer on the storage (torch keeps one
    Python object per storage, so it fires when the storage is really freed)
    subtracts it. Storages that existed before (weights, the prompt) are
    registered up front and never counted. Scratch buffers that a kernel
    allocates and frees internally are not visible, nor is allocator slack.
    """

    def __init__(self, existing: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: set[int] = {id(t.untyped_storage()) for t in existing}

    def _free(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def count(self, tensor: torch.Tensor) -> None:
        """Start counting ``tensor``'s storage (no-op if already counted or pre-existing)."""
        if tensor.device.type != "cpu":
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key not in self._tracked:
            nbytes = storage.nbytes()
            self._tracked.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.count(leaf)
        return out


def _peak_tensor_bytes(model: torch.nn.Module, ids: torch.Tensor, osl: int):
    """(peak live bytes beyond the existing tensors, final cache bytes) of one generation.

    The peak is reached in the prefill or in the last decode step (the cache only
    grows; a decode step's temporaries are tiny), so only those two forwards run
    under the tracker. The steps in between run untracked, and what they leave
    alive (the grown cache, the last logits and token) is counted before the
    last step. That gives the same figure as tracking every step, ~10× faster.
    """
    tracker = _LiveTensorBytes([*model.parameters(), *model.buffers(), ids])
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        with tracker:
            out, token = _prefill(model, ids, cache)
        for _ in range(osl - 2):
            out, token = _decode(model, token, cache)
        if osl >= 2:
            for tensor in [*_cache_tensors(cache), out.logits, token]:
                tracker.count(tensor)
            with tracker:
                out, token = _decode(model, token, cache)
    peak = tracker.peak
    return peak, _cache_bytes(cache)


def measure_memory(model: torch.nn.Module, workload: Workload, seed: int = 0):
    """Peak memory of one generation: ``(bytes, method, detail)`` (see module docstring)."""
    device = _device_of(model)
    ids = prompt_ids(model, workload, seed)
    weights = model_bytes(model)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        generate_once(model, ids, workload.osl)
        peak = torch.cuda.max_memory_allocated(device)
        return float(peak), "cuda-max-allocated", {"weights": weights}
    peak, cache = _peak_tensor_bytes(model, ids, workload.osl)
    detail = {"weights": weights, "peak_activations_and_cache": peak, "final_cache": cache}
    return float(weights + peak), "cpu-live-tensor-bytes", detail


# ---------------------------------------------------------------- harness


# CPython keeps a thread's Python frames in 16 KiB chunks, mapped when a call crosses the
# end of one and unmapped as soon as it returns. A decode step of a small model is mostly
# Python calls: where the stack leaves them straddling a chunk's end, every step maps,
# faults in and unmaps chunks, and the same model reads up to 2.2x slower depending only
# on how deep its caller's stack is (lab/timing_stack_depth.py). So each model is timed
# under the padding of frames at which a short trial run of it faults least: its calls
# then sit inside one chunk, wherever the harness is called from (the cost-model fit, the
# search, ``verify``). Not on a fresh thread: a second OpenMP team on a small machine
# makes libgomp throttle its spin-waits, which costs more than the chunks (~45% here).
PADDINGS = tuple(range(0, 192, 12))  # frames of ``padded``: a little over one chunk


def padded(frames: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` called ``frames`` Python frames below here."""
    return fn(*args, **kwargs) if frames <= 0 else padded(frames - 1, fn, *args, **kwargs)


def thread_page_faults() -> int:
    """Minor page faults of the calling thread (0 where the OS does not count them)."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    except (ImportError, AttributeError, OSError):
        return 0


def quiet_padding(trial: Callable[[], object], paddings: Sequence[int] = PADDINGS) -> int:
    """The padding (frames) at which ``trial`` causes the fewest page faults on this thread
    (the smallest such padding on a tie, so 0 where faults are not counted)."""
    faults = {}
    for frames in paddings:
        before = thread_page_faults()
        padded(frames, trial)
        faults[frames] = thread_page_faults() - before
    return min(paddings, key=lambda frames: (faults[frames], frames))


def padding_trial(model: torch.nn.Module, reference: torch.nn.Module | None,
                  ids: torch.Tensor, reference_ids: torch.Tensor | None) -> Callable[[], object]:
    """A short run of ``model`` as it will be timed (paired or not), for ``quiet_padding``."""
    if reference is None:
        return lambda: generate_once(model, ids, TRIAL_OSL)
    return lambda: generate_paired(model, reference, ids, reference_ids, TRIAL_OSL, prefills=1)


class _Samples:
    """Timings (ms) of one (workload, model) pair over the recorded runs."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.steps: list[float] = []
        self.ttft_ratio: list[float] = []
        self.tpot_ratio: list[float] = []

    def add(self, run: RunTimes) -> None:
        steps = [step * 1e3 for step in run.steps] or [0.0]
        self.ttft.append(statistics.median(run.prefills) * 1e3)
        self.tpot.append(statistics.median(steps))
        self.steps += steps
        if run.reference_prefills:
            self.ttft_ratio.append(statistics.median(
                a / b for a, b in zip(run.prefills, run.reference_prefills, strict=True)))
            self.tpot_ratio.append(
                statistics.median(run.steps) / statistics.median(run.reference_steps)
                if run.steps else 0.0)

    def timing_fields(self, reference: dict[str, Any] | None) -> dict:
        """``Measurement`` timing fields: absolute, or ratio × reference floor when paired.

        ``reference``: the reference's pooled ``reference_ttft_ms``, ``reference_tpot_ms``
        and ``reference_params`` (None when the runs were not paired).
        """
        absolute = {
            "ttft_ms": RobustStat.of(self.ttft, "ms"),
            "tpot_ms": RobustStat.of(self.tpot, "ms"),
            "tpot_steps_ms": RobustStat.of(self.steps, "ms"),
        }
        if reference is None:
            return absolute
        paired = PairedTiming(
            ttft_ratio=RobustStat.of(self.ttft_ratio),
            tpot_ratio=RobustStat.of(self.tpot_ratio),
            **reference,
            absolute_ttft_ms=absolute["ttft_ms"],
            absolute_tpot_ms=absolute["tpot_ms"],
        )
        paired.scale_ms = scale = paired.session_scale()
        return {
            "ttft_ms": paired.ttft_ratio.scaled(scale["ttft_ms"], "ms"),
            "tpot_ms": paired.tpot_ratio.scaled(scale["tpot_ms"], "ms"),
            # No per-step figure: a ratio of two single steps is noise, so the floor
            # statistic of a paired measurement is the 10th percentile of run ratios.
            "tpot_steps_ms": None,
            "paired": paired,
        }


def _check_reference(reference: torch.nn.Module, models: Sequence[torch.nn.Module]) -> None:
    vocab = int(reference.config.vocab_size)
    for model in models:
        if int(model.config.vocab_size) > vocab:
            raise ValueError("the timing reference has a smaller vocabulary than a measured "
                             "model; its prompts would not be valid for it")
        if _device_of(model) != _device_of(reference):
            raise ValueError("the timing reference and the models must be on one device")


def measure_grid(
    models: Sequence[torch.nn.Module],
    workloads: Sequence[Workload],
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    memory: bool = True,
    progress: bool = True,
    description: str = "measuring",
    reference: torch.nn.Module | None = None,
) -> list[list[Measurement]]:
    """Measure every model on every workload: ``result[w][m]``.

    Each round runs every (model, workload) pair once, in a new shuffled order,
    so that a slow minute of a shared machine hits all pairs alike; the first
    ``warmup`` rounds are not recorded. With a ``reference`` model every run is
    paired with it in lockstep (module docstring). Memory is measured after the
    timing, of each model alone.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    if reference is not None:
        _check_reference(reference, models)
    pairs = [(w, m) for w in range(len(workloads)) for m in range(len(models))]
    ids = {(w, m): prompt_ids(models[m], workloads[w], seed) for w, m in pairs}
    samples = {pair: _Samples() for pair in pairs}
    reference_prefills: dict[int, list[float]] = {w: [] for w in range(len(workloads))}
    reference_steps: dict[int, list[float]] = {w: [] for w in range(len(workloads))}
    reference_ids = {w: prompt_ids(reference, workloads[w], seed) for w in reference_prefills} \
        if reference is not None else {}
    shuffler = random.Random(seed)
    rounds = warmup + repeats
    padding = {m: quiet_padding(padding_trial(models[m], reference, ids[0, m],
                                              reference_ids.get(0)))
               for m in range(len(models))}
    with Bar(description, rounds * len(pairs), enabled=progress) as bar:
        for round_index in range(rounds):
            order = list(pairs)
            shuffler.shuffle(order)
            for w, m in order:
                osl = workloads[w].osl
                if reference is None:
                    first, steps, _ = padded(padding[m], generate_once, models[m], ids[w, m],
                                             osl)
                    run = RunTimes(prefills=[first], reference_prefills=[], steps=steps,
                                   reference_steps=[])
                else:
                    run = padded(padding[m], generate_paired, models[m], reference, ids[w, m],
                                 reference_ids[w], osl, reference_first=round_index % 2 == 1)
                if round_index >= warmup:
                    samples[w, m].add(run)
                    reference_prefills[w] += [t * 1e3 for t in run.reference_prefills]
                    reference_steps[w] += [t * 1e3 for t in run.reference_steps]
                bar.advance()
    results: list[list[Measurement]] = []
    for w, workload in enumerate(workloads):
        pooled = None if reference is None else {  # one reference, pooled over the workload
            "reference_ttft_ms": RobustStat.of(reference_prefills[w], "ms"),
            "reference_tpot_ms": RobustStat.of(reference_steps[w] or [0.0], "ms"),
            "reference_params": sum(p.numel() for p in reference.parameters()),
        }
        row = []
        for m, model in enumerate(models):
            if memory:
                mem, method, detail = measure_memory(model, workload, seed)
            else:
                mem, method, detail = float("nan"), "not measured", {}
            timing = samples[w, m].timing_fields(pooled)
            row.append(
                Measurement(
                    workload=workload,
                    **timing,
                    memory_bytes=mem,
                    memory_method=method,
                    memory_detail=detail,
                    repeats=repeats,
                    warmup=warmup,
                    threads=torch.get_num_threads(),
                    device=str(_device_of(model)),
                )
            )
        results.append(row)
    return results


def measure_many(
    models: Sequence[torch.nn.Module],
    workload: Workload,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    memory: bool = True,
    progress: bool = True,
    description: str = "measuring",
    reference: torch.nn.Module | None = None,
) -> list[Measurement]:
    """Measure every model on one workload, interleaving repetitions (one per model)."""
    return measure_grid(models, [workload], repeats, warmup, seed, memory, progress,
                        description, reference)[0]


def measure_model(
    model: torch.nn.Module,
    workload: Workload,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    memory: bool = True,
    reference: torch.nn.Module | None = None,
) -> Measurement:
    """Measure one model (``measure_many`` with a single model)."""
    return measure_many([model], workload, repeats, warmup, seed, memory, progress=False,
                        reference=reference)[0]


def fitted_statistic(cost_model) -> str:
    """The timing statistic ``cost_model`` was fitted to (median where it has no fit), which a
    timing compared with its predictions must use."""
    return cost_model.fit.statistic if cost_model.fit is not None else "median"


def measure_as_fitted(model: torch.nn.Module, workload: Workload, cost_model, repeats: int = 5,
                      warmup: int = 1, seed: int = 0, threads: int | None = None,
                      memory: bool = True):
    """Measure ``model`` as ``cost_model`` was fitted: with its thread count (unless
    ``threads`` is given), its timing statistic, and paired with its timing reference
    when it was fitted that way (ratios then scaled by the reference times of the fit
    where it has them for this workload's shape), so measured and predicted compare
    like with like. Returns (Measurement, statistic name)."""
    fit = cost_model.fit
    if threads is None and fit is not None:
        threads = fit.threads
    reference = None
    if fit is not None and fit.timing == "paired" and fit.reference_spec:
        parameter = next(model.parameters())
        reference = timing_reference(fit.reference_spec, parameter.dtype, parameter.device)
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        measurement = measure_model(model, workload, repeats=repeats, warmup=warmup, seed=seed,
                                    memory=memory, reference=reference)
    finally:
        torch.set_num_threads(previous)
    scale = fit.reference_scale(workload) if reference is not None else None
    if scale is not None:  # the fit's pooled floor, steadier than this short session's
        measurement = measurement.with_scale(scale, source="fit")
    return measurement, fitted_statistic(cost_model)
