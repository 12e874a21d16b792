"""Requests to a ``VllmServer`` over its OpenAI-compatible API, timed as a user sees them.

The standard library only (``http.client``), so the project's environment needs
nothing of vLLM's. Prompts are token ids (the completions API takes them), so a
request holds exactly ``isl`` prompt tokens; ``min_tokens = max_tokens = osl`` and
``ignore_eos`` make it generate exactly ``osl``; each streamed chunk names its token
ids (``return_token_ids``), so every token's arrival is known.

- **TTFT**: from sending a request to its first token's arrival.
- **TPOT** of a request: (its end-to-end latency − TTFT) / (osl − 1), as ``vllm bench
  serve`` defines it; reported as the mean, median, p90 and p99 over requests.
- **ITL**: the gaps between a request's token arrivals.
- **Throughput**: requests (and output tokens) per second of a round's wall time,
  pooled over rounds.

vLLM's engine times each request too (``engine_round``: its ``/metrics`` histograms
read before and after a round, timestamps taken by the engine core): TTFT from
reaching the engine to the first token, TPOT from first to last token. Those do not
move when the API server, starved of CPU, streams several steps in one chunk, which
the client's figures do on a busy machine.

A round sends ``batch`` requests at once (the workload convention: every prompt
arrives together), which vLLM's scheduler batches continuously; each round uses new
random prompts, so its prefix cache (on by default) finds nothing to reuse.

``prompt_logprobs`` asks for the log-probabilities vLLM computes for every prompt
position (``prompt_logprobs``, -1: the whole vocabulary), for equivalence checks
against PyTorch.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from autocompress.errors import AutoCompressError
from autocompress.vllm_engine import SERVED_NAME, VllmServer

REQUEST_TIMEOUT_S = 600.0


@dataclass
class RequestTiming:
    """One streamed request: when it was sent and when each of its tokens arrived."""

    sent: float
    arrivals: list[float] = field(default_factory=list)  # one per token (monotonic s)

    @property
    def tokens(self) -> int:
        return len(self.arrivals)

    @property
    def ttft_ms(self) -> float:
        return (self.arrivals[0] - self.sent) * 1000

    @property
    def e2e_ms(self) -> float:
        return (self.arrivals[-1] - self.sent) * 1000

    @property
    def tpot_ms(self) -> float:
        return (self.e2e_ms - self.ttft_ms) / (self.tokens - 1) if self.tokens > 1 else 0.0

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in itertools.pairwise(self.arrivals)]


class Distribution(BaseModel):
    """Mean, median and tail percentiles of one metric over requests (ms)."""

    mean: float
    median: float
    p90: float
    p99: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        data = np.asarray(values, dtype=float)
        return cls(mean=float(data.mean()), median=float(np.median(data)),
                   p90=float(np.percentile(data, 90)), p99=float(np.percentile(data, 99)),
                   n=len(data))


class ServingReport(BaseModel):
    """How vLLM served ``rounds`` rounds of ``batch`` concurrent requests: as the client saw
    each request, and as vLLM's engine timed each round (means over its requests)."""

    isl: int
    osl: int
    batch: int
    rounds: int
    engine_ttft_ms: Distribution  # over rounds
    engine_tpot_ms: Distribution
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution
    request_throughput: float  # requests per second
    output_throughput: float  # generated tokens per second
    duration_s: float  # wall time of the timed rounds together


# ------------------------------------------------------------------ vLLM's own clock

# vLLM's per-request histograms, timed by its engine core when a request finishes: the
# wait for scheduling, scheduling to first token, first to last token, and the latter
# over the tokens after the first (its TPOT).
ENGINE_HISTOGRAMS = {"queue": "vllm:request_queue_time_seconds",
                     "prefill": "vllm:request_prefill_time_seconds",
                     "tpot": "vllm:request_time_per_output_token_seconds"}
_SERIES = re.compile(r"^(vllm:[a-z_]+)_(sum|count)\{[^}]*\} ([0-9.eE+-]+)$", re.M)
METRICS_WAIT_S = 30.0


