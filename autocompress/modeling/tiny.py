"""Tiny random models of the real supported classes, for tests and quick experiments.

``tiny_model("qwen3", gqa_ratio=4, tied=True)`` builds a ``Qwen3ForCausalLM`` with
a few thousand parameters in milliseconds. Every test that needs "a real
transformers model" should use these rather than hand-rolled modules.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
_CONFIG_CLASSES = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
}


def tiny_config(
    family: str = "llama",
    *,
    tied: bool = False,
    gqa_ratio: int = 2,
    hidden_size: int = 64,
    num_layers: int = 3,
    num_heads: int = 4,
    intermediate_size: int = 96,
    vocab_size: int = 128,
    head_dim: int = 16,
    **overrides: Any,
):
    """Config of a tiny ``family`` model; ``gqa_ratio`` = query heads per KV head."""
    if num_heads % gqa_ratio:
        raise ValueError(f"num_heads {num_heads} is not a multiple of gqa_ratio {gqa_ratio}")
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads // gqa_ratio,
        head_dim=head_dim,
        tie_word_embeddings=tied,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "qwen2":
        kwargs.pop("head_dim")  # Qwen2 derives head_dim = hidden / heads
        if hidden_size // num_heads != head_dim:
            kwargs["hidden_size"] = head_dim * num_heads
    if family == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    return _CONFIG_CLASSES[family](**kwargs)


def tiny_model(family: str = "llama", *, seed: int = 0, **config_kwargs: Any) -> PreTrainedModel:
    """A tiny random model of the real class for ``family`` (eval mode, fp32).

    Norm weights and biases are randomised too (they are ones/zeros at init),
    so tests that slice or permute them can fail.
    """
    config = tiny_config(family, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
    return model.eval()
