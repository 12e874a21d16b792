"""Progress of a counted loop, shown the same way everywhere.

A rich bar on a terminal; elsewhere (logs, CI, a flow's worker) a plain line each
tenth of the way (or every ``every`` steps), since a bar redrawn into a log file is
noise; nothing at all when disabled or when ``AUTOCOMPRESS_QUIET`` is set (tests).
"""

from __future__ import annotations

import os
import sys


class Bar:
    """``with Bar("search", 160) as bar: ... bar.update(step, "kl 0.31")``."""

    def __init__(self, description: str, total: int, enabled: bool = True,
                 completed: int = 0, every: int | None = None, transient: bool = False):
        self.description, self.total = description, max(1, total)
        self.completed, self.every = completed, every
        self.quiet = not enabled or bool(os.environ.get("AUTOCOMPRESS_QUIET"))
        self.last_line: int | None = None
        self.bar = None
        if not self.quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                transient=transient)
            self.bar.start()
            self.task = self.bar.add_task(description, total=self.total, completed=completed,
                                          info="")

    def update(self, completed: int, info: str = "") -> None:
        """``completed`` steps done; ``info`` is shown beside the count."""
        self.completed = completed
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=info)
            return
        if self.quiet:
            return
        mark = completed // self.every if self.every else completed * 10 // self.total
        if mark != self.last_line or completed == self.total:
            self.last_line = mark
            print(f"[{self.description}] {completed}/{self.total} {info}".rstrip(), flush=True)

    def advance(self, steps: int = 1, info: str = "") -> None:
        self.update(self.completed + steps, info)

    def note(self, text: str) -> None:
        """A line of its own (above the bar on a terminal)."""
        if self.bar is not None:
            self.bar.console.print(f"[{self.description}] {text}")
        elif not self.quiet:
            print(f"[{self.description}] {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
