"""Minimal config class for exported ``nemotron-nas`` (``DeciLMForCausalLM``) checkpoints.

``autocompress export --format nemotron-nas`` copies this file next to the
weights and points ``auto_map.AutoConfig`` at it, so ``AutoConfig`` (and engines
that load the config through transformers with ``trust_remote_code``) can read
the ``block_configs`` with attribute access: ``config.block_configs[i].attention.no_op``.

It imports only transformers: it must work where AutoCompress is not installed.
"""

from __future__ import annotations

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
        if isinstance(value, dict):
            return cls({k: cls.wrap(v) for k, v in value.items()})
        return value


class DeciLMConfig(LlamaConfig):
    """LlamaConfig plus per-layer ``block_configs``; query heads are global."""

    model_type = "nemotron-nas"

    block_configs: list | None = None

    def __post_init__(self, **kwargs):
        self.block_configs = [BlockConfigDict.wrap(b) for b in (self.block_configs or [])]
        if self.block_configs:
            self.num_hidden_layers = len(self.block_configs)
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        # Heads times head_dim need not equal hidden_size after width pruning.
        return None


__all__ = ["DeciLMConfig"]
