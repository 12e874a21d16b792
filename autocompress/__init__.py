"""AutoCompress: hardware-guided compression of decoder-only LLMs.

Importing the package registers the heterogeneous decoder with the
transformers Auto classes, so ``AutoModelForCausalLM.from_pretrained`` loads
compressed models. The library never imports Prefect (see flows/ and tasks/).
"""

__version__ = "0.1.0"

import autocompress.modeling  # noqa: E402,F401  (registers the heterogeneous model)
from autocompress.errors import AutoCompressError  # noqa: E402

__all__ = ["AutoCompressError", "__version__"]
