"""Atomic writes: the one place where files and directories are put in place.

Every artifact AutoCompress writes is first written to a hidden temporary
sibling (same directory, so the final ``rename`` never crosses a file system),
flushed to disk with ``fsync``, and only then renamed over its final name; the
parent directory is fsynced so the rename itself survives a power cut. A reader
therefore sees the old content or the new one, never half a file, and a crash
leaves at most a hidden ``.NAME.tmp-*`` sibling that nobody trusts.

Output directories chosen by the user follow one rule (``check_out_dir``): an
existing non-empty directory is replaced only with ``--overwrite``, and never
the working directory, one of its parents, the home directory or ``/`` — a
user's files are not deleted by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autocompress.errors import AutoCompressError

__all__ = [
    "atomic_path",
    "check_out_dir",
    "check_out_file",
    "fsync_tree",
    "publish_dir",
    "publishing_dir",
    "remove_path",
    "temp_sibling",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


def temp_sibling(path: str | Path, tag: str = "tmp") -> Path:
    """A unique hidden name next to ``path`` that keeps its suffix (``.x.tmp-ab12.png``).

    Keeping the suffix matters for writers that pick a format from it
    (matplotlib, safetensors); the random part keeps concurrent writers apart.
    """
    path = Path(path)
    return path.with_name(f".{path.stem}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes a rename/creation inside ``path`` durable; not every file system allows it.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory under ``root`` (or ``root`` itself if a file)."""
    root = Path(root)
    if root.is_file():
        _fsync_file(root)
        return
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                _fsync_file(path)
        _fsync_dir(Path(dirpath))


def remove_path(path: str | Path) -> None:
    """Remove a file, link or directory tree if present (for our own temporaries)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling to write ``path`` through; put it in place on success.

    For writers that want a file name (``torch.save``, ``fig.savefig``,
    ``save_file``)::

        with atomic_path(out) as tmp:
            fig.savefig(tmp)

    On an exception the temporary is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        yield tmp
        fsync_tree(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        remove_path(tmp)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temp file, fsync and rename."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2,
                      sort_keys: bool = False) -> Path:
    """Write ``data`` as JSON (non-JSON values as ``str``) atomically, newline-terminated."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=str)
    return write_text_atomic(path, text + "\n")


# ---------------------------------------------------------------- directories


def _protected(out: Path) -> str | None:
    """Why ``out`` may never be replaced, or None."""
    resolved = out.expanduser().resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        return "it is the working directory or one of its parents"
    if resolved == Path.home().resolve() or resolved == Path(resolved.anchor):
        return "it is the home or root directory"
    return None


def check_out_dir(out: str | Path, overwrite: bool = False) -> Path:
    """Refuse an output directory that would replace something the user did not ask to.

    Missing or empty: fine. Non-empty: only with ``overwrite``. A file, the
    working directory (``--out .``), a parent of it, ``~`` or ``/``: never.
    Call it before long work, so a run does not fail at the end.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AutoCompressError(f"--out {out} exists and is a file, not a directory",
                                "pass a directory path that does not exist yet")
    if not out.exists():
        return out
    reason = _protected(out)
    if reason is not None:
        raise AutoCompressError(f"refusing to write the output into {out}: {reason}",
                                "pass a new directory, e.g. --out ./compressed")
    if any(out.iterdir()) and not overwrite:
        raise AutoCompressError(f"--out {out} exists and is not empty",
                                "pass another --out, or --overwrite to replace it")
    return out


def check_out_file(out: str | Path) -> Path:
    """Refuse a file output that names an existing directory (before any work)."""
    out = Path(out)
    if out.is_dir():
        raise AutoCompressError(f"--out {out} is a directory; a file name is needed here",
                                f"e.g. --out {out / 'arch.json'}")
    return out


def publish_dir(src: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Move the finished directory ``src`` (a sibling of ``out``) to ``out``.

    ``src`` is fsynced first. An existing ``out`` is checked again
    (``check_out_dir``), renamed aside, replaced, and only then deleted — if
    the process dies between the two renames, the old content is still on disk
    as ``.NAME.old-*`` next to it.
    """
    src, out = Path(src), Path(out)
    check_out_dir(out, overwrite)
    fsync_tree(src)
    old = None
    if out.exists():
        if any(out.iterdir()):
            old = temp_sibling(out, "old")
            os.replace(out, old)
        else:
            out.rmdir()
    os.replace(src, out)
    _fsync_dir(out.parent)
    if old is not None:
        remove_path(old)
    return out


@contextmanager
def publishing_dir(out: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory next to ``out``; publish it there on success.

    ::

        with publishing_dir(out_dir, overwrite=overwrite) as tmp:
            model.save_pretrained(tmp)

    Refuses up front what ``check_out_dir`` refuses; on an exception the
    temporary is removed and ``out`` is left as it was.
    """
    out = check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        yield tmp
        publish_dir(tmp, out, overwrite=overwrite)
    finally:
        remove_path(tmp)