def engine_totals(server: VllmServer) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of ``ENGINE_HISTOGRAMS`` so far."""
    found: dict[str, dict[str, float]] = {}
    for name, kind, value in _SERIES.findall(server.metrics_text()):
        found.setdefault(name, {})[kind] = found.get(name, {}).get(kind, 0.0) + float(value)
    return {key: (found.get(name, {}).get("sum", 0.0), found.get(name, {}).get("count", 0.0))
            for key, name in ENGINE_HISTOGRAMS.items()}


@dataclass
class EngineRound:
    """One round as vLLM's engine timed it: means over its requests (ms)."""

    ttft_ms: float  # queue + prefill: arrival at the engine to the first token
    tpot_ms: float


def engine_round(server: VllmServer, before: dict[str, tuple[float, float]], requests: int
                 ) -> EngineRound:
    """The engine's figures for the ``requests`` that finished since ``before``."""
    deadline = time.monotonic() + METRICS_WAIT_S
    while True:  # the histograms are updated as the frontend handles the last outputs
        after = engine_totals(server)
        counts = {k: after[k][1] - before[k][1] for k in after}
        if all(c >= requests for c in counts.values()):
            break
        if time.monotonic() > deadline:
            raise AutoCompressError(f"vLLM's metrics count {counts} finished requests, not "
                                    f"{requests}", hint=f"see {server.service.log}")
        time.sleep(0.05)
    mean = {k: (after[k][0] - before[k][0]) / counts[k] * 1000 for k in after}
    return EngineRound(ttft_ms=mean["queue"] + mean["prefill"], tpot_ms=mean["tpot"])


# ------------------------------------------------------------------ one request


def _post(server: VllmServer, body: dict, timeout: float = REQUEST_TIMEOUT_S):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    connection.request("POST", "/v1/completions", body=json.dumps(body),
                       headers=server.headers())
    response = connection.getresponse()
    if response.status != 200:
        detail = response.read().decode(errors="replace")[:400]
        connection.close()
        raise AutoCompressError(f"vLLM answered {response.status}: {detail}",
                                hint=f"see the server's log at {server.service.log}")
    return connection, response


def completion_body(prompt: Sequence[int], osl: int, **extra) -> dict:
    """A greedy completion of exactly ``osl`` tokens for a prompt of token ids."""
    return {"model": SERVED_NAME, "prompt": [int(t) for t in prompt], "max_tokens": osl,
            "min_tokens": osl, "ignore_eos": True, "temperature": 0.0, **extra}


def stream_completion(server: VllmServer, prompt: Sequence[int], osl: int,
                      sent: float | None = None) -> RequestTiming:
    """Send one streamed completion and time each token's arrival."""
    body = completion_body(prompt, osl, stream=True, return_token_ids=True)
    timing = RequestTiming(sent=sent if sent is not None else time.monotonic())
    connection, response = _post(server, body)
    try:
        for line in iter(response.readline, b""):
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            arrived = time.monotonic()
            for choice in json.loads(line[6:]).get("choices", []):
                timing.arrivals += [arrived] * len(choice.get("token_ids") or [])
    finally:
        connection.close()
    if timing.tokens != osl:
        raise AutoCompressError(f"vLLM streamed {timing.tokens} tokens, not {osl}",
                                hint=f"see the server's log at {server.service.log}")
    return timing


# ------------------------------------------------------------------ rounds


def serve_round(server: VllmServer, prompts: Sequence[Sequence[int]], osl: int
                ) -> tuple[list[RequestTiming], float]:
    """Send every prompt at once (one thread each); (their timings, the round's wall s)."""
    results: list[RequestTiming | BaseException | None] = [None] * len(prompts)
    start = threading.Barrier(len(prompts) + 1)

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = stream_completion(server, prompts[i], osl)
        except BaseException as err:  # re-raised in the caller's thread
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    start.wait()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - began
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results, wall  # type: ignore[return-value]


