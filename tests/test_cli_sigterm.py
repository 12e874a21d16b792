"""SIGTERM stops a command cleanly: ``report_errors`` (the CLI's and the bench scripts'
wrapper) turns it into an exception that unwinds the process, so its atexit handlers run
and stop what it started. Python's default ends the process at once: ``kill`` of a
``python -m bench.compare`` left its temporary Prefect server (uvicorn) running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

from autocompress import cli

ROOT = Path(__file__).resolve().parents[1]

# A command that starts a child process and stops it from an atexit handler, as Prefect
# does its temporary server (SubprocessASGIServer.start: atexit.register(self.stop)). The
# handler takes a moment, in which the test sends a second SIGTERM. The child does not
# hold the command's pipes, so that a child left running cannot hold up the test.
COMMAND = """
import atexit, subprocess, sys, time
from autocompress.cli import report_errors

def main():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop():
        print("stopping", flush=True)
        time.sleep(0.5)
        server.terminate()
        server.wait(timeout=30)

    atexit.register(stop)
    print(server.pid, flush=True)
    time.sleep(600)

report_errors(main)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_runs_the_atexit_handlers_and_the_child_is_gone():
    command = subprocess.Popen([sys.executable, "-c", COMMAND], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    server_pid = None
    try:
        server_pid = int(command.stdout.readline())
        assert _alive(server_pid)
        command.send_signal(signal.SIGTERM)
        assert command.stdout.readline().strip() == "stopping"
        command.send_signal(signal.SIGTERM)  # must not cut the clean-up short
        _, err = command.communicate(timeout=60)
        assert command.returncode == cli.EXIT_TERMINATED == 143, err
        assert err.strip().splitlines() == ["stopped: SIGTERM"]
        assert not _alive(server_pid)
    finally:  # a failure must not leave either process behind
        for pid in filter(None, [server_pid, command.pid]):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        command.wait(timeout=10)


def test_an_in_process_caller_gets_its_own_sigterm_handler_back():
    def own_handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own_handler)
    try:
        cli.report_errors(lambda: None)
        assert signal.getsignal(signal.SIGTERM) is own_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
