"""llama.cpp as a measured engine: load a GGUF, run token ids, read what it allocates.

Through ``llama-cpp-python``'s C API (``llama_decode`` on explicit batches), not
its high-level ``Llama`` class, so that a timed step is one engine call and
nothing else, and so that ``batch`` sequences share one decode call (llama.cpp's
multi-sequence batches: every token carries its sequence id; each sequence has
its own positions and KV cells).

``EngineSession(path, n_ctx=, n_seq=, threads=, kv_type=, flash_attn=)`` owns a model and a
context; ``prefill(prompts)`` decodes ``n_seq`` prompts in one call (logits of
each last token), ``decode(tokens)`` one token per sequence, ``logits(ids)`` the
logits of every position of one sequence (for equivalence tests), ``clear()``
empties the KV cache. Exactness: flash attention (the engine's default on the
CPU) computes in f16 inside (max |Δ logit| ≈ 1e-2 on logits of ≈ 6 measured
here) and the default f16 KV cache rounds K and V; with ``flash_attn=False`` and
``kv_type="f32"`` an f32 GGUF matches PyTorch to ≈ 1e-5. ``memory`` is what the
engine reported allocating at load (model, KV, output and compute buffers), read
from its log lines.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from autocompress.errors import AutoCompressError

# ggml_type values of the KV cache types the engine accepts here.
KV_TYPES = {"f32": 0, "f16": 1}
_FIX = ("run `make venv` (it builds llama-cpp-python==0.3.36 with portable CPU flags, "
        "see the Makefile's LLAMA_CMAKE_ARGS; ~5 min on 2 cores the first time)")
_BUFFER = re.compile(r"(model|KV|output|compute) buffer size\s*=\s*([0-9.]+) MiB")
MIB = 1024 * 1024


def llama_cpp_module():
    """The ``llama_cpp`` module, or a one-line AutoCompressError saying how to get it."""
    try:
        import llama_cpp
    except ImportError as err:
        raise AutoCompressError(f"the llama.cpp engine is not installed ({err})",
                                hint=_FIX) from None
    except OSError as err:  # the shared library failed to load (wrong CPU, missing libs)
        raise AutoCompressError(f"the llama.cpp engine cannot be loaded: {err}",
                                hint="rebuild it with portable flags: " + _FIX) from None
    return llama_cpp


def engine_available() -> bool:
    try:
        llama_cpp_module()
    except AutoCompressError:
        return False
    return True


class EngineMemory(BaseModel):
    """Bytes the engine allocated, by buffer, as its log reported them (MiB, 2 decimals)."""

    model: float = 0.0
    kv: float = 0.0
    output: float = 0.0
    compute: float = 0.0

    @property
    def total(self) -> float:
        return self.model + self.kv + self.output + self.compute


# --------------------------------------------------------------- logging

_log_lock = threading.Lock()
_log_lines: list[str] | None = None
_callback = None


def _install_logger(llama_cpp) -> None:
    """Route the engine's log into ``_log_lines`` while capturing; silent otherwise."""
    global _callback
    if _callback is not None:
        return

    @llama_cpp.llama_log_callback
    def callback(level, text, user_data):  # noqa: ARG001 - C signature
        if _log_lines is not None and text:
            _log_lines.append(text.decode("utf-8", "replace"))

    _callback = callback  # keep a reference: ctypes callbacks die with their object
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def _memory_from_log(lines: Sequence[str]) -> EngineMemory:
    sizes = {"model": 0.0, "KV": 0.0, "output": 0.0, "compute": 0.0}
    for line in "".join(lines).splitlines():
        match = _BUFFER.search(line)
        if match:
            sizes[match.group(1)] += float(match.group(2)) * MIB
    return EngineMemory(model=sizes["model"], kv=sizes["KV"], output=sizes["output"],
                        compute=sizes["compute"])


# --------------------------------------------------------------- session


