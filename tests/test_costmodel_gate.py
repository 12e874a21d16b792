"""The validation gate on a busy machine: noisy failures are measured again, bounded (#13)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autocompress.costmodel import gate
from autocompress.costmodel.gate import NoiseRetry, judge_with_retries


def run(spreads, verdicts, load=0.2, policy=None, monkeypatch=None):
    """Measure/judge through scripted rounds; return (failures, repeats asked, log)."""
    monkeypatch.setattr(gate, "machine_load", lambda: load)
    asked, lines = [], []
    reports = iter(SimpleNamespace(spread={"tpot": s, "ttft": s}, verdict=v)
                   for s, v in zip(spreads, verdicts, strict=True))

    def measure(repeats):
        asked.append(repeats)
        return next(reports)

    policy = policy or NoiseRetry(wait_s=0)
    _, failures = judge_with_retries(measure, lambda r: r.verdict, 3, ["tpot", "ttft"], policy,
                                     log=lines.append)
    return failures, asked, lines


def test_a_noisy_failure_is_measured_again_with_more_repeats(monkeypatch):
    failures, asked, lines = run([0.20, 0.03], [["tpot Kendall tau 0.45 < 0.5"], []],
                                 monkeypatch=monkeypatch)
    assert failures == [] and asked == [3, 6]
    assert "noisy machine (tpot spread 20%" in lines[0] and "6 repeats" in lines[0]


def test_a_steady_failure_is_final_at_once(monkeypatch):
    failures, asked, _ = run([0.02], [["tpot MAPE 40% > 30%"]], monkeypatch=monkeypatch)
    assert failures == ["tpot MAPE 40% > 30%"] and asked == [3]


def test_a_busy_machine_counts_as_noisy_and_retries_are_bounded(monkeypatch):
    bad = ["ttft Kendall tau 0.3 < 0.5"]
    failures, asked, lines = run([0.02] * 3, [bad] * 3, load=3.0, monkeypatch=monkeypatch)
    assert failures == bad and asked == [3, 6, 12]  # two extra rounds, then judged
    assert "load 3.0 per core" in lines[0]


def test_waiting_for_quiet_is_bounded(monkeypatch):
    monkeypatch.setattr(gate, "machine_load", lambda: 5.0)
    sleeps = []
    monkeypatch.setattr(gate.time, "sleep", sleeps.append)
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(gate.time, "monotonic", lambda: next(clock))
    lines = []
    gate.wait_for_quiet(NoiseRetry(wait_s=20), lines.append)
    assert 0 < len(sleeps) <= 5 and "5.0 per core" in lines[0]


@pytest.mark.parametrize("rounds", [0])
def test_no_rounds_means_no_retry(monkeypatch, rounds):
    failures, asked, _ = run([0.5], [["bad"]], policy=NoiseRetry(rounds=rounds, wait_s=0),
                             monkeypatch=monkeypatch)
    assert failures == ["bad"] and asked == [3]
