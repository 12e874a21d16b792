"""The teacher's outputs, computed once and reused by every student that shares them.

Distilling from a 135M teacher on 2 CPU cores is dominated by the teacher's
forward pass, and every student distilled on the same data (the compressed
model, the Minitron baseline, a sweep, a re-run) asks the teacher the same
questions. So the teacher's next-token distribution on each training batch is
stored once, compactly: for every position the top-``k`` log-probabilities
(at the distillation temperature) with their token ids, plus the log of the
probability mass left in the tail.

The KL is then taken between the two distributions collapsed to ``k + 1``
outcomes (the teacher's top-k tokens and "anything else"). By the data
processing inequality it never exceeds the full KL, and it equals it when the
tail is empty (``k`` = vocabulary); with ``k`` = 64 of 49k tokens the tail of
a trained model holds a few percent of the mass.

Layout: ``$AUTOCOMPRESS_HOME/teacher-outputs/<key>/shard-NNNNN.safetensors``
where ``key`` hashes the teacher's identity, the data (the token windows and
how batches are drawn from them), ``k`` and the temperature. A shard holds
``SHARD_STEPS`` consecutive optimizer steps and is written to a temp name and
renamed, so a shard is complete or absent; a longer token budget extends the
same cache. Tensors only (safetensors), never a pickle.

A shard's header also records a sha256 of its tensors' bytes, and every read
checks it: a flipped byte would otherwise train a different student without a
word. A shard that fails the check is deleted and computed again (with a note);
hashing a shard costs a few milliseconds, against seconds of teacher forward
passes to rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from autocompress.atomic import atomic_path, remove_path, write_json_atomic
from autocompress.errors import AutoCompressError

FORMAT_VERSION = 1
SHARD_STEPS = 8


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's values (its dtype and shape included)."""
    data = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode())
    digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def model_digest(model: torch.nn.Module) -> str:
    """sha256 of a model's parameters and buffers (names, shapes and values)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor_digest(tensor).encode())
    return digest.hexdigest()


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over named tensors (names, dtypes, shapes and bytes), in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensor_digest(tensors[name]).encode())
    return digest.hexdigest()


def read_verified_shard(path: Path, key_digest: str) -> dict[str, torch.Tensor] | None:
    """A shard's tensors if it belongs to ``key_digest`` and its bytes match its hash.

    None when it is missing, unreadable, from another cache key, or written
    before content hashes were recorded; raises nothing (the caller rebuilds).
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
            if meta.get("digest") != key_digest or "content" not in meta:
                return None
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except Exception:  # noqa: BLE001 - any unreadable shard is simply rebuilt
        return None
    return tensors if tensors_digest(tensors) == meta["content"] else None


