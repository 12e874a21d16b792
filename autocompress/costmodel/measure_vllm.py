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
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from autocompress.costmodel.measure import Measurement
from autocompress.costmodel.workload import Workload
from autocompress.export import load_nemotron_nas
from autocompress.hardware import RobustStat
from autocompress.vllm_client import ServingReport, prompt_logprobs, serving_report, time_rounds
from autocompress.vllm_engine import VllmServer, export_for_vllm

KV_CACHE_GIB = 1  # the pool vLLM reserves; the workloads here use a few MiB of it
LOGITS_PROMPT_TOKENS = 16
FULL_VOCAB_UP_TO = 8192
_CORES = re.compile(r"local_rank=0, core ids=\[([0-9, ]+)\]")


class VllmReading(NamedTuple):
    """One session in vLLM: the Measurement, the serving percentiles (client and engine),
    and how far vLLM's log-probabilities are from PyTorch's for the same export."""

    measurement: Measurement
    serving: ServingReport
    logits: dict


def measure_in_vllm(model_dir: str | Path, workload: Workload, dtype: str, *,
                    repeats: int = 5, warmup: int = 1, seed: int = 0,
                    log_dir: str | Path | None = None) -> VllmReading:
    """Serve ``model_dir`` in vLLM, time ``repeats`` rounds of the workload's requests
    (after ``warmup`` rounds) and compare one prompt's log-probabilities with PyTorch's."""
    with tempfile.TemporaryDirectory(prefix="ac-vllm-") as tmp:
        served = export_for_vllm(model_dir, Path(tmp) / "nemotron-nas")
        config = json.loads((served / "config.json").read_text())
        with VllmServer(served, dtype=dtype, max_model_len=workload.isl + workload.osl,
                        max_num_seqs=workload.batch, kv_cache_gib=KV_CACHE_GIB,
                        max_logprobs=-1, log_dir=log_dir) as server:
            timed = time_rounds(
                server, isl=workload.isl, osl=workload.osl, batch=workload.batch,
                vocab_size=config["vocab_size"], rounds=repeats, warmup=warmup, seed=seed)
            logits = logprob_difference(server, served, seed)
            memory = server.memory()
            cores = _last_cores(server.log_text())
            started = server.started_s or 0.0
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
                       "block_size": float(memory.block_size), "server_start_s": started},
        repeats=repeats,
        warmup=warmup,
        threads=cores,
        device="cpu (vLLM)",
    )
    return VllmReading(measurement, report, logits)


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


def _last_cores(log: str) -> int:
    """The cores vLLM's worker computes on (it binds its OpenMP threads to them)."""
    found = _CORES.findall(log)
    return len(found[-1].split(",")) if found else 1
