"""Progress of a counted loop and of a flow's stages, shown the same way everywhere.

On a terminal a loop is one live rich line (what, bar, count, rate, time left) that goes
away when the loop ends, so the next stage's line takes its place. In a log (CI, ``|
tee``, a flow's worker) a bar redrawn is noise: a loop prints at most one line per
``LOG_EVERY_S`` of its work, and a short loop none. A flow's stage prints one line when it
ends (and, in a log, one when it starts: a log has no live line saying what runs).
Nothing at all when disabled or when ``AUTOCOMPRESS_QUIET`` is set (tests).
"""

from __future__ import annotations

import os
import sys
import time

LOG_EVERY_S = 10.0  # in a log, at most one progress line per this much work


def quiet() -> bool:
    """Whether progress is off for this process (``AUTOCOMPRESS_QUIET``: the test suite)."""
    return bool(os.environ.get("AUTOCOMPRESS_QUIET"))


def live() -> bool:
    """Whether progress can be redrawn in place: stdout is a terminal. Stdout, not stderr,
    since rich draws its bar there and the stage lines go there too: under ``| tee`` (stdout
    a pipe, stderr still the terminal) a rich bar would print nothing at all into the log."""
    return sys.stdout.isatty()


class Bar:
    """``with Bar("search", 160) as bar: ... bar.update(step, "kl 0.31")``."""

    def __init__(self, description: str, total: int, enabled: bool = True,
                 completed: int = 0, clock=time.monotonic):
        self.description, self.total = description, max(1, total)
        self.completed = self.first = completed
        self.quiet = not enabled or quiet()
        self.clock = clock
        self.started = self.last_line = clock()
        self.bar = None
        if not self.quiet and live():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task(description, total=self.total, completed=completed,
                                          info="", rate="")

    def update(self, completed: int, info: str = "") -> None:
        """``completed`` steps done; ``info`` is shown beside the count."""
        self.completed = completed
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=info, rate=self._rate())
            return
        now = self.clock()
        if self.quiet or now - self.last_line < LOG_EVERY_S:
            return
        self.last_line = now
        print(f"[{self.description}] {completed}/{self.total} {info}".rstrip()
              + f" ({self._rate()}{self._left()})", flush=True)

    def _rate(self) -> str:
        elapsed = self.clock() - self.started
        done = self.completed - self.first
        if elapsed <= 0 or done <= 0:
            return ""
        per_s = done / elapsed
        return f"{per_s:.3g}/s" if per_s >= 1 else f"{1 / per_s:.3g} s each"

    def _left(self) -> str:
        elapsed, done = self.clock() - self.started, self.completed - self.first
        if done <= 0 or self.completed >= self.total:
            return ""
        return f", about {elapsed / done * (self.total - self.completed):.0f} s left"

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


def stage_started(name: str) -> None:
    """In a log, one line as a flow's stage starts (a terminal shows its live bar)."""
    if not quiet() and not live():
        print(f"{name} ...", flush=True)


def stage_ended(name: str, state: str, seconds: float, where: str = "") -> None:
    """One line as a flow's stage ends: ``name: done in 12.3 s``, ``name: cached``
    (nothing ran), ``name: failed after 3.1 s``."""
    if quiet():
        return
    took = {"Completed": f"done in {seconds:.1f} s", "Cached": "cached"}.get(
        state, f"{state.lower()} after {seconds:.1f} s")
    print(f"{name}: {took}{where}", flush=True)
