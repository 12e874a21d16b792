"""bench/vllm_gpu.py, the vLLM check for a GPU machine: where there is none, it says so in
one line and records that nothing was measured (on a GPU machine it measures instead)."""

from __future__ import annotations

import json

import pytest

from autocompress.hardware import detect_gpus
from bench.vllm_gpu import main


def test_without_a_gpu_the_check_says_why_and_measures_nothing(tmp_path, capsys):
    if detect_gpus()[0]:
        pytest.skip("this machine has a GPU: run the check itself")
    out = tmp_path / "vllm_gpu.json"
    assert main(["--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("vLLM GPU check skipped: ") and "\n" not in line
    record = json.loads(out.read_text())
    assert record["measured"] is False and record["skipped"] in line


def test_a_run_without_a_gpu_keeps_a_measured_result(tmp_path, capsys):
    if detect_gpus()[0]:
        pytest.skip("this machine has a GPU: run the check itself")
    out = tmp_path / "vllm_gpu.json"
    measured = json.dumps({"measured": True, "rows": [{"workload": "interactive"}]})
    out.write_text(measured)
    assert main(["--out", str(out)]) == 0
    assert out.read_text() == measured
    assert "kept the measured result" in capsys.readouterr().out
