"""Measuring models in llama.cpp with the paired discipline of ``costmodel.measure``.

Each model (a loaded model, or a GGUF file) is written as GGUF of the target's
type and served by llama.cpp as a user would run it: the engine's defaults
(flash attention auto, f16 KV cache), ``threads`` threads, one context per
(model, workload) sized ``batch`` sequences × ``isl + osl`` tokens (rounded up to
256, as the engine does), ``batch`` sequences decoded together in one call.

- **TTFT**: one ``llama_decode`` of the whole ``batch × isl`` prompt batch (the
  engine splits it into micro-batches of 512 tokens), plus the argmax of each
  sequence's last logits.
- **TPOT**: one decode call with one token per sequence; the median step of a run.
- **Memory**: what the engine reported allocating for this context: the model
  buffer (weights), the KV cache, the output buffer and the compute buffer.

Runs are paired with a reference (the teacher's architecture, random weights,
the same type) exactly as ``measure.generate_paired`` pairs PyTorch models:
alternating prefills into emptied caches, then decode steps in lockstep, the
order flipped every round; the result is ratio × the reference's pooled
10th-percentile time (``measure._Samples``).

Two differences, both because the engine does the same work every step while
other jobs on a shared CPU only ever add time:

- **Clock.** With one thread (the default) llama.cpp computes on the calling
  thread, so a step is timed by that thread's CPU time (``time.thread_time``),
  which does not count the time the scheduler gives to other processes. Under a
  load of 16 on 2 cores, the teacher's 128-token prefill took 253-340 ms of wall
  time and 32.6-35.0 ms of CPU time; its decode steps, short enough to run
  between preemptions, 0.77 ms (wall, 10th percentile) and 0.76 ms (CPU). With
  more threads the wall clock is used.
- **Floor.** A run is reduced to its floor before the ratio is taken (its
  fastest prefill, the 10th percentile of its decode steps); one prefill per
  model per run (``LLAMACPP_PREFILLS``).
"""

from __future__ import annotations

import functools
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from autocompress.arch import ArchSpec
from autocompress.costmodel.measure import (
    Measurement,
    RunTimes,
    _Samples,
    fitted_statistic,
    timing_reference,
)
from autocompress.costmodel.workload import Workload
from autocompress.hardware import RobustStat
from autocompress.progress import Bar

ENGINE_UBATCH = 512  # llama.cpp's default micro-batch
LLAMACPP_PREFILLS = 1  # per model per paired run: CPU time needs no repeats inside a run
CONTEXT_ROUNDING = 256  # llama.cpp pads each sequence's context to a multiple of this


