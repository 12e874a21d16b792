"""`make test`: the whole suite as two pytest runs at once, the timed tests undisturbed.

Tests marked ``serial`` (the served story, the joint-targets flows) hold a tiny model to a
limit timed on this CPU: the pick the search timed under its limit must still read under
it at verify, and a core taken by another test makes it read over. They run in one pytest
process at normal priority. All the other tests run at the same time on pytest-xdist
workers at the lowest priority, so the timed tests get a core whenever they want one, and
the others use what the timed ones leave idle (the served story spends much of its time
waiting for servers, workers and a schedule).

The lowest priority takes two settings on Linux: the nice value of the processes, and
that of their session's *autogroup*. Where autogroups are on (the default of most
distributions, see sched(7)), the kernel first shares the CPU between sessions, and nice
values only count within one session; the served stack runs in sessions of its own, so
nice alone would leave the two pytest runs sharing the cores evenly.

Run as ``python tests/run_suite.py [--workers N]`` from the repository root (the
Makefile's ``test`` target). The exit status is the first non-zero of the two runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
LOWEST = 19  # the largest nice value


def lowest_priority() -> None:
    """In the child, before it runs pytest: the lowest priority, for it and its session."""
    try:  # a new session has its own autogroup (start_new_session made one)
        Path("/proc/self/autogroup").write_text(str(LOWEST))
    except OSError:
        pass  # no autogroups (or not Linux): the nice value below is all it takes
    os.nice(LOWEST)


def parallel_argv(workers: int) -> list[str]:
    """The tests not marked serial, on ``workers`` xdist workers (0: in one process).

    A module's tests stay together on one worker (``--dist loadfile``: its fixtures are
    built once); the slow files start first, longest first, in the order
    tests/conftest.py sets (xdist's own reorder would put the files with most tests first).
    """
    return [*PYTEST, "-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder",
            "-m", "not serial"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="xdist workers of the tests not marked serial (0: one process)")
    args = parser.parse_args()
    with tempfile.TemporaryFile("w+") as serial_log:
        # In a session of its own: the terminal's Ctrl-C reaches the serial run only, and
        # is passed on below, so both runs stop and tear their fixtures down.
        parallel = subprocess.Popen(parallel_argv(args.workers), start_new_session=True,
                                    preexec_fn=lowest_priority)
        serial = subprocess.Popen([*PYTEST, "-m", "serial"], stdout=serial_log,
                                  stderr=subprocess.STDOUT)
        try:
            codes = [parallel.wait(), serial.wait()]
        except KeyboardInterrupt:
            os.killpg(parallel.pid, signal.SIGINT)
            codes = [parallel.wait(), serial.wait()]
        serial_log.seek(0)
        print("\n---------- the tests marked serial (run beside the others, at normal "
              "priority) ----------", flush=True)
        print(serial_log.read(), end="", flush=True)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
