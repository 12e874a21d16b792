"""Held-out language-modelling metrics: bits per byte, next-token accuracy, loss.

- **Bits per byte** runs through lm-eval's ``loglikelihood_rolling`` over chunks
  of held-out files (≤ ``chunk_bytes`` each, cut at line ends, chosen in a
  seeded order up to a byte budget). Each chunk is scored from its first token,
  conditioned on the EOS/BOS prefix token only, in disjoint windows of the
  evaluation context length (lm-eval's convention). Bits per byte divides by
  UTF-8 bytes, so models with different tokenizers compare fairly. lm-eval
  reports no stderr for it; we compute one over chunks (ratio estimator,
  delta method) from the logged per-chunk log-likelihoods.
- **Next-token accuracy** and **held-out loss** are computed directly with
  torch over packed held-out token windows (``autocompress.data.tokens``):
  argmax accuracy and mean cross-entropy of every next token. Their stderr treats
  each window as one sample (tokens within a window are correlated).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel

from autocompress.atomic import write_text_atomic
from autocompress.data.corpus import Document
from autocompress.errors import AutoCompressError


def heldout_chunks(docs: Sequence[Document], max_bytes: int, chunk_bytes: int = 4096,
                   seed: int = 0) -> list[str]:
    """Chunks of held-out files, in a seeded order, up to ``max_bytes`` in total."""
    chunks = []
    for doc in sorted(docs, key=lambda d: d.path):
        current: list[str] = []
        size = 0
        for line in doc.text.splitlines(keepends=True):
            n = len(line.encode())
            if current and size + n > chunk_bytes:
                chunks.append("".join(current))
                current, size = [], 0
            current.append(line)
            size += n
        if current:
            chunks.append("".join(current))
    chunks = [c for c in chunks if c.strip()]
    random.Random(f"bpb:{seed}").shuffle(chunks)
    picked, total = [], 0
    for chunk in chunks:
        if total >= max_bytes:
            break
        picked.append(chunk)
        total += len(chunk.encode())
    return picked


def write_chunks(chunks: Sequence[str], out_dir: Path) -> Path:
    """Chunks as ``heldout-bpb-<hash>.jsonl`` rows ``{text}`` (atomic, reused if present)."""
    digest = hashlib.sha256("\0".join(chunks).encode()).hexdigest()[:16]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"heldout-bpb-{digest}.jsonl"
    if not path.exists():
        write_text_atomic(path, "".join(json.dumps({"text": c}) + "\n" for c in chunks))
    return path


def bits_per_byte_from_samples(samples: Sequence[dict]) -> tuple[float, float | None, int]:
    """``(bits/byte, stderr, bytes)`` from lm-eval's logged rolling samples.

    Each sample holds ``bits_per_byte = (loglikelihood, bytes)`` of one chunk.
    The estimate is Σ(−ll) / (ln 2 · Σ bytes); its stderr comes from the delta
    method for a ratio of sums over independent chunks.
    """
    pairs = [s["bits_per_byte"] for s in samples]
    nll = [-float(ll) / math.log(2) for ll, _ in pairs]
    nbytes = [float(b) for _, b in pairs]
    total = sum(nbytes)
    bpb = sum(nll) / total
    n = len(pairs)
    if n < 2:
        return bpb, None, int(total)
    mean_bytes = total / n
    resid = sum((y - bpb * x) ** 2 for y, x in zip(nll, nbytes, strict=True)) / (n - 1)
    return bpb, math.sqrt(resid / n) / mean_bytes, int(total)


class TokenMetrics(BaseModel):
    """Next-token metrics over held-out windows (stderr across windows)."""

    loss: float
    loss_stderr: float | None
    accuracy: float
    accuracy_stderr: float | None
    tokens: int
    windows: int
    window_loss: list[float] = []  # per window, in order (the per-item scores)


_WINDOW_CACHE: dict[tuple, torch.Tensor] = {}


def heldout_windows(tokenizer, corpus_dir: Path, seq_len: int, num_windows: int,
                    seed: int = 0) -> torch.Tensor:
    """``num_windows`` packed held-out windows, chosen by a seeded permutation.

    Fewer are returned when the split is smaller; the same arguments always
    give the same windows. Kept in memory (a few entries), since the search
    calls ``heldout_loss`` many times with the same arguments.
    """
    from autocompress.data.corpus import load_manifest
    from autocompress.data.tokens import PackedTokens, tokenizer_hash

    key = (load_manifest(Path(corpus_dir)).fingerprint, tokenizer_hash(tokenizer), seq_len,
           num_windows, seed)
    if key not in _WINDOW_CACHE:
        data = PackedTokens(tokenizer, Path(corpus_dir), "heldout", seq_len)
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(data), generator=gen)[:num_windows]
        if len(_WINDOW_CACHE) >= 4:
            _WINDOW_CACHE.pop(next(iter(_WINDOW_CACHE)))
        _WINDOW_CACHE[key] = data.windows[order]
    return _WINDOW_CACHE[key]


def _stderr(values: torch.Tensor) -> float | None:
    n = values.numel()
    return float(values.std(unbiased=True) / math.sqrt(n)) if n > 1 else None


@torch.inference_mode()
def window_scores(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 8,
                  progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window of ``windows`` [N, T]: mean next-token cross-entropy and argmax accuracy.

    The per-item scores of the held-out split (paired comparisons resample windows).
    """
    if windows.numel() == 0 or windows.shape[1] < 2:
        raise AutoCompressError("no held-out tokens to evaluate on",
                                "check the corpus (`autocompress data prepare`)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    losses, accs = [], []
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start:start + batch_size].to(device)
        logits = model(input_ids=batch).logits[:, :-1].float()
        target = batch[:, 1:]
        ce = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        losses.append(ce.mean(dim=1).cpu())
        accs.append((logits.argmax(-1) == target).float().mean(dim=1).cpu())
        if progress is not None:
            progress()
    model.train(was_training)
    return torch.cat(losses), torch.cat(accs)


def token_metrics(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 8,
                  progress=None) -> TokenMetrics:
    """Mean next-token cross-entropy and argmax accuracy over ``windows`` [N, T]."""
    loss, acc = window_scores(model, windows, batch_size, progress)
    return TokenMetrics(
        loss=float(loss.mean()), loss_stderr=_stderr(loss),
        accuracy=float(acc.mean()), accuracy_stderr=_stderr(acc),
        tokens=int(windows.shape[0] * (windows.shape[1] - 1)), windows=int(windows.shape[0]),
        window_loss=[round(float(x), 6) for x in loss],
    )


def heldout_loss(model: torch.nn.Module, tokenizer, corpus_dir: Path | None = None,
                 max_batches: int = 8, seq_len: int = 256, batch_size: int = 8,
                 seed: int = 0) -> float:
    """Mean next-token cross-entropy (nats) on the held-out split.

    Deterministic (the same windows every call for the same arguments) and fast
    (``max_batches · batch_size`` windows of ``seq_len`` tokens), so the search
    and the pruning comparisons can call it often.
    """
    from autocompress.paths import default_corpus_dir

    corpus_dir = Path(corpus_dir or default_corpus_dir())
    windows = heldout_windows(tokenizer, corpus_dir, seq_len, max_batches * batch_size, seed)
    return token_metrics(model, windows, batch_size).loss
