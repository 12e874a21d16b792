"""AutoCompress: hardware-guided compression of decoder-only LLMs.

The Python API (``autocompress.api``)::

    import autocompress

    found = autocompress.search(teacher, target, workload, limits)     # -> SearchResult
    result = autocompress.compress(teacher, target, workload, limits, out="dir")

Importing the package registers the heterogeneous decoder with the
transformers Auto classes, so ``AutoModelForCausalLM.from_pretrained`` loads
compressed models. The API's names load on first use. The library never
imports Prefect (see flows/ and tasks/).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

import autocompress.modeling  # noqa: E402,F401  (registers the heterogeneous model)
from autocompress.errors import AutoCompressError  # noqa: E402

if TYPE_CHECKING:
    from autocompress.api import CompressConfig, CompressResult, SearchResult, compress
    from autocompress.limits import Limits
    from autocompress.search.run import SearchConfig

# Name -> module holding it, imported on first access (the search stack is heavy).
# ``search`` is the subpackage ``autocompress.search``, which is callable: calling it
# runs ``autocompress.api.search`` (see autocompress/search/__init__.py).
_LAZY = {
    "compress": "autocompress.api",
    "CompressConfig": "autocompress.api",
    "CompressResult": "autocompress.api",
    "SearchResult": "autocompress.api",
    "SearchConfig": "autocompress.search.run",
    "Limits": "autocompress.limits",
}

__all__ = ["AutoCompressError", "CompressConfig", "CompressResult", "Limits", "SearchConfig",
           "SearchResult", "__version__", "compress", "search"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "search":
        return importlib.import_module("autocompress.search")
    raise AttributeError(f"module 'autocompress' has no attribute {name!r}")
