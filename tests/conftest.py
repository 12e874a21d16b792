"""Shared fixtures: a private AutoCompress home, a tiny corpus and tokenizer.

The tiny corpus is a handful of real standard-library files, so tests meet
real code without paying for the whole corpus.
"""

from __future__ import annotations

import os
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from run_suite import SHARED_PREFECT_ENV  # set by `make test`: one Prefect server for all

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("AUTOCOMPRESS_QUIET", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
torch.set_num_threads(1)

_TINY_FILES = [
    "json/__init__.py", "json/decoder.py", "json/encoder.py", "textwrap.py", "shlex.py",
    "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "string.py", "colorsys.py",
    "keyword.py", "numbers.py", "operator.py", "queue.py", "sched.py", "stat.py",
    "struct.py", "tabnanny.py", "this.py", "graphlib.py", "contextvars.py", "copy.py",
    "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fractions.py", "functools.py",
    "gettext.py", "getopt.py", "gzip.py", "hmac.py", "ipaddress.py", "linecache.py",
    "locale.py", "mimetypes.py", "netrc.py", "ntpath.py", "optparse.py", "pprint.py",
    "quopri.py", "random.py", "reprlib.py", "secrets.py", "selectors.py", "shutil.py",
    "statistics.py", "tempfile.py", "timeit.py", "token.py", "tokenize.py", "trace.py",
    "typing.py", "uuid.py", "wave.py", "weakref.py", "zipapp.py",
]


@pytest.fixture
def autocompress_home(tmp_path, monkeypatch) -> Path:
    """A private AUTOCOMPRESS_HOME for one test."""
    home = tmp_path / "ac-home"
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A corpus of ~60 real stdlib files, split like the full one (session-wide)."""
    from autocompress.data.corpus import build_corpus

    src = tmp_path_factory.mktemp("tiny-src")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for rel in _TINY_FILES:
        path = stdlib / rel
        if path.exists():
            rows.append({"path": rel, "text": path.read_text(encoding="utf-8")})
    import json

    (src / "files.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path_factory.mktemp("tiny-corpus")
    build_corpus(out, source=str(src / "files.jsonl"))
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_corpus):
    """A byte-level BPE with a 512-token vocabulary, trained on the tiny corpus."""
    from autocompress.data.corpus import load_documents
    from autocompress.data.tokenizer import train_tokenizer

    docs = load_documents(tiny_corpus, "train")
    return train_tokenizer((d.text for d in docs), vocab_size=512)




@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect server and database for the session: the one `make test` shares
    between its pytest processes, else Prefect's test harness."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings({PREFECT_SERVER_ANALYTICS_ENABLED: False,
                             PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 600}):
        shared = os.environ.get(SHARED_PREFECT_ENV)
        if shared:
            wait_until_healthy(shared, timeout=600)
            with temporary_settings({PREFECT_API_URL: shared}):
                yield
        else:
            with prefect_test_harness(server_startup_timeout=600):
                yield


def wait_until_healthy(api_url: str, timeout: float) -> None:
    """Wait for the Prefect server at ``api_url`` to answer its health check."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=10) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the shared Prefect server ({SHARED_PREFECT_ENV}={api_url}) did not "
                        f"answer in {timeout:.0f} s")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def mlflow_db_template(tmp_path_factory) -> Path:
    """An MLflow sqlite database with its schema created once (migrations cost ~10 s)."""
    from autocompress.tracking import Tracker

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    Tracker("warmup", uri=f"sqlite:///{path}", artifact_location=path.parent.as_uri())
    return path


# The files collected, and those among them holding a test marked ``serial`` (before
# ``-m`` deselects any): tests/test_run_suite.py checks run_suite.serial_files() with them.
COLLECTED_FILES = pytest.StashKey[tuple[set[Path], set[Path]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Files with a test marked ``slow`` run first, the longest first, each file together.

    `make test` runs two workers (pytest-xdist, ``--dist loadfile`` in this order, so a
    module's fixtures are built once). Starting the long files first lets the short ones
    fill in around them, instead of one long file ending the run alone on one core.
    ``@pytest.mark.slow(seconds=N)`` says how long a test takes on 2 cores (default 20).
    """
    config.stash[COLLECTED_FILES] = ({item.path for item in items},
                                     {item.path for item in items
                                      if item.get_closest_marker("serial")})
    longest: dict = {}
    for item in items:
        for mark in item.iter_markers("slow"):
            seconds = mark.kwargs.get("seconds", 20)
            longest[item.path] = max(longest.get(item.path, 0), seconds)
    items.sort(key=lambda item: -longest.get(item.path, 0))
