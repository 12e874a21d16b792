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
