"""The sandbox that runs model-written code (HumanEval pass@k): real child processes.

Each refusal is checked by its effect (the file is not there, the program did not pass),
not only by the sandbox's own report of it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from autocompress.evaluation.sandbox import (
    Limits,
    network_namespace_works,
    pass_at_k,
    run_program,
)

QUICK = Limits(timeout_s=20, cpu_s=10)


def test_a_plain_program_runs_and_passes():
    result = run_program("print(sum(range(10)))", QUICK)
    assert result.passed and result.stdout == "45\n" and not result.refused
    assert result.network == ("namespace+hook" if network_namespace_works() else "hook")


def test_writing_outside_its_directory_is_refused(tmp_path):
    outside = tmp_path / "escaped.txt"
    program = (f"try:\n    open({str(outside)!r}, 'w').write('x')\nexcept PermissionError:\n"
               "    pass\n"  # even a program that swallows the refusal does not pass
               "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n")
    result = run_program(program, QUICK)
    assert not outside.exists()
    assert result.stdout == "fine\n"  # its own directory is writable
    assert result.refused == [f"open {outside}"] and not result.passed
    # Other ways out: os.open, renaming a file out, removing one.
    victim = tmp_path / "keep.txt"
    victim.write_text("still here")
    for line in (f"import os; os.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import os; open('a', 'w').close(); os.rename('a', {str(outside)!r})",
                 f"import os; os.remove({str(victim)!r})",
                 f"import shutil; shutil.rmtree({str(tmp_path)!r})"):
        result = run_program(line, QUICK)
        assert result.refused and not result.passed, line
    assert not outside.exists() and victim.read_text() == "still here"


def test_opening_a_socket_is_refused():
    for program in ("import socket; socket.socket()",
                    "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
                    "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9/')"):
        result = run_program(program, QUICK)
        assert not result.passed and any(r.startswith("socket.") for r in result.refused), \
            program


def test_a_program_past_its_timeout_is_killed_with_everything_it_started():
    result = run_program("import time\nwhile True:\n    time.sleep(0.05)\n",
                         Limits(timeout_s=1.0, cpu_s=30))
    assert result.timed_out and result.returncode is None and not result.passed
    assert 1.0 <= result.seconds < 10


def test_cpu_time_file_size_and_processes_are_limited():
    spin = run_program("while True:\n    pass\n", Limits(timeout_s=30, cpu_s=1))
    assert not spin.timed_out and spin.returncode != 0 and spin.seconds < 15  # SIGXCPU
    big = run_program("open('big', 'wb').write(b'x' * 4_000_000)",
                      Limits(timeout_s=20, file_bytes=1_000_000))
    assert not big.passed
    child = run_program("import subprocess; subprocess.run(['true'])", QUICK)
    assert child.refused == ["subprocess.Popen"] and not child.passed
    memory = run_program("x = bytearray(3 * 1024**3)", Limits(timeout_s=20,
                                                               memory_bytes=512 * 1024**2))
    assert not memory.passed and "MemoryError" in memory.stderr


def test_the_child_gets_a_clean_environment_and_a_fresh_directory(monkeypatch):
    monkeypatch.setenv("AC_SECRET_FOR_TEST", "do-not-leak")
    program = ("import os, sys\nprint(sorted(os.environ))\nprint(os.listdir('.'))\n"
               "print(os.getcwd() == os.environ['HOME'])\n")
    first = run_program(program, QUICK)
    assert first.passed, first.stderr
    names, files, home_is_cwd = first.stdout.splitlines()
    assert "AC_SECRET_FOR_TEST" not in names and "do-not-leak" not in first.stdout
    assert files == "['program.py']" and home_is_cwd == "True"
    again = run_program("import os; open('left.txt', 'w').close(); print(os.getcwd())", QUICK)
    assert not Path(again.stdout.strip()).exists()  # removed after the run
    assert os.environ["AC_SECRET_FOR_TEST"] == "do-not-leak"  # the parent's is untouched


@pytest.mark.parametrize("n", [1, 5, 10, 20])
def test_pass_at_k_is_the_unbiased_estimator(n):
    for correct in range(n + 1):
        for k in (1, 10):
            if k > n:
                with pytest.raises(ValueError):
                    pass_at_k(n, correct, k)
                continue
            exact = 1 - math.comb(n - correct, k) / math.comb(n, k)
            assert pass_at_k(n, correct, k) == pytest.approx(exact, abs=1e-12)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