def context_per_sequence(workload: Workload) -> int:
    """KV cells the engine gives each sequence for this workload."""
    need = workload.isl + workload.osl
    return -(-need // CONTEXT_ROUNDING) * CONTEXT_ROUNDING


# The work of llama.cpp's CPU flash attention (``ggml_compute_forward_flash_attn_ext``
# in ggml-cpu/ops.cpp), per query head, summed over all sequences:
#
# - It attends over a KV *view* padded to a multiple of 256 cells (at least 256, at
#   most the sequence's cells: ``llama_kv_cache::get_n_kv``), so that the graph
#   stays the same across steps, and reads the mask of every cell of the view.
# - A prefill of ``batch`` sequences runs in micro-batches of ``512 // batch``
#   tokens per sequence (``split_equal``; one sequence: 512), each one against the
#   view of the cells filled so far.
# - A micro-batch with at least 64 queries per sequence takes the tiled path: 64
#   queries × 64 cells per tile, a full-size GEMM for every tile pair that is not
#   entirely masked (a partial tile costs a whole one). With fewer queries (and in
#   decode) each query visits its visible cells one by one, a slower vector path.
KV_VIEW_PADDING = 256
FLASH_TILE = 64


class AttentionWork(NamedTuple):
    """Flash-attention cells per query head, all sequences (see above)."""

    view: float  # mask cells read (query × view cell)
    tiles: float  # cells of the tiles the GEMM path computes
    vector: float  # visible cells of the vector path


def _kv_view(filled: np.ndarray, cells: int) -> np.ndarray:
    padded = -(-filled // KV_VIEW_PADDING) * KV_VIEW_PADDING
    return np.minimum(cells, np.maximum(KV_VIEW_PADDING, padded))


def prefill_attention_work(workload: Workload) -> AttentionWork:
    """The flash-attention work of the whole prefill (per query head, all sequences)."""
    return prefill_work(workload.batch, workload.isl, context_per_sequence(workload))


@functools.lru_cache(maxsize=4096)
def prefill_work(batch: int, isl: int, cells: int) -> AttentionWork:
    """``prefill_attention_work`` of ``batch`` prompts of ``isl`` tokens, ``cells`` each."""
    per_ubatch = ENGINE_UBATCH if batch == 1 else ENGINE_UBATCH // batch
    work = _sequence_work(max(1, per_ubatch), isl, cells)
    return AttentionWork(*(batch * value for value in work))


def _sequence_work(per_ubatch: int, isl: int, cells: int) -> tuple[float, float, float]:
    """One sequence of ``isl`` tokens in micro-batches of ``per_ubatch``: (view, tiles,
    vector) cells. Vectorised: ``max_context`` asks about prompts of millions of tokens."""
    starts = np.arange(0, isl, per_ubatch, dtype=np.int64)
    ends = np.minimum(starts + per_ubatch, isl)
    queries = ends - starts
    view = float((queries * _kv_view(ends, cells)).sum())
    # Vector path (< 64 queries): the query at position p sees cells 0..p.
    small = queries < FLASH_TILE
    vector = float(((starts + 1 + ends) * queries)[small].sum() / 2)
    # Tiled path: each tile of 64 queries computes every 64-cell tile up to its last query.
    tiled_starts, tiled_ends = starts[~small], ends[~small]
    per_batch = -(-(tiled_ends - tiled_starts) // FLASH_TILE)
    offsets = np.arange(per_batch.sum()) - np.repeat(np.cumsum(per_batch) - per_batch, per_batch)
    first = np.repeat(tiled_starts, per_batch) + offsets * FLASH_TILE
    last = np.minimum(first + FLASH_TILE, np.repeat(tiled_ends, per_batch)) - 1
    tiles = float((last // FLASH_TILE + 1).sum()) * FLASH_TILE * FLASH_TILE
    return view, tiles, vector


def decode_kv_view_cells(workload: Workload) -> float:
    """KV-view cells one decode step visits (all sequences), averaged over the steps."""
    return decode_view(workload.batch, workload.isl, workload.decode_steps,
                       context_per_sequence(workload))


@functools.lru_cache(maxsize=4096)
def decode_view(batch: int, isl: int, steps: int, cells: int) -> float:
    """``decode_kv_view_cells`` of ``steps`` decode steps after ``isl`` prompt tokens."""
    if steps < 1:
        return 0.0
    return float(batch * _kv_view(isl + 1 + np.arange(steps), cells).mean())


def open_session(path: str | Path, workload: Workload, threads: int):
    """An ``EngineSession`` sized for ``workload`` (see the module docstring)."""
    from autocompress.llamacpp import EngineSession

    return EngineSession(path, n_ctx=workload.batch * context_per_sequence(workload),
                         n_seq=workload.batch, threads=threads,
                         n_batch=workload.batch * workload.isl, n_outputs=workload.batch)


def write_timing_gguf(model: torch.nn.Module, directory: Path, name: str, dtype: str) -> Path:
    """``model`` as a GGUF of ``dtype`` for timing (a placeholder vocabulary)."""
    from autocompress.gguf_export import write_gguf

    path = directory / f"{name}.gguf"
    write_gguf(model, None, path, dtype, name=name)
    return path


def _prompts(workload: Workload, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(workload.batch, workload.isl)).tolist()


def clock_for(threads: int):
    """The step clock: the calling thread's CPU time with one thread, else wall time."""
    return time.thread_time if threads == 1 else time.perf_counter


def run_paired(model, reference, workload: Workload, prompts, reference_prompts,
               reference_first: bool = False) -> RunTimes:
    """Time ``model`` and ``reference`` sessions in lockstep (see ``generate_paired``)."""
    clock = clock_for(model.threads)
    sessions = [reference, model] if reference_first else [model, reference]
    batches = [s.prepare_prefill(p) for s, p in zip(
        sessions, [reference_prompts, prompts] if reference_first else [prompts,
                                                                        reference_prompts],
        strict=True)]
    lengths = [workload.isl] * workload.batch
    times = [{"prefill": [], "step": []} for _ in sessions]
    tokens: list[list[int]] = [[], []]
    for _ in range(LLAMACPP_PREFILLS):
        for i, (session, batch) in enumerate(zip(sessions, batches, strict=True)):
            session.clear()
            start = clock()
            tokens[i] = session.prefill(batch, lengths)
            times[i]["prefill"].append(clock() - start)
    for _ in range(workload.decode_steps):
        for i, session in enumerate(sessions):
            start = clock()
            tokens[i] = session.decode(tokens[i])
            times[i]["step"].append(clock() - start)
    mine, theirs = (times[1], times[0]) if reference_first else (times[0], times[1])
    return _floor(RunTimes(prefills=mine["prefill"], reference_prefills=theirs["prefill"],
                           steps=mine["step"], reference_steps=theirs["step"]))


def _floor(run: RunTimes) -> RunTimes:
    """The run reduced to its uncontended times (see the module docstring)."""
    def low(values: list[float]) -> list[float]:
        return [float(np.percentile(values, 10))] if values else []

    return RunTimes(prefills=[min(run.prefills)],
                    reference_prefills=[min(run.reference_prefills)]
                    if run.reference_prefills else [],
                    steps=low(run.steps), reference_steps=low(run.reference_steps))


def run_once(session, workload: Workload, prompts) -> RunTimes:
    """One unpaired run: a prefill and ``osl − 1`` decode steps."""
    clock = clock_for(session.threads)
    batch = session.prepare_prefill(prompts)
    session.clear()
    start = clock()
    tokens = session.prefill(batch, [workload.isl] * workload.batch)
    prefill = clock() - start
    steps = []
    for _ in range(workload.decode_steps):
        start = clock()
        tokens = session.decode(tokens)
        steps.append(clock() - start)
    return _floor(RunTimes(prefills=[prefill], reference_prefills=[], steps=steps,
                           reference_steps=[]))


def measure_gguf_grid(
    paths: Sequence[Path],
    workloads: Sequence[Workload],
    threads: int = 1,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = True,
    description: str = "measuring in llama.cpp",
    reference: Path | None = None,
    reference_params: int = 0,
) -> list[list[Measurement]]:
    """Measure every GGUF on every workload in llama.cpp: ``result[w][m]``.

    Per workload, every model's session is open at once and each round runs every
    model once in a new shuffled order (paired with ``reference`` when given).
    """
    results: list[list[Measurement]] = []
    shuffler = random.Random(seed)
    total = (warmup + repeats) * len(paths) * len(workloads)
    with Bar(description, total, enabled=progress) as bar:
        for workload in workloads:
            sessions = [open_session(path, workload, threads) for path in paths]
            ref = open_session(reference, workload, threads) if reference else None
            try:
                results.append(_measure_workload(sessions, ref, workload, repeats, warmup,
                                                 seed, shuffler, reference_params, threads,
                                                 bar.advance))
            finally:
                for session in [*sessions, ref]:
                    if session is not None:
                        session.close()
    return results


def _measure_workload(sessions, ref, workload, repeats, warmup, seed, shuffler,
                      reference_params, threads, advance) -> list[Measurement]:
    prompts = [_prompts(workload, s.n_vocab, seed) for s in sessions]
    ref_prompts = _prompts(workload, ref.n_vocab, seed) if ref else None
    samples = [_Samples() for _ in sessions]
    ref_prefills: list[float] = []
    ref_steps: list[float] = []
    for round_index in range(warmup + repeats):
        order = list(range(len(sessions)))
        shuffler.shuffle(order)
        for m in order:
            if ref is None:
                run = run_once(sessions[m], workload, prompts[m])
            else:
                run = run_paired(sessions[m], ref, workload, prompts[m], ref_prompts,
                                 reference_first=round_index % 2 == 1)
            if round_index >= warmup:
                samples[m].add(run)
                ref_prefills += [t * 1e3 for t in run.reference_prefills]
                ref_steps += [t * 1e3 for t in run.reference_steps]
            advance()
    pooled = None if ref is None else {
        "reference_ttft_ms": RobustStat.of(ref_prefills, "ms"),
        "reference_tpot_ms": RobustStat.of(ref_steps or [0.0], "ms"),
        "reference_params": reference_params,
    }
    return [
        Measurement(
            workload=workload,
            **sample.timing_fields(pooled),
            memory_bytes=session.memory.total,
            memory_method="llama.cpp-buffers",
            memory_detail=session.memory.model_dump(),
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            device="cpu (llama.cpp)",
        )
        for sample, session in zip(samples, sessions, strict=True)
    ]


def measure_models_llamacpp(
    models: Sequence[torch.nn.Module],
    workloads: Sequence[Workload],
    dtype: str,
    threads: int = 1,
    reference: torch.nn.Module | None = None,
    **kwargs,
) -> list[list[Measurement]]:
    """``measure_gguf_grid`` of PyTorch models, written as GGUF of ``dtype`` first."""
    with tempfile.TemporaryDirectory(prefix="ac-llamacpp-") as tmp:
        directory = Path(tmp)
        paths = [write_timing_gguf(m, directory, f"m{i}", dtype) for i, m in enumerate(models)]
        ref_path = write_timing_gguf(reference, directory, "reference", dtype) \
            if reference is not None else None
        params = sum(p.numel() for p in reference.parameters()) if reference is not None else 0
        return measure_gguf_grid(paths, workloads, threads=threads, reference=ref_path,
                                 reference_params=params, **kwargs)


_REFERENCES: dict[tuple[str, str], Path] = {}


def reference_gguf(spec: ArchSpec | dict, dtype: str) -> Path:
    """The paired timing's reference (``timing_reference``: fixed random weights) as a GGUF
    of ``dtype``, written once per process and removed at exit: it is the same file for
    every model timed against one fit, and writing it took 5-10 s for SmolLM2's reference
    (8 layers and a 49k vocabulary), paid by each of the search's and the baseline's
    timings."""
    import atexit
    import json
    import shutil

    spec = spec if isinstance(spec, ArchSpec) else ArchSpec.model_validate(spec)
    key = (json.dumps(spec.model_dump(mode="json"), sort_keys=True), dtype)
    path = _REFERENCES.get(key)
    if path is None or not path.exists():
        directory = Path(tempfile.mkdtemp(prefix="ac-llamacpp-reference-"))
        atexit.register(shutil.rmtree, directory, True)
        path = _REFERENCES[key] = write_timing_gguf(timing_reference(spec), directory,
                                                    "reference", dtype)
    return path


def measure_gguf_as_fitted(path: str | Path, workload: Workload, cost_model, repeats: int = 5,
                           warmup: int = 1, seed: int = 0, threads: int | None = None):
    """``measure.measure_as_fitted`` for a GGUF file in llama.cpp: the fit's thread
    count and statistic, paired with the fit's reference (written as GGUF of the
    target's type) and scaled by the fit's reference times. Returns
    (Measurement, statistic name)."""
    fit = cost_model.fit
    target = cost_model.target
    threads = threads or (fit.threads if fit is not None else target.threads)
    paired = fit is not None and fit.timing == "paired" and fit.reference_spec
    reference = reference_gguf(fit.reference_spec, target.dtype) if paired else None
    measurement = measure_gguf_grid([Path(path)], [workload], threads=threads,
                                    repeats=repeats, warmup=warmup, seed=seed,
                                    progress=False, reference=reference)[0][0]
    scale = fit.reference_scale(workload) if paired else None
    if scale is not None:
        measurement = measurement.with_scale(scale, source="fit")
    return measurement, fitted_statistic(cost_model)
