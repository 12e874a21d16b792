"""A code corpus that exists on every machine: the Python standard library.

The running interpreter's standard library (without its test suites and
generated tables) is real code written by others, which suits the "local
coding" workload. Each file goes to train / calibration / held-out by a stable
hash of its relative path, so the split never depends on file order or on which
other files exist. A manifest records every file's sha256 and a fingerprint of
the whole corpus, so models and scores can name the exact data they saw.

Users with a network can pass any ``datasets`` source instead (a hub id or local
json/parquet/text files); rows are split by a hash of their id the same way.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from autocompress.atomic import atomic_path, check_not_input, check_out_dir, release_output
from autocompress.errors import AutoCompressError
from autocompress.paths import default_corpus_dir

Split = Literal["train", "calibration", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "calibration", "heldout")

# Buckets out of 100 for the hash split: 90% train, 4% calibration, 6% held-out.
_SPLIT_BUCKETS = {"train": range(0, 90), "calibration": range(90, 94), "heldout": range(94, 100)}

# Folders of the standard library that are tests, generated data or vendored
# binaries rather than hand-written code.
_EXCLUDED_DIRS = {
    "test", "tests", "idle_test", "site-packages", "lib-dynload", "__pycache__",
    "encodings", "pydoc_data", "ensurepip", "unittest/test", "lib2to3/tests",
}
_MAX_FILE_BYTES = 300_000  # a few huge generated modules would dominate otherwise


class Document(BaseModel):
    """One source file (or one row of a ``datasets`` source)."""

    path: str
    text: str


class FileEntry(BaseModel):
    path: str
    split: Split
    bytes: int
    sha256: str


class CorpusManifest(BaseModel):
    """What went into the corpus; ``fingerprint`` names it in lineage records."""

    source: str
    fingerprint: str
    num_files: dict[str, int]
    num_bytes: dict[str, int]
    files: list[FileEntry]


def split_of(key: str) -> Split:
    """The split a document belongs to, from a stable hash of its key."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100
    return next(name for name, rng in _SPLIT_BUCKETS.items() if bucket in rng)


