"""What a run writes to a log (no terminal): one line per stage start and end, progress at
most every ten seconds, no third-party bars and no Prefect INFO lines, then the results
table and where to look (issue 63: `make demo`'s log was 204 lines)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autocompress.progress import LOG_EVERY_S

ROOT = Path(__file__).resolve().parents[1]
NOTES_PER_STAGE = 3  # "note:"/"warning:" lines and a loop's own notes (a round's verdict)
TAIL_LINES = 32  # outside the stages: the results table, summary lines, where to look
STAGE_END = re.compile(r"^(\w+): (?:done in|\w+ after) ([0-9.]+) s|^(\w+): cached")  # progress.py


def stage_blocks(lines: list[str]) -> tuple[list[tuple[str, float, list[str]]], list[str]]:
    """The log cut at its stage lines: (stage, seconds, lines between start and end) for
    each stage, and the lines outside every stage."""
    blocks, inside, outside = [], None, []
    for line in lines:
        if line.endswith(" ...") and inside is None:
            inside = (line[:-4], [])
            continue
        end = STAGE_END.match(line)
        if inside is not None and end and (end.group(1) or end.group(3)) == inside[0]:
            blocks.append((inside[0], float(end.group(2) or 0.0), inside[1]))
            inside = None
            continue
        (inside[1] if inside is not None else outside).append(line)
    assert inside is None, f"stage {inside[0]} started and never ended"
    return blocks, outside


@pytest.mark.slow  # a whole tiny compress flow run: ~2 min on 2 cores
def test_a_tiny_run_writes_a_short_log_that_ends_with_the_table(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k != "AUTOCOMPRESS_QUIET" and not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(AUTOCOMPRESS_HOME=str(tmp_path), PREFECT_HOME=str(tmp_path / "prefect"))
    done = subprocess.run(
        [sys.executable, "-m", "autocompress.cli", "run", "--config", "profile=tiny",
         "--budget-fraction", "0.6", "--workload", "interactive-cpu"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=1200)
    lines = done.stdout.splitlines()
    assert done.returncode in (0, 1), done.stdout[-3000:]  # 1: verify missed a limit
    # The rule, not a line count: a busy machine runs longer and adds a warning, so the
    # bound on each stage grows with its own time (one progress line per LOG_EVERY_S)
    blocks, outside = stage_blocks(lines)
    for stage, seconds, inner in blocks:
        allowed = math.ceil(seconds / LOG_EVERY_S) + NOTES_PER_STAGE
        assert len(inner) <= allowed, f"{stage}: {len(inner)} lines in {seconds} s\n" + done.stdout
        strays = [line for line in inner if not line.startswith(("[", "note: ", "warning: "))]
        assert not strays, f"{stage}: lines that are neither progress nor a note: {strays}"
    assert len(outside) <= TAIL_LINES, done.stdout
    assert not [line for line in lines if "| INFO " in line or " INFO mlflow" in line]
    assert not [line for line in lines if "Loading weights" in line or "shards" in line]
    for stage in ("costmodel", "arch", "model", "verification"):
        assert f"{stage} ..." in lines
        assert any(line.startswith(f"{stage}: ") for line in lines), stage
    table = next(i for i, line in enumerate(lines) if "AutoCompress results" in line)
    assert any(line.startswith("stages: ") for line in lines[table:])
    assert lines[-1].startswith("artifacts: ")
