"""Tokenized, packed splits and deterministic batches.

A split is tokenized once, documents joined by EOS, cut into ``seq_len``
windows, and cached on disk as a ``datasets.Dataset`` keyed by the corpus
fingerprint and the tokenizer's hash. Batches are a pure function of
``(seed, step)``: resuming a run at step k sees exactly the batches an
uninterrupted run would, with no iterator state to save.

The cache is verified whenever it is read: ``meta.json`` records a sha256 over
the cache's other files (the arrow data and its schema), and a cache whose
files no longer hash to it is deleted and tokenized again, with a note. The
key alone would trust a cache whose token ids were changed after it was made.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from autocompress.atomic import publishing_dir, remove_path
from autocompress.data.corpus import Split, load_documents, load_manifest
from autocompress.errors import AutoCompressError


def tokenizer_hash(tokenizer) -> str:
    """A content hash of a tokenizer (vocab + merges + special tokens)."""
    blob = tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer") else ""
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cache_dir(corpus_dir: Path, tokenizer, split: str, seq_len: int) -> Path:
    fingerprint = load_manifest(corpus_dir).fingerprint[:16]
    key = f"{split}-{seq_len}-{fingerprint}-{tokenizer_hash(tokenizer)}"
    return Path(corpus_dir) / "tokens" / key


def cache_content_hash(cache: Path) -> str:
    """sha256 over a cache directory's files (names and bytes), ``meta.json`` left out."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(cache).rglob("*") if p.is_file()):
        rel = path.relative_to(cache).as_posix()
        if rel == "meta.json":
            continue
        digest.update(f"{rel}\0".encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _cache_is_intact(cache: Path) -> bool:
    """True when ``cache`` exists and its files still hash to what ``meta.json`` recorded."""
    try:
        meta = json.loads((cache / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("content_sha256") == cache_content_hash(cache)


def packed_split(tokenizer, corpus_dir: Path, split: Split, seq_len: int):
    """The split as a ``datasets.Dataset`` of ``seq_len``-token windows (cached, checked)."""
    import datasets

    cache = _cache_dir(corpus_dir, tokenizer, split, seq_len)
    if cache.exists():
        if _cache_is_intact(cache):
            return datasets.load_from_disk(str(cache))
        print(f"note: the tokenized cache {cache} does not match its content hash (changed, "
              "or from an older version); discarded and rebuilt", file=sys.stderr, flush=True)
        remove_path(cache)
    docs = load_documents(corpus_dir, split)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for doc in docs:
        ids.extend(tokenizer(doc.text, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    n = len(ids) // seq_len
    if n == 0:
        raise AutoCompressError(
            f"the {split} split has {len(ids)} tokens, fewer than one window of {seq_len}",
            "use a larger corpus or a shorter seq_len (a --config setting)",
        )
    windows = np.asarray(ids[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    ds = datasets.Dataset.from_dict({"input_ids": windows})
    with publishing_dir(cache, overwrite=True) as tmp:  # never half a cache
        ds.save_to_disk(str(tmp))
        meta = {"tokens": n * seq_len, "docs": len(docs), "content_sha256": cache_content_hash(tmp)}
        (tmp / "meta.json").write_text(json.dumps(meta))
    return datasets.load_from_disk(str(cache))


class PackedTokens:
    """Token windows of one split, in memory, with deterministic batching."""

    def __init__(self, tokenizer, corpus_dir: Path, split: Split, seq_len: int):
        ds = packed_split(tokenizer, Path(corpus_dir), split, seq_len)
        self.windows = torch.from_numpy(np.asarray(ds["input_ids"], dtype=np.int64))
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.windows.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.windows.numel()

    def batch_at(self, step: int, batch_size: int, seed: int = 0) -> torch.Tensor:
        """Batch number ``step`` of an endless shuffled stream (epochs reshuffle)."""
        n = len(self)
        out = []
        for pos in range(step * batch_size, (step + 1) * batch_size):
            epoch, idx = divmod(pos, n)
            perm = self._permutation(seed, epoch)
            out.append(self.windows[perm[idx]])
        return torch.stack(out)

    def _permutation(self, seed: int, epoch: int) -> torch.Tensor:
        cached = getattr(self, "_perm_cache", None)
        if cached is None or cached[0] != (seed, epoch):
            gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
            self._perm_cache = ((seed, epoch), torch.randperm(len(self), generator=gen))
        return self._perm_cache[1]


def token_batches(
    tokenizer,
    corpus_dir: Path,
    split: Split,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
    seed: int = 0,
) -> Iterator[torch.Tensor]:
    """Deterministic batches ``LongTensor[batch_size, seq_len]`` of one split.

    With ``max_batches`` None it walks the split once (no repeats).
    """
    data = PackedTokens(tokenizer, corpus_dir, split, seq_len)
    total = len(data) // batch_size if max_batches is None else max_batches
    for step in range(total):
        yield data.batch_at(step, batch_size, seed)