def _stdlib_documents() -> Iterator[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(p in _EXCLUDED_DIRS for p in parts[:-1]) or parts[-1].startswith("test_"):
            continue
        if path.stat().st_size > _MAX_FILE_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield Document(path=rel, text=text)


def _datasets_documents(source: str, text_column: str = "text") -> Iterator[Document]:
    """Rows of any ``datasets`` source: a hub id, or local data files."""
    import datasets

    local = Path(source)
    if local.exists():
        files = [str(p) for p in sorted(local.rglob("*"))] if local.is_dir() else [str(local)]
        suffix = Path(files[0]).suffix.lstrip(".") if files else "json"
        builder = {"jsonl": "json", "txt": "text"}.get(suffix, suffix)
        ds = datasets.load_dataset(builder, data_files=files, split="train")
    else:
        ds = datasets.load_dataset(source, split="train")
    if text_column not in ds.column_names:
        raise AutoCompressError(
            f"{source} has no '{text_column}' column (columns: {ds.column_names})",
            "pass --text-column with the column that holds the text",
        )
    for i, row in enumerate(ds):
        yield Document(path=str(row.get("path", row.get("id", i))), text=row[text_column])


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_atomic(path: Path, lines: Iterable[str]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")


def build_corpus(
    out_dir: Path | None = None, source: str | None = None, text_column: str = "text"
) -> CorpusManifest:
    """Collect, split and write the corpus as ``<split>.jsonl`` + ``manifest.json``.

    The manifest is written last, so a directory without one is never trusted.
    ``out_dir`` follows the output rule of every command (``check_corpus_out``).
    """
    out_dir = check_corpus_out(out_dir or default_corpus_dir(), source)
    try:
        return _build_corpus(out_dir, source, text_column)
    finally:
        release_output(out_dir)


# What ``build_corpus`` writes into a corpus directory (and what it may replace there).
_CORPUS_ENTRIES = {*(f"{split}.jsonl" for split in SPLITS), "manifest.json", "tokens"}


def check_corpus_out(out_dir: str | Path, source: str | None = None) -> Path:
    """The corpus directory, once it is clear that writing there loses nothing.

    New, empty, or a corpus this command wrote (a valid manifest and only the
    corpus's own files): fine, it is rebuilt. Anything else, such as a folder of
    the user's that happens to hold a ``train.jsonl``, is refused before any work,
    as are the working directory, ``~``, a file, and the ``--source`` itself.
    Returns the resolved directory, claimed for this process (``claim_output``).
    """
    if source is not None:
        check_not_input(out_dir, source)
    out = Path(out_dir).expanduser()
    if out.is_dir() and any(out.iterdir()) and not _is_corpus_dir(out):
        others = sorted(entry.name for entry in out.iterdir())[:3]
        raise AutoCompressError(
            f"--out {out} holds files that are not a corpus written by `autocompress data "
            f"prepare` (e.g. {', '.join(others)}); nothing was changed",
            "pass a new or empty directory (a corpus directory of ours is rebuilt in place)")
    out = check_out_dir(out, overwrite=out.is_dir())
    out.mkdir(parents=True, exist_ok=True)
    return out


def _is_corpus_dir(path: Path) -> bool:
    """True when ``path`` holds nothing but a corpus written by ``build_corpus``."""
    names = {entry.name for entry in path.iterdir()}
    if not names or not names <= _CORPUS_ENTRIES or "manifest.json" not in names:
        return False
    try:
        CorpusManifest.model_validate_json((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def _build_corpus(out_dir: Path, source: str | None, text_column: str) -> CorpusManifest:
    docs = list(_stdlib_documents() if source is None else _datasets_documents(source, text_column))
    if not docs:
        raise AutoCompressError(
            f"the corpus source {source or 'stdlib'} has no documents",
            "point --source at a dataset or files with text in them",
        )
    by_split: dict[str, list[Document]] = {s: [] for s in SPLITS}
    entries = []
    for doc in docs:
        split = split_of(doc.path)
        by_split[split].append(doc)
        size = len(doc.text.encode())
        entries.append(FileEntry(path=doc.path, split=split, bytes=size, sha256=_sha(doc.text)))
    empty = [s for s, d in by_split.items() if not d]
    if empty:
        raise AutoCompressError(
            f"the corpus is too small: split(s) {', '.join(empty)} got no documents",
            "use a source with more files (splits are 90/4/6 by a hash of the path)",
        )
    for split, split_docs in by_split.items():
        _write_atomic(out_dir / f"{split}.jsonl", (d.model_dump_json() for d in split_docs))
    ordered = sorted(entries, key=lambda e: e.path)
    fingerprint = _sha("\n".join(f"{e.path}\t{e.sha256}" for e in ordered))
    manifest = CorpusManifest(
        source=source or "python-stdlib",
        fingerprint=fingerprint,
        num_files={s: len(d) for s, d in by_split.items()},
        num_bytes={s: sum(len(x.text.encode()) for x in d) for s, d in by_split.items()},
        files=entries,
    )
    _write_atomic(out_dir / "manifest.json", [manifest.model_dump_json(indent=1)])
    return manifest


def load_manifest(corpus_dir: Path) -> CorpusManifest:
    path = Path(corpus_dir) / "manifest.json"
    if not path.exists():
        raise AutoCompressError(
            f"no corpus at {corpus_dir} (manifest.json missing)",
            "build it with `autocompress data prepare`",
        )
    return CorpusManifest.model_validate_json(path.read_text())


def load_documents(corpus_dir: Path | None, split: Split) -> list[Document]:
    """The documents of one split, in a stable order, checked against the manifest.

    The manifest's fingerprint names the data in caches and lineage, so a split
    file that no longer holds exactly the documents the manifest lists (edited,
    replaced, truncated) is refused rather than used under the old name.
    """
    corpus_dir = Path(corpus_dir or default_corpus_dir())
    manifest = load_manifest(corpus_dir)  # refuses a half-written corpus
    if split not in SPLITS:
        raise AutoCompressError(f"unknown split '{split}'", f"use one of {', '.join(SPLITS)}")
    path = corpus_dir / f"{split}.jsonl"
    try:
        with path.open(encoding="utf-8") as fh:
            docs = [Document(**json.loads(line)) for line in fh if line.strip()]
    except (OSError, ValueError, TypeError) as err:
        raise _changed(path, f"unreadable: {type(err).__name__}") from None
    expected = {e.path: e.sha256 for e in manifest.files if e.split == split}
    found = {d.path: _sha(d.text) for d in docs}
    if found != expected or len(docs) != len(expected):
        differ = sorted(p for p in expected.keys() | found.keys()
                        if expected.get(p) != found.get(p))
        raise _changed(path, f"{len(differ)} document(s) differ from the manifest, "
                             f"e.g. {differ[0] if differ else 'a duplicate'!r}")
    return docs


def check_corpus(corpus_dir: Path) -> CorpusManifest:
    """The manifest, once every split has been checked against it."""
    for split in SPLITS:
        load_documents(corpus_dir, split)
    return load_manifest(corpus_dir)


def _changed(path: Path, detail: str) -> AutoCompressError:
    return AutoCompressError(
        f"corpus file {path} does not match its manifest.json ({detail})",
        f"rebuild the corpus with `autocompress data prepare --out {path.parent}` "
        "(or restore the file)",
    )


def ensure_corpus(corpus_dir: Path | None = None) -> Path:
    """Build the default corpus if it is not there yet; return its directory."""
    corpus_dir = Path(corpus_dir or default_corpus_dir())
    if not (corpus_dir / "manifest.json").exists():
        build_corpus(corpus_dir)
    return corpus_dir