class EngineSession:
    """A GGUF model and one llama.cpp context (see the module docstring)."""

    def __init__(self, path: str | Path, *, n_ctx: int, n_seq: int = 1, threads: int = 1,
                 kv_type: str = "f16", n_batch: int | None = None,
                 all_logits: bool = False, flash_attn: bool | None = None,
                 n_outputs: int | None = None) -> None:
        global _log_lines
        lib = llama_cpp_module()
        self._lib = lib
        path = Path(path)
        if not path.is_file():
            raise AutoCompressError(f"no GGUF file at {path}",
                                    hint="export one with `autocompress export --format gguf`")
        if kv_type not in KV_TYPES:
            raise AutoCompressError(f"unknown KV cache type {kv_type!r}",
                                    hint=f"use one of {', '.join(KV_TYPES)}")
        if n_seq > lib.llama_max_parallel_sequences():
            raise AutoCompressError(
                f"batch {n_seq} exceeds llama.cpp's {lib.llama_max_parallel_sequences()} "
                "parallel sequences", hint="use a smaller batch")
        _install_logger(lib)
        n_batch = n_batch or n_ctx
        with _log_lock:
            _log_lines = []
            try:
                self._open(path, n_ctx, n_seq, threads, kv_type, n_batch,
                           n_batch if all_logits else n_outputs, flash_attn)
            except AutoCompressError as err:
                errors = [line.strip() for line in _log_lines if "error" in line.lower()]
                if errors:
                    err.message = f"{err.message}: {errors[-1]}"
                    err.args = (err.message,)
                raise
            finally:
                lines, _log_lines = _log_lines, None
        self.memory = _memory_from_log(lines)
        self.n_seq, self.n_ctx, self.threads = n_seq, n_ctx, threads
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        self._batches: dict[tuple, object] = {}
        self._positions = [0] * n_seq

    def _open(self, path, n_ctx, n_seq, threads, kv_type, n_batch, n_outputs,
              flash_attn) -> None:
        lib = self._lib
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.use_mmap = False  # weights in the model buffer, as reported
        self._model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise AutoCompressError(f"llama.cpp could not load {path}",
                                    hint="re-export it with `autocompress export --format gguf`")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_batch, cparams.n_ubatch)
        cparams.n_seq_max = n_seq
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.type_k = cparams.type_v = KV_TYPES[kv_type]
        if n_outputs:  # rows of logits the compute buffer is sized for (default n_batch)
            cparams.n_outputs_max = n_outputs
        if flash_attn is not None:  # None: the engine's default (auto: on for the CPU)
            cparams.flash_attn_type = int(flash_attn)
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise AutoCompressError(f"llama.cpp could not create a context for {path}",
                                    hint="lower the context length or the batch")

    # ------------------------------------------------------------ batches
    def _batch(self, key: tuple, tokens: Sequence[Sequence[int]], positions: Sequence[int],
               last_only: bool):
        """A filled ``llama_batch`` (cached by ``key`` when the tokens repeat)."""
        cached = self._batches.get(key) if key else None
        if cached is not None:
            return cached
        lib = self._lib
        total = sum(len(seq) for seq in tokens)
        batch = lib.llama_batch_init(total, 0, max(1, len(tokens)))
        i = 0
        for seq_id, (seq, start) in enumerate(zip(tokens, positions, strict=True)):
            for j, token in enumerate(seq):
                batch.token[i] = int(token)
                batch.pos[i] = start + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq_id
                batch.logits[i] = (j == len(seq) - 1) if last_only else 1
                i += 1
        batch.n_tokens = total
        if key:
            self._batches[key] = batch
        return batch

    def _run(self, batch) -> None:
        status = self._lib.llama_decode(self._ctx, batch)
        if status != 0:
            raise AutoCompressError(f"llama.cpp failed to decode a batch (status {status})",
                                    hint="the context is too small for the workload")

    def _row(self, index: int) -> np.ndarray:
        pointer = self._lib.llama_get_logits_ith(self._ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    # ------------------------------------------------------------- public
    def prepare_prefill(self, prompts: Sequence[Sequence[int]]):
        """A batch of ``n_seq`` prompts from position 0 (kept, reused, freed on close)."""
        key = ("prefill", tuple(tuple(int(t) for t in seq) for seq in prompts))
        return self._batch(key, prompts, [0] * len(prompts), last_only=True)

    def prefill(self, batch, lengths: Sequence[int]) -> list[int]:
        """Decode a prepared prompt batch; returns each sequence's greedy next token."""
        self._run(batch)
        self._positions = list(lengths)
        ends = np.cumsum(lengths) - 1
        return [int(np.argmax(self._row(int(end)))) for end in ends]

    def decode(self, tokens: Sequence[int]) -> list[int]:
        """One step: one token per sequence at its next position; greedy next tokens."""
        batch = self._batch(("step", len(tokens)), [[0]] * len(tokens), [0] * len(tokens),
                            last_only=True)
        for i, token in enumerate(tokens):
            batch.token[i] = int(token)
            batch.pos[i] = self._positions[i]
        self._run(batch)
        self._positions = [p + 1 for p in self._positions]
        return [int(np.argmax(self._row(i))) for i in range(len(tokens))]

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits ``[len(ids), vocab]`` of one sequence from an empty cache."""
        self.clear()
        batch = self._batch((), [ids], [0], last_only=False)
        try:
            self._run(batch)
            return np.stack([self._row(i).copy() for i in range(len(ids))])
        finally:
            self._lib.llama_batch_free(batch)

    def clear(self) -> None:
        """Empty the KV cache of every sequence."""
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self._ctx), True)
        self._positions = [0] * self.n_seq

    def close(self) -> None:
        lib = self._lib
        for batch in self._batches.values():
            lib.llama_batch_free(batch)
        self._batches.clear()
        if getattr(self, "_ctx", None):
            lib.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lib.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> EngineSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
