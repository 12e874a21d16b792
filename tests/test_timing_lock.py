"""AUTOCOMPRESS_TIMING_LOCK: timings wait for a machine-wide lock that `flock` also takes."""

from __future__ import annotations

import fcntl
import subprocess
import threading
import time

import pytest

from autocompress.arch_search.measured import measure_spec
from autocompress.costmodel import CostModel, Target, Workload
from autocompress.costmodel.timing_lock import timing_lock
from autocompress.errors import AutoCompressError
from autocompress.modeling import arch_spec_of
from autocompress.modeling.tiny import tiny_model


def _held(path) -> bool:
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_a_timing_waits_while_the_flock_command_holds_the_lock(tmp_path, monkeypatch):
    lock = tmp_path / "measure.lock"
    lock.touch()
    monkeypatch.setenv("AUTOCOMPRESS_TIMING_LOCK", str(lock))
    # Another run's timing under `flock` (-o: only flock itself holds it, so ending it frees it).
    holder = subprocess.Popen(["flock", "-o", str(lock), "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while not _held(lock):
            assert time.monotonic() < deadline, "flock never took the lock"
            time.sleep(0.02)
        model = tiny_model("llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=2,
                           gqa_ratio=1, intermediate_size=32, head_dim=16).eval()
        cost_model = CostModel.analytic(Target.parse("cpu-local/hf-eager/fp32"))
        done = threading.Event()
        result = {}

        def timed():  # the search's (and the baseline's) timing of a candidate
            result["m"] = measure_spec(arch_spec_of(model), model.config, cost_model,
                                       Workload(name="t", isl=4, osl=2, batch=1), repeats=2)
            done.set()

        thread = threading.Thread(target=timed)
        thread.start()
        assert not done.wait(1.0)  # nothing is timed while the other run holds the lock
    finally:
        holder.terminate()
        holder.wait()
    assert done.wait(30)
    thread.join()
    metrics, _ = result["m"]
    assert metrics["tpot_ms"] > 0
    assert not _held(lock)  # and it let go


def test_no_variable_no_lock_and_a_bad_path_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOCOMPRESS_TIMING_LOCK", raising=False)
    with timing_lock():
        pass
    monkeypatch.setenv("AUTOCOMPRESS_TIMING_LOCK", str(tmp_path / "no" / "such" / "lock"))
    with pytest.raises(AutoCompressError, match="timing lock"), timing_lock():
        pass
