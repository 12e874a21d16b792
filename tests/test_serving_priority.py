"""A service started in a session of its own keeps its starter's low priority.

Where autogroups are on (sched(7)), the kernel shares the CPU between sessions before it
looks at nice values, and a new session's autogroup starts at nice 0: a vLLM or MLflow
server started from the niced test suite would otherwise take a core from the timed tests.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

AUTOGROUP = Path("/proc/self/autogroup")

pytestmark = pytest.mark.skipif(not AUTOGROUP.exists(), reason="no autogroups on this kernel")

STARTER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from autocompress.serving import Stack
    os.setsid()  # an autogroup of this starter's own, niced like run_suite's workers
    nice = max(7, os.getpriority(os.PRIO_PROCESS, 0))  # a nice value cannot go back down
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    Path("/proc/self/autogroup").write_text(str(nice))
    stack = Stack()
    service = stack.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                          dict(os.environ), Path(sys.argv[1]))
    try:
        print(nice, Path(f"/proc/{service.pid}/autogroup").read_text().split()[-1],
              os.getpriority(os.PRIO_PROCESS, service.pid))
    finally:
        stack.stop()
""")


def test_a_service_started_from_a_niced_run_is_niced_in_its_own_session(tmp_path):
    out = subprocess.run([sys.executable, "-c", STARTER, str(tmp_path / "sleeper.log")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    starter_nice, autogroup_nice, process_nice = map(int, out.split())
    assert starter_nice >= 7
    assert process_nice == starter_nice  # inherited across fork and exec
    assert autogroup_nice == starter_nice  # its new session's autogroup: keep_priority's