def random_prompts(batch: int, isl: int, vocab_size: int, rng: random.Random,
                   avoid: Sequence[int] = ()) -> list[list[int]]:
    """``batch`` prompts of ``isl`` random token ids (special tokens left out)."""
    allowed = [t for t in range(vocab_size) if t not in set(avoid)]
    return [[rng.choice(allowed) for _ in range(isl)] for _ in range(batch)]


@dataclass
class Rounds:
    """Timed rounds: every request as the client saw it, each round as vLLM's engine timed
    it, and the rounds' wall time together (s)."""

    requests: list[RequestTiming]
    engine: list[EngineRound]
    duration_s: float


def time_rounds(server: VllmServer, *, isl: int, osl: int, batch: int, vocab_size: int,
                rounds: int = 3, warmup: int = 1, seed: int = 0, avoid: Sequence[int] = ()
                ) -> Rounds:
    """``rounds`` rounds of ``batch`` concurrent requests after ``warmup`` rounds."""
    if osl < 2:
        raise AutoCompressError("TPOT needs at least 2 output tokens", hint="use osl >= 2")
    rng = random.Random(seed)
    for _ in range(warmup):
        serve_round(server, random_prompts(batch, isl, vocab_size, rng, avoid), osl)
    timed = Rounds(requests=[], engine=[], duration_s=0.0)
    for _ in range(rounds):
        before = engine_totals(server)
        done, wall = serve_round(server, random_prompts(batch, isl, vocab_size, rng, avoid), osl)
        timed.engine.append(engine_round(server, before, batch))
        timed.requests += done
        timed.duration_s += wall
    return timed


def serving_report(timed: Rounds, *, isl: int, osl: int, batch: int) -> ServingReport:
    timings, duration = timed.requests, timed.duration_s
    return ServingReport(
        isl=isl, osl=osl, batch=batch, rounds=len(timed.engine),
        engine_ttft_ms=Distribution.of([r.ttft_ms for r in timed.engine]),
        engine_tpot_ms=Distribution.of([r.tpot_ms for r in timed.engine]),
        ttft_ms=Distribution.of([t.ttft_ms for t in timings]),
        tpot_ms=Distribution.of([t.tpot_ms for t in timings]),
        itl_ms=Distribution.of([gap for t in timings for gap in t.itl_ms]),
        e2e_ms=Distribution.of([t.e2e_ms for t in timings]),
        request_throughput=len(timings) / duration,
        output_throughput=sum(t.tokens for t in timings) / duration,
        duration_s=duration,
    )


def measure_serving(server: VllmServer, *, isl: int, osl: int, batch: int, vocab_size: int,
                    rounds: int = 3, warmup: int = 1, seed: int = 0,
                    avoid: Sequence[int] = ()) -> ServingReport:
    """Time ``rounds`` rounds of ``batch`` concurrent requests after ``warmup`` rounds."""
    timed = time_rounds(server, isl=isl, osl=osl, batch=batch, vocab_size=vocab_size,
                        rounds=rounds, warmup=warmup, seed=seed, avoid=avoid)
    return serving_report(timed, isl=isl, osl=osl, batch=batch)


# ------------------------------------------------------------------ log-probs


def prompt_logprobs(server: VllmServer, prompt: Sequence[int], top: int = -1
                    ) -> list[dict[int, float]]:
    """For each prompt position after the first, the log-probabilities vLLM gives the
    next token (``top`` most likely ones and the actual one; -1: the whole vocabulary,
    which the server must allow with ``max_logprobs=-1``)."""
    body = completion_body(prompt, 1, prompt_logprobs=top)
    connection, response = _post(server, body)
    try:
        answer = json.loads(response.read())
    finally:
        connection.close()
    positions = answer["choices"][0]["prompt_logprobs"]
    return [{int(token): entry["logprob"] for token, entry in position.items()}
            for position in positions[1:]]  # the first position has nothing before it
