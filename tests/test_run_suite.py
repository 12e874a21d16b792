"""`make test`'s launcher (tests/run_suite.py): the untimed tests really run at the lowest
priority, in a session whose autogroup is niced too, and the two runs cover every test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COLLECTED_FILES
from run_suite import LOWEST, PYTEST, lowest_priority, parallel_argv, serial_argv, serial_files

REPORT = ("import os; from pathlib import Path; g = Path('/proc/self/autogroup'); "
          "print(os.nice(0), os.getsid(0) == os.getpid(), "
          "g.read_text().split()[-1] if g.exists() else None)")


def test_the_untimed_run_gets_the_lowest_priority_in_a_session_of_its_own():
    done = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True,
                          start_new_session=True, preexec_fn=lowest_priority, check=True)
    nice, own_session, autogroup_nice = done.stdout.split()
    assert int(nice) == LOWEST and own_session == "True"
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no autogroups on this kernel: the nice value is all it takes")
    assert autogroup_nice == str(LOWEST)  # a new session's autogroup, niced like the run


def test_the_two_runs_select_every_test_once(request):
    untimed, timed = parallel_argv(2), serial_argv()
    assert untimed[:len(PYTEST)] == timed[:len(PYTEST)] == PYTEST
    marker = timed[len(PYTEST) + 1]
    assert untimed[-2:] == ["-m", f"not {marker}"] and timed[len(PYTEST)] == "-m"
    assert untimed[untimed.index("-n") + 1] == "2" and "-n" not in timed
    # The serial run collects only the files its text scan names: every file this session
    # collected holds a test marked serial exactly when the scan names it.
    assert timed[len(PYTEST) + 2:] == serial_files() and serial_files()
    collected, with_serial = request.config.stash[COLLECTED_FILES]
    named = {Path(path) for path in serial_files()}
    assert {path for path in collected if path in named} == with_serial
