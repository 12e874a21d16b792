"""Measuring a model in vLLM as it serves it (``cpu-local/vllm/fp32``, ``.../bf16``).

The model is served as users run vLLM: exported to nemotron-nas first
(``vllm_engine.export_for_vllm``, which refuses what vLLM cannot compute exactly),
then vLLM's OpenAI-compatible server from its own environment (``VllmServer``) in
the target's dtype, with room for ``batch`` sequences of ``isl + osl`` tokens. Its
defaults stay, but for eager mode (graph compilation adds about a minute to each
start on 2 cores and changes a step by a few percent).

Each round sends the workload's ``batch`` requests at once, ``isl`` random prompt
tokens and exactly ``osl`` output tokens each, streamed (``vllm_client``); vLLM's
scheduler batches them continuously.

Timed by vLLM's engine core (its per-request histograms in ``/metrics``, read
before and after each round), so a starved API server that streams several steps
in one chunk does not move the figures; what the client saw is in the report too.

- **TTFT**: a round's mean, over its requests, of the time from reaching the engine
  (queued) to the first token.
- **TPOT**: a round's mean of each request's (last token − first token) / (osl − 1),
  vLLM's own TPOT.
- **Logits**: one random prompt's log-probabilities from vLLM against PyTorch's for
  the same export (``logprob_difference``).
- **Memory**: the weights as vLLM holds them plus the KV-cache blocks the workload's
  sequences hold at their end (``VllmMemory.serving_bytes``), not the pool it
  reserves (``VLLM_CPU_KVCACHE_SPACE``, a setting).

The timing is absolute (monotonic) time, not paired with a reference: the engine
runs in processes of its own, where another model cannot be interleaved step by
step, so a busy machine shows in the figures.

A fit's probes and a validation's samples (``measure_models_vllm``) are served the same
way, one server per model with room for every workload timed in it; ``verify`` adds the
log-probability check.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch

from autocompress.costmodel.measure import Measurement
from autocompress.costmodel.workload import Workload
from autocompress.errors import AutoCompressError
from autocompress.export import load_nemotron_nas
from autocompress.hardware import RobustStat
from autocompress.progress import Bar
from autocompress.vllm_client import ServingReport, prompt_logprobs, serving_report, time_rounds
from autocompress.vllm_engine import VllmServer, export_for_vllm, on_cpus, vllm_python

KV_CACHE_GIB = 1  # the pool vLLM reserves; the workloads here use a few MiB of it
LOGITS_PROMPT_TOKENS = 16
FULL_VOCAB_UP_TO = 8192


class VllmReading(NamedTuple):
    """One session in vLLM: the Measurement, the serving percentiles (client and engine),
    and how far vLLM's log-probabilities are from PyTorch's for the same export."""

    measurement: Measurement
    serving: ServingReport
    logits: dict


@contextmanager
def serving(model_dir: str | Path, workloads: Sequence[Workload], dtype: str,
            log_dir: str | Path | None = None) -> Iterator[tuple[VllmServer, Path]]:
    """vLLM serving ``model_dir`` (exported to nemotron-nas first unless it is one) with
    room for every one of ``workloads``: (the server, the directory it serves)."""
    with tempfile.TemporaryDirectory(prefix="ac-vllm-") as tmp:
        served = export_for_vllm(model_dir, Path(tmp) / "nemotron-nas")
        with VllmServer(served, dtype=dtype,
                        max_model_len=max(w.isl + w.osl for w in workloads),
                        max_num_seqs=max(w.batch for w in workloads), kv_cache_gib=KV_CACHE_GIB,
                        max_logprobs=-1, log_dir=log_dir) as server:
            yield server, served


def time_workload(server: VllmServer, workload: Workload, *, repeats: int = 5,
                  warmup: int = 1, seed: int = 0) -> tuple[Measurement, ServingReport]:
    """``repeats`` timed rounds of the workload's requests (after ``warmup``) on a running
    server: the Measurement (engine timings, vLLM's memory) and the serving percentiles."""
    vocab = json.loads((server.model_dir / "config.json").read_text())["vocab_size"]
    with on_cpus(server.framework_cpus):
        timed = time_rounds(server, isl=workload.isl, osl=workload.osl, batch=workload.batch,
                            vocab_size=vocab, rounds=repeats, warmup=warmup, seed=seed)
    memory = server.memory()
    report = serving_report(timed, isl=workload.isl, osl=workload.osl, batch=workload.batch)
    kv_bytes = memory.serving_bytes(workload.final_context, workload.batch) \
        - memory.weights_bytes
    measurement = Measurement(
        workload=workload,
        ttft_ms=RobustStat.of([r.ttft_ms for r in timed.engine], unit="ms"),
        tpot_ms=RobustStat.of([r.tpot_ms for r in timed.engine], unit="ms"),
        memory_bytes=memory.weights_bytes + kv_bytes,
        memory_method="vllm-accounted",
        memory_detail={"weights": memory.weights_bytes, "kv_blocks": kv_bytes,
                       "kv_bytes_per_token": float(memory.kv_bytes_per_token),
                       "block_size": float(memory.block_size),
                       "server_start_s": server.started_s or 0.0},
        repeats=repeats,
        warmup=warmup,
        threads=len(server.worker_cpus) or 1,
        device=f"{server.device} (vLLM{', worker isolated' if server.framework_cpus else ''})",
    )
    return measurement, report


def measure_in_vllm(model_dir: str | Path, workload: Workload, dtype: str, *,
                    repeats: int = 5, warmup: int = 1, seed: int = 0,
                    log_dir: str | Path | None = None) -> VllmReading:
    """Serve ``model_dir`` in vLLM, time ``repeats`` rounds of the workload's requests
    (after ``warmup`` rounds) and compare one prompt's log-probabilities with PyTorch's."""
    with serving(model_dir, [workload], dtype, log_dir) as (server, served):
        measurement, report = time_workload(server, workload, repeats=repeats, warmup=warmup,
                                            seed=seed)
        logits = logprob_difference(server, served, seed)
    return VllmReading(measurement, report, logits)


def measure_models_vllm(models: Sequence[torch.nn.Module], workloads: Sequence[Workload],
                        dtype: str, *, repeats: int = 3, warmup: int = 1, seed: int = 0,
                        progress: bool = True, description: str = "measuring in vLLM",
                        reference: torch.nn.Module | None = None) -> list[list[Measurement]]:
    """Every model served by vLLM in turn, every workload timed in its server:
    ``result[w][m]`` (the grid ``costmodel.measure.measure_grid`` returns).

    One server per model, since a start (about 20 s here) costs more than its rounds; the
    models are timed one after another, not interleaved, so a machine whose load changes
    shows as scatter between them. ``reference`` must be None: vLLM's timing is absolute.
    """
    if reference is not None:
        raise AutoCompressError("vLLM cannot time a model in lockstep with a reference",
                                hint="time vLLM targets absolutely (paired=false)")
    vllm_python()  # not installed: one line saying how, before any model is written
    grid: list[list[Measurement]] = [[] for _ in workloads]
    with tempfile.TemporaryDirectory(prefix="ac-vllm-models-") as tmp, \
            Bar(description, len(models) * len(workloads), enabled=progress) as bar:
        for index, model in enumerate(models):
            directory = Path(tmp) / f"m{index}"
            model.save_pretrained(directory)
            with serving(directory, workloads, dtype) as (server, _):
                for row, workload in zip(grid, workloads, strict=True):
                    row.append(time_workload(server, workload, repeats=repeats, warmup=warmup,
                                             seed=seed + index)[0])
                    bar.advance()
            shutil.rmtree(directory)
    return grid


def logprob_difference(server: VllmServer, served: Path, seed: int = 0) -> dict:
    """The largest |log p| difference between vLLM and PyTorch (the export read by its own
    reader, fp32) over every position of a random prompt: the whole vocabulary where it
    is small, else each position's top 20 (the whole one is slow to send as JSON)."""
    model = load_nemotron_nas(served)
    vocab = model.config.vocab_size
    prompt = random.Random(seed).sample(range(vocab), LOGITS_PROMPT_TOKENS)
    top = -1 if vocab <= FULL_VOCAB_UP_TO else 20
    rows = prompt_logprobs(server, prompt, top=top)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].double()
    expected = torch.log_softmax(logits, -1)[:-1]
    diff = max(abs(value - expected[i, token].item())
               for i, row in enumerate(rows) for token, value in row.items())
    return {"max_abs_logprob_diff": diff, "prompt_tokens": LOGITS_PROMPT_TOKENS,
            "compared": "whole vocabulary" if top == -1 else f"top {top} per position",
            "reference": "PyTorch fp32 of the export"}
