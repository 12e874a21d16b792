"""Progress of long loops: a line each tenth of the way where there is no terminal (a flow's
log, CI), nothing under AUTOCOMPRESS_QUIET (the test suite's default)."""

from autocompress.progress import Bar


def test_a_log_gets_a_line_each_tenth_and_the_last(monkeypatch, capsys):
    monkeypatch.delenv("AUTOCOMPRESS_QUIET", raising=False)
    with Bar("search", 40) as bar:  # capsys: stderr is not a terminal
        for step in range(1, 41):
            bar.update(step, f"kl {1 / step:.2f}")
        bar.note("measured 3.1 ms")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[search] 1/40 kl 1.00"
    assert lines[-2:] == ["[search] 40/40 kl 0.03", "[search] measured 3.1 ms"]
    assert len(lines) == 12  # 1, then 4, 8, ..., 40 (each tenth), then the note


def test_quiet_and_disabled_bars_print_nothing(monkeypatch, capsys):
    monkeypatch.setenv("AUTOCOMPRESS_QUIET", "1")
    with Bar("distill", 5) as bar:
        bar.advance(5)
        bar.note("done")
    monkeypatch.delenv("AUTOCOMPRESS_QUIET")
    with Bar("distill", 5, enabled=False) as bar:
        bar.advance(5)
    assert capsys.readouterr().out == ""
