"""Where things live: the AutoCompress home, the bundled teacher, the corpus.

``AUTOCOMPRESS_HOME`` (default ``~/.cache/autocompress``) holds everything that
is generated and can be regenerated: the corpus, tokenized splits, hardware
profiles, fitted cost models, MLflow's embedded store.
"""

from __future__ import annotations

import os
from pathlib import Path

from autocompress.errors import AutoCompressError

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


def resolve_model_dir(model: str | Path) -> Path:
    """Turn ``default`` or a path into an existing model directory.

    Hub ids are not resolved here (no network on these machines); loaders that
    accept hub ids call this only for local paths.
    """
    if str(model) == "default":
        path = default_teacher_dir()
        if not (path / "config.json").exists():
            raise AutoCompressError(
                f"the default teacher is missing from {path}",
                "train it with `autocompress teacher train` or pass --model DIR",
            )
        return path
    path = Path(model).expanduser()
    if not path.is_dir():
        raise AutoCompressError(
            f"model directory {path} does not exist",
            "pass a directory made by save_pretrained, or `default` for the bundled teacher",
        )
    if not (path / "config.json").exists():
        raise AutoCompressError(
            f"{path} has no config.json, so it is not a Hugging Face model directory",
            "pass a directory made by save_pretrained, or `default` for the bundled teacher",
        )
    return path
