"""An optional machine-wide lock around timings (``AUTOCOMPRESS_TIMING_LOCK=<file>``).

Two timings at once on one machine disturb each other, while the rest of a run
(search, distillation, evaluation) only adds load that paired timing absorbs. With
the variable set, the timings of a compression run (the search's measured loop and
the baseline's candidate timing, ``search.measured.measure_spec``, and ``verify``)
hold an exclusive ``flock`` on that file while they time. Fitting and validating a
cost model do not take it: run those under ``flock <file>`` as a whole. The
``flock`` command takes the same lock, so a run wrapped in ``flock <file> ...`` by
someone else and these timings never overlap. Do not wrap a run that sets the
variable in ``flock`` on the same file: it would wait for itself. Unset (the
default): no lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from autocompress.errors import AutoCompressError

VARIABLE = "AUTOCOMPRESS_TIMING_LOCK"


@contextmanager
def timing_lock() -> Iterator[None]:
    """Hold the lock named by ``AUTOCOMPRESS_TIMING_LOCK`` (if set) for the block."""
    path = os.environ.get(VARIABLE)
    if not path:
        yield
        return
    try:
        handle = open(path, "a")  # noqa: SIM115 - held for the block, closed below
    except OSError as err:
        raise AutoCompressError(f"cannot open the timing lock {path}: {err.strerror}",
                                hint=f"unset {VARIABLE} or point it at a writable file") from err
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
