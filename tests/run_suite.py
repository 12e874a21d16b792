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
nice alone would leave the two pytest runs sharing the cores evenly. Where autogroups are
on but cannot be niced (a read-only /proc), the two runs go one after the other instead.

Both runs share one Prefect test server (a temporary database), started here at normal
priority while the runs collect their tests, instead of one per pytest process (each
takes ~13 CPU-seconds to start): ``tests/conftest.py``'s ``prefect_server`` uses the one
named in ``AUTOCOMPRESS_TEST_PREFECT_API_URL`` and starts its own only without it.

Run as ``python tests/run_suite.py [--workers N]`` from the repository root (the
Makefile's ``test`` target). The exit status is the first non-zero of the two runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
LOWEST = 19  # the largest nice value
SHARED_PREFECT_ENV = "AUTOCOMPRESS_TEST_PREFECT_API_URL"  # read by tests/conftest.py
TESTS = Path(__file__).resolve().parent


def lowest_priority() -> None:
    """In the child, before it runs pytest: the lowest priority, for it and its session."""
    try:  # a new session has its own autogroup (start_new_session made one)
        Path("/proc/self/autogroup").write_text(str(LOWEST))
    except OSError:
        pass  # no autogroups (or not Linux): the nice value below is all it takes
    os.nice(LOWEST)


def sessions_share_evenly() -> bool:
    """Whether autogroups are on and this process may not nice one: then nice values alone
    would leave the two runs sharing the cores evenly (a read-only /proc, say)."""
    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False
    return enabled and not os.access("/proc/self/autogroup", os.W_OK)


def parallel_argv(workers: int) -> list[str]:
    """The tests not marked serial, on ``workers`` xdist workers (0: in one process).

    A module's tests stay together on one worker (``--dist loadfile``: its fixtures are
    built once); the slow files start first, longest first, in the order
    tests/conftest.py sets (xdist's own reorder would put the files with most tests first).
    """
    return [*PYTEST, "-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder",
            "-m", "not serial"]


def serial_files() -> list[str]:
    """The test files that mark a test ``serial``, found by their text: the serial run
    collects only these (importing every test module costs a run ~10 CPU-seconds).
    tests/test_run_suite.py checks the list against the marks pytest collects."""
    return [str(path) for path in sorted(TESTS.glob("test_*.py"))
            if "pytest.mark.serial" in path.read_text(encoding="utf-8")]


def serial_argv() -> list[str]:
    """The tests marked serial, in this one process's order (tests/conftest.py's)."""
    return [*PYTEST, "-m", "serial", *serial_files()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def shared_prefect_server() -> Iterator[str]:
    """A Prefect server on a temporary sqlite database, as Prefect's test harness starts
    one (no UI, ephemeral services); yields its API URL and stops it at the end.

    Not waited for here: the tests' ``prefect_server`` fixture waits until it answers.
    """
    with tempfile.TemporaryDirectory(prefix="prefect-tests-") as home:
        port = free_port()
        env = {**os.environ, "PREFECT_HOME": home, "PREFECT_UI_ENABLED": "0",
               "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_SERVER_DATABASE_CONNECTION_URL":
                   f"sqlite+aiosqlite:///{home}/prefect-test.db"}
        with open(Path(home) / "server.log", "w") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                 str(port), "--log-level", "error", "--lifespan", "on"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                yield f"http://127.0.0.1:{port}/api"
            finally:
                server.terminate()
                try:
                    server.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


def first_failure(codes: list[int]) -> int:
    return next((code for code in codes if code), 0)


def one_after_the_other(workers: int) -> int:
    """The former way: the untimed tests on ``workers`` workers, then the serial ones."""
    return first_failure([subprocess.run(parallel_argv(workers)).returncode,
                          subprocess.run(serial_argv()).returncode])


def side_by_side(workers: int) -> int:
    """Both runs at once; the serial run's output follows the other's."""
    with tempfile.TemporaryFile("w+") as serial_log:
        # In a session of its own: the terminal's Ctrl-C reaches the serial run only, and
        # is passed on below, so both runs stop and tear their fixtures down.
        parallel = subprocess.Popen(parallel_argv(workers), start_new_session=True,
                                    preexec_fn=lowest_priority)
        serial = subprocess.Popen(serial_argv(), stdout=serial_log, stderr=subprocess.STDOUT)
        try:
            codes = [parallel.wait(), serial.wait()]
        except KeyboardInterrupt:
            os.killpg(parallel.pid, signal.SIGINT)
            codes = [parallel.wait(), serial.wait()]
        serial_log.seek(0)
        print("\n---------- the tests marked serial (run beside the others, at normal "
              "priority) ----------", flush=True)
        print(serial_log.read(), end="", flush=True)
    return first_failure(codes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="xdist workers of the tests not marked serial (0: one process)")
    args = parser.parse_args()
    with shared_prefect_server() as api_url:
        os.environ[SHARED_PREFECT_ENV] = api_url  # both runs inherit it
        if sessions_share_evenly():
            print("make test: cannot lower a session's priority here; the tests marked "
                  "serial run after the others", flush=True)
            return one_after_the_other(args.workers)
        return side_by_side(args.workers)


if __name__ == "__main__":
    sys.exit(main())
