"""Progress of long loops and of a flow's stages: in a log (no terminal) at most one line per
ten seconds of a loop's work and one line per stage start and end; nothing under
AUTOCOMPRESS_QUIET (the test suite's default)."""

from autocompress import progress
from autocompress.progress import Bar, stage_ended, stage_started


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_line_per_ten_seconds_of_work_with_rate_and_time_left(monkeypatch,
                                                                          capsys):
    monkeypatch.delenv("AUTOCOMPRESS_QUIET", raising=False)
    clock = Clock()
    with Bar("search", 40, clock=clock) as bar:  # capsys: stdout is not a terminal
        for step in range(1, 41):
            clock.now += 1.0  # a step a second: 40 s of work
            bar.update(step, f"kl {1 / step:.2f}")
        bar.note("measured 3.1 ms")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[search] 10/40 kl 0.10 (1/s, about 30 s left)"
    assert lines[-2:] == ["[search] 40/40 kl 0.03 (1/s)", "[search] measured 3.1 ms"]
    assert len(lines) == 5  # at 10, 20, 30 and 40 s, then the note


def test_a_short_loop_prints_nothing_in_a_log(monkeypatch, capsys):
    monkeypatch.delenv("AUTOCOMPRESS_QUIET", raising=False)
    clock = Clock()
    with Bar("teacher scores", 128, clock=clock) as bar:
        for step in range(1, 129):
            clock.now += progress.LOG_EVERY_S / 200  # the whole loop: 64% of the interval
            bar.update(step)
    assert capsys.readouterr().out == ""


def test_a_log_gets_one_line_as_each_stage_starts_and_ends(monkeypatch, capsys):
    monkeypatch.delenv("AUTOCOMPRESS_QUIET", raising=False)
    stage_started("distill")
    stage_ended("distill", "Completed", 81.04)
    stage_ended("search", "Cached", 0.2)
    stage_ended("verify", "Failed", 3.06, " on pool cpu")
    assert capsys.readouterr().out.splitlines() == [
        "distill ...", "distill: done in 81.0 s", "search: cached",
        "verify: failed after 3.1 s on pool cpu"]


def test_quiet_and_disabled_bars_print_nothing(monkeypatch, capsys):
    monkeypatch.setenv("AUTOCOMPRESS_QUIET", "1")
    clock = Clock()
    with Bar("distill", 5, clock=clock) as bar:
        clock.now += 60
        bar.advance(5)
        bar.note("done")
    stage_started("distill")
    stage_ended("distill", "Completed", 1.0)
    monkeypatch.delenv("AUTOCOMPRESS_QUIET")
    with Bar("distill", 5, enabled=False, clock=clock) as bar:
        clock.now += 60
        bar.advance(5)
    assert capsys.readouterr().out == ""
