"""Where things live: the AutoCompress home, the bundled teacher, the corpus.

``AUTOCOMPRESS_HOME`` (default ``~/.cache/autocompress``) holds everything that
is generated and can be regenerated: the corpus, tokenized splits, hardware
profiles, fitted cost models, MLflow's embedded store. Which model a name means (a named
teacher, a registered model, a hub id) is ``autocompress.model_source``; this module
imports nothing of ours, so anything may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def home() -> Path:
    """The AutoCompress working directory (created on first use)."""
    root = Path(os.environ.get("AUTOCOMPRESS_HOME", Path.home() / ".cache" / "autocompress"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def default_corpus_dir() -> Path:
    """The standard-library code corpus built by ``autocompress data prepare``."""
    return home() / "corpus"


def default_teacher_dir() -> Path:
    """The bundled code teacher (trained by ``autocompress teacher train``)."""
    return PACKAGE_DIR / "assets" / "default-teacher"
