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
user's files are not deleted by accident. Symbolic links are resolved before
that check, an output is never one of the command's inputs (``check_not_input``),
and the directory is claimed with an advisory lock (``claim_output``) so that a
second run into it is refused at its start, not after its work. A temporary left
by a killed process is removed by the next write to the same name.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autocompress.errors import AutoCompressError

__all__ = [
    "atomic_path",
    "check_not_input",
    "check_out_dir",
    "check_out_file",
    "claim_output",
    "fsync_tree",
    "publish_dir",
    "publishing_dir",
    "release_output",
    "remove_path",
    "remove_stale_temporaries",
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but belongs to someone else
        return True
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporaries of ``path`` that a killed process left behind.

    ``temp_sibling`` names carry the writer's pid: a ``.NAME.tmp-PID-*`` whose
    process is gone is garbage (a SIGKILL skips every ``finally``), so the next
    write to ``path`` deletes it. A ``.NAME.old-PID-*`` (the previous content,
    renamed aside during a publish) is removed only when ``path`` itself exists,
    since otherwise it is the only copy left.
    """
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.stem)}\.(tmp|old)-(\d+)-[0-9a-f]{{8}}"
                         rf"{re.escape(path.suffix)}$")
    removed = []
    try:
        siblings = list(path.parent.iterdir())
    except OSError:  # no parent yet: nothing to clean
        return removed
    for sibling in siblings:
        match = pattern.match(sibling.name)
        if match is None or _pid_alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and not path.exists():
            continue
        remove_path(sibling)
        removed.append(sibling)
    return removed


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


def _umask() -> int:
    try:  # Linux states it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def normalize_permissions(root: str | Path) -> None:
    """Give every file under ``root`` the permissions of a normally created file.

    Some writers (transformers' ``save_pretrained`` writes weights through a
    private temporary file) leave ``0600`` files: a published model would then
    hold a ``model.safetensors`` only its owner can read, beside ``0644``
    siblings. Files become ``0666`` minus the umask, keeping their execute bits.
    """
    wanted = 0o666 & ~_umask()
    root = Path(root)
    paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    for path in paths:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode & 0o777
        if mode | wanted != mode:
            path.chmod(mode | wanted)


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
    remove_stale_temporaries(path)
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
    """Write ``data`` as strict JSON (non-JSON values as ``str``, NaN/±inf as ``null``)
    atomically, newline-terminated: ``Infinity`` and ``NaN`` are not JSON, and other
    tools refuse files holding them."""
    text = json.dumps(finite_json(data), indent=indent, sort_keys=sort_keys, default=str,
                      allow_nan=False)
    return write_text_atomic(path, text + "\n")


def finite_json(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, ±inf) replaced by None (JSON ``null``)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite_json(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite_json(value) for value in data]
    return data


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
    Symbolic links are followed first, so the rules apply to what would really
    be replaced. The directory is then claimed for this process (``claim_output``)
    until it is published. Call it before long work, so a run does not fail at
    the end. Returns the resolved path.
    """
    out = _resolved(out)
    if out.exists() and not out.is_dir():
        raise AutoCompressError(f"--out {out} exists and is a file, not a directory",
                                "pass a directory path that does not exist yet")
    if out.exists():
        reason = _protected(out)
        if reason is not None:
            raise AutoCompressError(f"refusing to write the output into {out}: {reason}",
                                    "pass a new directory, e.g. --out ./compressed")
        if any(out.iterdir()) and not overwrite:
            raise AutoCompressError(f"--out {out} exists and is not empty",
                                    "pass another --out, or --overwrite to replace it")
    claim_output(out)
    return out


def check_out_file(out: str | Path, flag: str = "--out", example: str = "result.json") -> Path:
    """Refuse a file output that names an existing directory (before any work).

    Symbolic links are followed first; returns the resolved path.
    """
    out = _resolved(out)
    if out.is_dir():
        raise AutoCompressError(f"{flag} {out} is a directory; a file name is needed here",
                                f"e.g. {flag} {out / example}")
    if out.parent.exists() and not out.parent.is_dir():
        raise AutoCompressError(f"{flag} {out}: {out.parent} is a file, not a directory",
                                f"pass a {flag} path inside a directory")
    return out


def check_not_input(out: str | Path, *inputs: str | Path, flag: str = "--out") -> None:
    """Refuse an output that is one of the command's inputs, inside one, or holds one.

    ``export --model M --out M --overwrite`` would otherwise delete the model it
    is reading (and the records kept beside it). Links are resolved first.
    """
    target = _resolved(out)
    for source in inputs:
        if source is None or not Path(source).exists():
            continue  # a named teacher or hub id: not a path the output can hit
        src = _resolved(source)
        if target == src or src in target.parents or target in src.parents:
            raise AutoCompressError(
                f"{flag} {out} would replace the input {source} (an input is never its own "
                "output)", f"pass a {flag} outside {src}")


def _resolved(path: str | Path) -> Path:
    """``path`` with ``~`` expanded and every symbolic link followed (dangling ones too)."""
    return Path(os.path.realpath(Path(path).expanduser()))


# ---------------------------------------------------------------- output locks

# Outputs this process has claimed: resolved path -> (lock file, its open descriptor).
_CLAIMS: dict[Path, tuple[Path, int]] = {}


def _lock_file(out: Path) -> Path:
    # Beside the output, not inside it: the output may not exist yet and is replaced whole.
    return out.with_name(f".{out.name}.lock")


def claim_output(out: str | Path) -> None:
    """Take an advisory lock (``fcntl.flock``) on an output or work directory.

    A second process asking for the same directory is refused at once, before
    its work, with exit code 2. The lock belongs to this process: claiming again
    is a no-op, and it ends at ``release_output`` or when the process exits
    (a killed run never leaves a stale lock behind).
    """
    out = _resolved(out)
    if out in _CLAIMS or os.environ.get("RANK", "0") != "0":
        return  # under torchrun the other ranks are the same run: rank 0 holds the lock
    lock = _lock_file(out)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AutoCompressError(
                f"another run is writing into {out} (it holds {lock})",
                "wait for it to finish, or pass another --out") from None
        # The holder before us may have deleted the file between our open and our
        # lock: then we hold a lock on a name nobody sees, so try again.
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            _CLAIMS[out] = (lock, fd)
            return
        os.close(fd)


@atexit.register
def _release_all() -> None:
    # A run that stops with an error leaves no lock file behind (a SIGKILL does, but
    # its lock is released by the kernel and the next claim takes the file over).
    for out in list(_CLAIMS):
        release_output(out)


def release_output(out: str | Path) -> None:
    """End this process's claim on ``out`` (nothing if it holds none)."""
    claim = _CLAIMS.pop(_resolved(out), None)
    if claim is None:
        return
    lock, fd = claim
    lock.unlink(missing_ok=True)  # while still locked, so no one else is mid-claim on it
    os.close(fd)


def publish_dir(src: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Move the finished directory ``src`` (a sibling of ``out``) to ``out``.

    ``src`` is fsynced first. An existing ``out`` is checked again
    (``check_out_dir``), renamed aside, replaced, and only then deleted — if
    the process dies between the two renames, the old content is still on disk
    as ``.NAME.old-*`` next to it.
    """
    src = Path(src)
    out = check_out_dir(out, overwrite)
    normalize_permissions(src)
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
    release_output(out)
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
    remove_stale_temporaries(out)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        yield tmp
        publish_dir(tmp, out, overwrite=overwrite)
    finally:
        remove_path(tmp)
        release_output(out)  # written or failed: this process is done with ``out``
