"""AutoCompress: hardware-guided compression of decoder-only LLMs.

The Python API (``autocompress.api``)::

    import autocompress

    found = autocompress.search(teacher, target, workload, limits)     # -> SearchResult
    result = autocompress.compress(teacher, target, workload, limits, out="dir")

Importing the package is light (no torch, no transformers), so that the command line
answers at once. ``import autocompress.modeling`` registers the heterogeneous decoder
with the transformers Auto classes, so that ``AutoModelForCausalLM.from_pretrained``
loads compressed models; every loader of ours imports it first. The API's names load
on first use. The library never imports Prefect (see flows/ and tasks/).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from autocompress.errors import AutoCompressError  # noqa: E402

if TYPE_CHECKING:
    from autocompress.api import CompressConfig, CompressResult, SearchResult, compress, search
    from autocompress.arch_search.config import SearchConfig
    from autocompress.limits import Limits

# Name -> module holding it, imported on first access (the search stack is heavy).
_LAZY = {
    "compress": "autocompress.api",
    "search": "autocompress.api",
    "CompressConfig": "autocompress.api",
    "CompressResult": "autocompress.api",
    "SearchResult": "autocompress.api",
    "SearchConfig": "autocompress.arch_search.config",
    "Limits": "autocompress.limits",
}

__all__ = ["AutoCompressError", "CompressConfig", "CompressResult", "Limits", "SearchConfig",
           "SearchResult", "__version__", "compress", "search"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autocompress' has no attribute {name!r}")
