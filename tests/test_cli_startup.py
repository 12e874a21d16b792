"""The command line answers at once: ``--help``, ``--version`` and usage errors load neither
torch nor transformers (issue 63; the figures are bench/startup.py's, not asserted here).

Each command runs in a fresh interpreter, as a user's does: in this process other tests
have long imported both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "prefect", "mlflow")

# argv -> the exit code it must give (2: a usage error, one line)
COMMANDS = {
    ("--help",): 0,
    ("--version",): 0,
    ("run", "--help"): 0,
    ("costmodel", "validate", "--help"): 0,
    ("run", "--model", "default"): 2,                                     # no limit
    ("run", "--target", "nope/hf-eager/fp32", "--budget-fraction", "0.5"): 2,
    ("run", "--budget-fraction", "half"): 2,
    ("costmodel", "validate", "--target", "nope/hf-eager/fp32"): 2,
    ("costmodel", "fit", "--target", "nope/hf-eager/fp32"): 2,
    ("verify", "--model", "default", "--target", "nope/hf-eager/fp32", "--limit", "tpot=3"): 2,
}

# Runs one command as the console script does, then reports its exit code, its stderr's
# first line and which heavy modules it loaded.
PROBE = """
import contextlib, io, json, sys
from autocompress.cli import main
argv, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["autocompress", *argv]
err = io.StringIO()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
print(json.dumps({"code": code, "first_line": (err.getvalue().splitlines() or [""])[0],
                  "loaded": [m for m in heavy if m in sys.modules]}))
"""


def _probe(argv: tuple[str, ...], tmp_path: Path) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AUTOCOMPRESS_HOME": str(tmp_path),
           "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_and_the_cli_loads_no_heavy_library(tmp_path):
    code = f"import sys, autocompress, autocompress.cli; print([m for m in {HEAVY!r} " \
           "if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("argv", list(COMMANDS), ids=" ".join)
def test_help_version_and_usage_errors_answer_without_torch(argv, tmp_path):
    found = _probe(argv, tmp_path)
    assert found["code"] == COMMANDS[argv], found
    assert found["loaded"] == [], f"{' '.join(argv)} loaded {found['loaded']}"
    if COMMANDS[argv] == 2:
        assert found["first_line"].startswith("error: "), found


def test_the_version_is_the_packages(tmp_path):
    import autocompress

    done = subprocess.run([sys.executable, "-m", "autocompress.cli", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == f"autocompress {autocompress.__version__}"


def test_a_stage_key_follows_a_lazily_loaded_name_to_its_module(tmp_path, monkeypatch):
    """``from autocompress.costmodel import CostModel`` runs costmodel/model.py (through the
    package's ``_LAZY`` table), so a stage that imports it has that file in its key, and
    not the modules of names it never imports."""
    from tasks.code_key import OUR_PACKAGES, code_files

    package = tmp_path / "lazy_stages"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fit.py").write_text("from autocompress.costmodel import CostModel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    files = {p.relative_to(p.parents[1]).as_posix()
             for p in code_files("lazy_stages.fit", (*OUR_PACKAGES, "lazy_stages"))}
    assert "costmodel/model.py" in files
    assert "costmodel/__init__.py" in files
    assert "costmodel/fit.py" not in files  # nothing it imports runs the fit
