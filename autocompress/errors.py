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
