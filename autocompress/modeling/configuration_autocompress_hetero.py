"""Config of the heterogeneous Llama-family decoder (``model_type="autocompress_hetero"``).

This file is copied next to saved weights (``trust_remote_code``), so it must
import nothing from ``autocompress``: only transformers and the standard library.

Each entry of ``block_configs`` describes one decoder layer::

    {"attention": {"num_heads": 8, "num_kv_heads": 2} | None,
     "ffn": {"intermediate_size": 512} | None}

``None`` means the block is removed: the layer then skips that sub-block and its
RMSNorm entirely (the residual stream passes through unchanged).
"""

from __future__ import annotations

from typing import Any

from transformers.configuration_utils import PreTrainedConfig

# layer_types value for a layer without attention: the cache gives it a dummy
# slot ("moe" and "mlp" both map to DummyLayer; only "moe" passes validation).
NO_ATTENTION_LAYER_TYPE = "moe"
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


def _normalize_block(block: Any, index: int) -> dict[str, Any]:
    """Plain-dict copy of one block config, with both keys present."""
    if hasattr(block, "model_dump"):  # an autocompress LayerSpec
        block = block.model_dump()
    if not isinstance(block, dict):
        raise ValueError(f"block_configs[{index}] must be a dict, got {type(block).__name__}")
    unknown = set(block) - {"attention", "ffn"}
    if unknown:
        raise ValueError(f"block_configs[{index}] has unknown keys {sorted(unknown)}")
    attention, ffn = block.get("attention"), block.get("ffn")
    if attention is not None:
        heads, kv = int(attention["num_heads"]), int(attention["num_kv_heads"])
        if heads < 1 or kv < 1 or heads % kv:
            raise ValueError(
                f"block_configs[{index}]: num_heads {heads} must be a positive multiple of "
                f"num_kv_heads {kv}"
            )
        attention = {"num_heads": heads, "num_kv_heads": kv}
    if ffn is not None:
        width = int(ffn["intermediate_size"])
        if width < 1:
            raise ValueError(f"block_configs[{index}]: intermediate_size must be positive")
        ffn = {"intermediate_size": width}
    return {"attention": attention, "ffn": ffn}


class HeteroConfig(PreTrainedConfig):
    r"""Configuration of [`HeteroForCausalLM`]: a Llama/Mistral/Qwen2/Qwen3-style decoder
    whose layers may differ in query heads, KV heads and FFN width, or drop their
    attention or FFN block.

    Shared fields follow `LlamaConfig`. Specific ones:

    - `block_configs`: one dict per layer (see module docstring); its length sets
      `num_hidden_layers`.
    - `head_dim`: the same in every layer (RoPE depends on it).
    - `attention_bias` (q/k/v), `attention_output_bias` (o_proj), `mlp_bias`:
      Llama uses the same flag for all four attention projections, Qwen2 has
      biases on q/k/v only.
    - `qk_norm`: RMSNorm over head_dim on queries and keys (Qwen3).
    - `layer_types`: per layer `full_attention`, `sliding_attention` (uses
      `sliding_window`) or `moe` for a layer without attention (needed by the
      KV cache, it is derived from `block_configs`).
    - `source_model_type`: the teacher's `model_type` (information only).
    """

    model_type = "autocompress_hetero"
    keys_to_ignore_at_inference = ["cache"]

    vocab_size: int = 32000
    hidden_size: int = 4096
    block_configs: list | None = None
    num_hidden_layers: int | None = None
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_output_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attention_dropout: float = 0.0
    sliding_window: int | None = None
    layer_types: list | None = None
    source_model_type: str | None = None

    def __post_init__(self, **kwargs):
        if self.block_configs is None:
            # A Llama-7B-like default so that `HeteroConfig()` is usable.
            layers = self.num_hidden_layers or 32
            block = {
                "attention": {"num_heads": 32, "num_kv_heads": 32},
                "ffn": {"intermediate_size": 11008},
            }
            self.block_configs = [block] * layers
        self.block_configs = [_normalize_block(b, i) for i, b in enumerate(self.block_configs)]
        self.num_hidden_layers = len(self.block_configs)
        self.layer_types = self._derive_layer_types(self.layer_types)
        # Homogeneous summaries are derived from block_configs (see the properties).
        for derived in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            kwargs.pop(derived, None)
        super().__post_init__(**kwargs)

    def _derive_layer_types(self, given: list | None) -> list[str]:
        """`moe` where attention is removed; else the given type, or full/sliding."""
        types = []
        for i, block in enumerate(self.block_configs):
            wanted = given[i] if given is not None and i < len(given) else None
            if block["attention"] is None:
                types.append(NO_ATTENTION_LAYER_TYPE)
            elif wanted in ATTENTION_LAYER_TYPES:
                types.append(wanted)
            else:
                types.append(
                    "sliding_attention" if self.sliding_window is not None else "full_attention"
                )
        return types

    # Read-only summaries for generic code that expects a homogeneous config.
    @property
    def num_attention_heads(self) -> int:
        """Largest query-head count over layers (per-layer values: `block_configs`)."""
        return max((b["attention"]["num_heads"] for b in self._attention_blocks()), default=1)

    @property
    def num_key_value_heads(self) -> int:
        """Largest KV-head count over layers (per-layer values: `block_configs`)."""
        return max((b["attention"]["num_kv_heads"] for b in self._attention_blocks()), default=1)

    @property
    def intermediate_size(self) -> int:
        """Largest FFN width over layers (per-layer values: `block_configs`)."""
        widths = [b["ffn"]["intermediate_size"] for b in self.block_configs if b["ffn"]]
        return max(widths, default=0)

    def _attention_blocks(self) -> list[dict]:
        return [b for b in self.block_configs if b["attention"] is not None]


__all__ = ["HeteroConfig"]
