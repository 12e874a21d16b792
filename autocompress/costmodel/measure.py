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
  process RSS would add those, but it depends on malloc's history and varied by
  ~20% between identical runs here).

Timing runs of several models are **interleaved** (round-robin, in a shuffled
order each round) so that a slow phase of a shared machine hits all candidates
alike; statistics are medians with quartiles (``RobustStat``).
"""

from __future__ import annotations

import inspect
import math
import random
import statistics
import time
import weakref
from collections.abc import Sequence

import torch
from pydantic import BaseModel, Field
from rich.progress import Progress
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from autocompress.costmodel.workload import Workload
from autocompress.hardware import RobustStat

GB = 1e9


STATISTICS = ("median", "floor")


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


def prompt_ids(model: torch.nn.Module, workload: Workload, seed: int = 0) -> torch.Tensor:
    """Deterministic random prompt tokens of shape ``[batch, isl]`` on the model's device."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (workload.batch, workload.isl), generator=generator)
    return ids.to(_device_of(model))


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


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


def measure_grid(
    models: Sequence[torch.nn.Module],
    workloads: Sequence[Workload],
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    memory: bool = True,
    progress: bool = True,
    description: str = "measuring",
) -> list[list[Measurement]]:
    """Measure every model on every workload: ``result[w][m]``.

    Each round runs every (model, workload) pair once, in a new shuffled order,
    so that a slow minute of a shared machine hits all pairs alike; the first
    ``warmup`` rounds are not recorded. Memory is measured after the timing.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    pairs = [(w, m) for w in range(len(workloads)) for m in range(len(models))]
    ids = {(w, m): prompt_ids(models[m], workloads[w], seed) for w, m in pairs}
    ttft: dict[tuple, list[float]] = {pair: [] for pair in pairs}
    tpot: dict[tuple, list[float]] = {pair: [] for pair in pairs}
    steps_all: dict[tuple, list[float]] = {pair: [] for pair in pairs}
    shuffler = random.Random(seed)
    rounds = warmup + repeats
    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task(description, total=rounds * len(pairs))
        for round_index in range(rounds):
            order = list(pairs)
            shuffler.shuffle(order)
            for w, m in order:
                first, steps, _ = generate_once(models[m], ids[w, m], workloads[w].osl)
                if round_index >= warmup:
                    ttft[w, m].append(first * 1e3)
                    tpot[w, m].append(statistics.median(steps) * 1e3 if steps else 0.0)
                    steps_all[w, m] += [step * 1e3 for step in steps] or [0.0]
                bar.advance(task)
    results: list[list[Measurement]] = []
    for w, workload in enumerate(workloads):
        row = []
        for m, model in enumerate(models):
            if memory:
                mem, method, detail = measure_memory(model, workload, seed)
            else:
                mem, method, detail = float("nan"), "not measured", {}
            row.append(
                Measurement(
                    workload=workload,
                    ttft_ms=RobustStat.of(ttft[w, m], "ms"),
                    tpot_ms=RobustStat.of(tpot[w, m], "ms"),
                    tpot_steps_ms=RobustStat.of(steps_all[w, m], "ms"),
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
) -> list[Measurement]:
    """Measure every model on one workload, interleaving repetitions (one per model)."""
    return measure_grid(models, [workload], repeats, warmup, seed, memory, progress,
                        description)[0]


def measure_model(
    model: torch.nn.Module,
    workload: Workload,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    memory: bool = True,
) -> Measurement:
    """Measure one model (``measure_many`` with a single model)."""
    return measure_many([model], workload, repeats, warmup, seed, memory, progress=False)[0]
