"""One exception type for every user-facing failure.

The CLI prints ``error: <message>`` and, when present, ``hint: <what to do>`` on
one line each and exits with code 2, never a bare stack trace. Library code
raises it whenever the cause is the user's input (a path, a config, a limit),
not a bug in AutoCompress.
"""

from __future__ import annotations


class AutoCompressError(Exception):
    """A problem the user can fix; ``hint`` says how."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


def invalid_input(err: Exception, what: str, hint: str | None = None) -> AutoCompressError:
    """A pydantic ``ValidationError`` as one line naming each bad field and value."""
    problems = []
    for item in getattr(err, "errors", lambda: [])():
        where = ".".join(str(p) for p in item.get("loc", ())) or what
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"{where}: {message} (got {item.get('input')!r})")
    detail = "; ".join(problems[:3]) or str(err).splitlines()[0]
    return AutoCompressError(f"invalid {what}: {detail}",
                             hint or "see --help for the accepted values")


# ---------------------------------------------------------------- exit codes

EXIT_OK = 0
EXIT_LIMIT_MISSED = 1  # verify: a measured limit missed; lineage: an artifact mismatch
EXIT_USAGE = 2  # bad input the user can fix (AutoCompressError)
EXIT_INTERNAL = 3  # a bug in AutoCompress: one line here, the traceback in a log file

# errno values that mean "the disk said no", not "the code is wrong": the user fixes
# them (free space, pick a writable directory), so they are usage errors, not crashes.
_DISK_PROBLEMS = {
    "ENOSPC": "the disk is full",
    "EDQUOT": "the disk quota is exhausted",
    "EFBIG": "the file is larger than this process may write (ulimit -f)",
    "EROFS": "the file system is read-only",
    "EACCES": "permission denied",
    "EPERM": "operation not permitted",
}


def from_os_error(err: BaseException) -> AutoCompressError | None:
    """A disk-full / read-only / permission error as a one-line usage error, else None.

    An ``OSError`` says so by its errno; libraries written in Rust or C++
    (safetensors, tokenizers) wrap it in their own exception with the text
    ``(os error N)``, which is read too.
    """
    import errno
    import re

    code = getattr(err, "errno", None) if isinstance(err, OSError) else None
    if code is None:
        found = re.search(r"os error (\d+)", str(err))
        code = int(found.group(1)) if found else -1
    name = errno.errorcode.get(code, "")
    cause = _DISK_PROBLEMS.get(name)
    if cause is None:
        return None
    where = getattr(err, "filename", None) or "an output file"
    hint = ("free some space (the previous output was left as it was) or write elsewhere"
            if name in ("ENOSPC", "EDQUOT", "EFBIG") else
            "make it writable, or point AUTOCOMPRESS_HOME / --out at a writable directory")
    return AutoCompressError(f"cannot write {where}: {cause}", hint)


def write_crash_log(err: BaseException) -> str:
    """Write ``err``'s traceback to a log file and return its path (for exit code 3).

    The log goes to ``$AUTOCOMPRESS_HOME/logs`` and, where that is not writable,
    to the system's temporary directory, so that the pointer always leads somewhere.
    """
    import os
    import tempfile
    import time
    import traceback
    from pathlib import Path

    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    home = os.environ.get("AUTOCOMPRESS_HOME") or str(Path.home() / ".cache" / "autocompress")
    for folder in (Path(home) / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(text)
            return str(path)
        except OSError:
            continue
    return "(no writable log directory; traceback lost)"
