"""Config class for exported ``nemotron-nas`` (``DeciLMForCausalLM``) checkpoints.

``autocompress export --format nemotron-nas`` copies this file next to the
weights and points ``auto_map.AutoConfig`` at it, so ``AutoConfig`` (and the
engines that load the config through transformers with ``trust_remote_code``:
vLLM, TensorRT-LLM) read ``block_configs`` with attribute access:
``config.block_configs[i].attention.no_op``.

It must work under transformers 4.x (vLLM pins ``>=4.56,<5``, TensorRT-LLM
4.57.1) and 5.x, where configs are dataclasses whose ``__post_init__`` 4.x never
calls. So the wrapping happens on *assignment* (``__setattr__``), which both
versions go through, whatever path sets ``block_configs``: our ``__init__``,
``PretrainedConfig.__init__``'s loop over extra kwargs, ``config.update()``.

Blocks are kept as dicts (a dict subclass with attribute access): TensorRT-LLM's
converter reads them as dicts (``isinstance(block, dict)`` else
``dataclasses.asdict``), vLLM as attributes (``hasattr(block.ffn, "ffn_mult")``).
Blocks given as objects (the hub's frozen ``BlockConfig`` dataclasses, or any
object with attributes) are turned into the same dicts.

It imports only transformers and the standard library: it must work where
AutoCompress is not installed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import LlamaConfig


class BlockConfigDict(dict):
    """A JSON-serialisable dict whose keys also read as attributes (missing -> AttributeError)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def wrap(cls, value: Any) -> Any:
        """``value`` with each mapping, dataclass or plain object in it as a BlockConfigDict."""
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        elif not isinstance(value, (dict, list, tuple, str, int, float, bool, type(None))):
            value = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        if isinstance(value, dict):
            return cls({k: cls.wrap(v) for k, v in value.items()})
        if isinstance(value, (list, tuple)):
            return [cls.wrap(v) for v in value]
        return value


class DeciLMConfig(LlamaConfig):
    """LlamaConfig plus per-layer ``block_configs``; query heads are global.

    Per block: ``attention.no_op`` / ``attention.n_heads_in_group`` (KV heads =
    ``num_attention_heads // n_heads_in_group``) and ``ffn.no_op`` /
    ``ffn.ffn_mult`` (width ``round_up_256(int(2 * ffn_mult * hidden / 3))``) or
    ``ffn.intermediate_size``. ``attention_bias`` is the o_proj bias and
    ``qkv_bias`` the q/k/v one (as vLLM reads them).
    """

    model_type = "nemotron-nas"

    def __init__(self, block_configs: list | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block_configs = block_configs
        if self.block_configs:
            self.num_hidden_layers = len(self.block_configs)

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "block_configs" and value is not None:
            value = [BlockConfigDict.wrap(block) for block in value]
        super().__setattr__(key, value)

    def validate_architecture(self) -> None:
        # transformers 5: heads x head_dim need not equal hidden_size after width pruning.
        return None


__all__ = ["DeciLMConfig"]
