"""Where things live: the AutoCompress home, the bundled teacher, the corpus.

``AUTOCOMPRESS_HOME`` (default ``~/.cache/autocompress``) holds everything that
is generated and can be regenerated: the corpus, tokenized splits, hardware
profiles, fitted cost models, MLflow's embedded store. Which model a name means (a named
teacher, a registered model, a hub id) is ``autocompress.model_source``; this module
imports only ``errors`` of ours, so anything may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

from autocompress.errors import AutoCompressError

PACKAGE_DIR = Path(__file__).resolve().parent


def home() -> Path:
    """The AutoCompress working directory (created on first use)."""
    root = Path(os.environ.get("AUTOCOMPRESS_HOME", Path.home() / ".cache" / "autocompress"))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a home that cannot be made is the user's to fix, not a bug
        raise AutoCompressError(
            f"cannot write {root} (the AutoCompress home): {err.strerror or err}",
            "set AUTOCOMPRESS_HOME to a folder you can write (default "
            "~/.cache/autocompress)") from None
    return root


def default_corpus_dir() -> Path:
    """The standard-library code corpus built by ``autocompress data prepare``."""
    return home() / "corpus"


def default_teacher_dir() -> Path:
    """The bundled code teacher (trained by ``autocompress teacher train``)."""
    return PACKAGE_DIR / "assets" / "default-teacher"
