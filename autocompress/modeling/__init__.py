"""Models AutoCompress reads and writes.

- ``HeteroConfig`` / ``HeteroForCausalLM``: the heterogeneous Llama-family decoder
  (``model_type="autocompress_hetero"``), registered with the transformers Auto
  classes on import, and saved with its modeling code so that
  ``trust_remote_code=True`` loads it where AutoCompress is not installed.
- ``load_causal_lm``: load a supported teacher or compressed model (+ tokenizer).
- ``arch_spec_of``, ``hetero_config_from``, ``build_model``, ``to_hetero``.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from autocompress.modeling.configuration_autocompress_hetero import HeteroConfig
from autocompress.modeling.modeling_autocompress_hetero import HeteroForCausalLM, HeteroModel

AutoConfig.register(HeteroConfig.model_type, HeteroConfig, exist_ok=True)
AutoModel.register(HeteroConfig, HeteroModel, exist_ok=True)
AutoModelForCausalLM.register(HeteroConfig, HeteroForCausalLM, exist_ok=True)
# save_pretrained then copies the two modeling files and writes `auto_map`.
HeteroConfig.register_for_auto_class()
HeteroForCausalLM.register_for_auto_class("AutoModelForCausalLM")

from autocompress.modeling.loading import (  # noqa: E402  (needs the registration above)
    SUPPORTED_MODEL_TYPES,
    arch_spec_of,
    build_model,
    hetero_config_from,
    load_causal_lm,
    to_hetero,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HeteroConfig",
    "HeteroForCausalLM",
    "HeteroModel",
    "arch_spec_of",
    "build_model",
    "hetero_config_from",
    "load_causal_lm",
    "to_hetero",
]