class TeacherOutputs:
    """Top-k teacher log-probabilities per training step, on disk, filled on demand."""

    def __init__(self, root: Path, key: dict, batch_fn: Callable[[int], torch.Tensor],
                 topk: int, temperature: float):
        self.key = key
        self.digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        self.dir = Path(root) / self.digest[:32]
        self.batch_fn = batch_fn
        self.topk = topk
        self.temperature = temperature
        self._shard: tuple[int, dict[str, torch.Tensor]] | None = None
        self.built_steps = 0
        self.build_seconds = 0.0

    def ensure(self, teacher: torch.nn.Module, steps: int, device: torch.device,
               progress: Callable[[int, int], None] | None = None) -> None:
        """Compute and store every missing shard up to ``steps`` optimizer steps."""
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest = self.dir / "key.json"
        if not manifest.exists():
            write_json_atomic(manifest, self.key, indent=1, sort_keys=True)
        n_shards = -(-steps // SHARD_STEPS)
        for shard in range(n_shards):
            if self._valid(shard):
                continue
            started = time.perf_counter()
            first = shard * SHARD_STEPS
            parts = [self._teacher_step(teacher, self.batch_fn(step), device)
                     for step in range(first, first + SHARD_STEPS)]
            tensors = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
            with atomic_path(self._path(shard)) as tmp:
                save_file(tensors, str(tmp), metadata={"digest": self.digest,
                                                       "content": tensors_digest(tensors)})
            self.built_steps += SHARD_STEPS
            self.build_seconds += time.perf_counter() - started
            if progress:
                progress(shard + 1, n_shards)

    @torch.no_grad()
    def _teacher_step(self, teacher, batch: torch.Tensor, device) -> dict[str, torch.Tensor]:
        logits = teacher(input_ids=batch.to(device), use_cache=False).logits.float()
        logp = F.log_softmax(logits / self.temperature, dim=-1)
        values, indices = logp.topk(self.topk, dim=-1)
        # log of the mass outside the top k (-inf when k covers the vocabulary).
        tail = torch.log((1 - values.exp().sum(-1)).clamp(min=0))
        return {"tokens": batch.to(torch.int32).cpu(), "values": values.half().cpu(),
                "indices": indices.to(torch.int32).cpu(), "tail": tail.cpu()}

    def _path(self, shard: int) -> Path:
        return self.dir / f"shard-{shard:05d}.safetensors"

    def _valid(self, shard: int) -> bool:
        """True for a shard on disk that passes its content check; a failing one is
        deleted (with a one-line note) so that ``ensure`` computes it again."""
        path = self._path(shard)
        if not path.exists():
            return False
        if read_verified_shard(path, self.digest) is not None:
            return True
        print(f"note: teacher-output shard {path} does not match its content hash "
              "(corrupt, or from an older version); discarded and rebuilt",
              file=sys.stderr, flush=True)
        remove_path(path)
        return False

    def rows(self, step: int, start: int, count: int) -> dict[str, torch.Tensor]:
        """Rows ``start .. start+count`` of step ``step``'s batch (the shard is hash-checked
        when it is read)."""
        shard, offset = divmod(step, SHARD_STEPS)
        if self._shard is None or self._shard[0] != shard:
            tensors = read_verified_shard(self._path(shard), self.digest)
            if tensors is None:  # changed on disk after ``ensure`` checked it
                raise AutoCompressError(
                    f"teacher-output shard {self._path(shard)} changed during the run "
                    "(its content hash no longer matches)",
                    f"re-run the command; the shard is rebuilt (or delete {self.dir})")
            self._shard = (shard, tensors)
        tensors = self._shard[1]
        per_step = tensors["tokens"].shape[0] // SHARD_STEPS
        lo = offset * per_step + start
        return {name: t[lo:lo + count] for name, t in tensors.items()}


def cached_kd_loss(student_logits: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
                   tail: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher ‖ student) over the teacher's top-k tokens + the tail, × T², per token.

    ``values``: the teacher's top-k log-probabilities at temperature T;
    ``indices``: their token ids; ``tail``: log of the teacher's remaining mass.
    """
    t = temperature
    vocab = student_logits.shape[-1]
    log_q = F.log_softmax(student_logits.float().reshape(-1, vocab) / t, dim=-1)
    idx = indices.reshape(-1, indices.shape[-1]).long()
    log_p = values.reshape(idx.shape).float()
    log_p_tail = tail.reshape(-1).float()
    log_q_top = log_q.gather(-1, idx)
    log_q_tail = torch.logsumexp(log_q.scatter(-1, idx, float("-inf")), dim=-1)
    top = (log_p.exp() * (log_p - log_q_top)).sum(-1)
    # An empty teacher tail contributes nothing (0 · log 0 = 0), whatever the student's.
    has_tail = torch.isfinite(log_p_tail)
    rest = torch.where(has_tail, log_p_tail.exp() * (log_p_tail - log_q_tail.clamp(min=-80.0)),
                       torch.zeros_like(log_p_tail))
    return (top + rest).mean() * (t * t)

