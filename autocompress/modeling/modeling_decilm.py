"""``DeciLMForCausalLM`` for exported ``nemotron-nas`` checkpoints (remote code).

``autocompress export --format nemotron-nas`` copies this file, its config and
the heterogeneous decoder it builds on next to the weights, and lists it in
``auto_map.AutoModelForCausalLM``, so that
``AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True)``
loads the export where AutoCompress is not installed (siblings, relative imports
only). It needs transformers 5 (the decoder follows its Llama implementation).

The DeciLM config is read the way vLLM's ``nemotron_nas.py`` reads it: query
heads are global, KV heads = ``num_attention_heads // n_heads_in_group``, the
FFN width comes from ``ffn_mult`` when the block has that key, else from
``intermediate_size``; ``attention_bias`` is the o_proj bias and ``qkv_bias`` (if
present) the q/k/v one. The weights keep the Llama names.
"""

from __future__ import annotations

from typing import Any

from .configuration_autocompress_hetero import HeteroConfig
from .configuration_decilm import DeciLMConfig
from .modeling_autocompress_hetero import HeteroForCausalLM

FFN_MULTIPLE = 256


def ffn_width(ffn: Any, hidden_size: int) -> int:
    """The FFN width of a DeciLM block: ``round_up_256(int(2*ffn_mult*hidden/3))`` or as given."""
    if getattr(ffn, "ffn_mult", None) is not None:
        width = int(2 * ffn.ffn_mult * hidden_size / 3)
        return -(-width // FFN_MULTIPLE) * FFN_MULTIPLE
    return int(ffn.intermediate_size)


def _hetero_block(block: Any, heads: int, hidden_size: int, index: int) -> dict[str, Any]:
    attention, ffn = block.attention, block.ffn
    if attention.replace_with_linear or ffn.replace_with_linear:
        raise ValueError(f"block_configs[{index}]: replace_with_linear blocks are not supported")
    hetero: dict[str, Any] = {"attention": None, "ffn": None}
    if not attention.no_op:
        group = int(attention.n_heads_in_group)
        if heads % group:
            raise ValueError(
                f"block_configs[{index}]: num_attention_heads {heads} is not a multiple of "
                f"n_heads_in_group {group}"
            )
        hetero["attention"] = {"num_heads": heads, "num_kv_heads": heads // group}
    if not ffn.no_op:
        hetero["ffn"] = {"intermediate_size": ffn_width(ffn, hidden_size)}
    return hetero


def hetero_config_of(config: DeciLMConfig) -> HeteroConfig:
    """The heterogeneous-decoder config that computes what ``config`` describes."""
    heads, hidden = config.num_attention_heads, config.hidden_size
    blocks = [_hetero_block(b, heads, hidden, i) for i, b in enumerate(config.block_configs)]
    window = getattr(config, "sliding_window", None)
    attention_type = "sliding_attention" if window else "full_attention"
    hetero = HeteroConfig(
        vocab_size=config.vocab_size,
        hidden_size=hidden,
        block_configs=blocks,
        head_dim=getattr(config, "head_dim", None) or hidden // heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=dict(config.rope_parameters),
        attention_bias=bool(getattr(config, "qkv_bias", config.attention_bias)),
        attention_output_bias=bool(config.attention_bias),
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        attention_dropout=getattr(config, "attention_dropout", 0.0),
        sliding_window=window,
        layer_types=[attention_type] * len(blocks),
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        source_model_type=config.model_type,
    )
    hetero._attn_implementation = config._attn_implementation
    return hetero


class DeciLMForCausalLM(HeteroForCausalLM):
    """The heterogeneous decoder built from a DeciLM config.

    ``model.config`` is the equivalent ``HeteroConfig`` (the modules read its
    per-layer shapes); the DeciLM config it came from is ``model.decilm_config``.
    """

    config_class = DeciLMConfig

    def __init__(self, config: DeciLMConfig):
        super().__init__(hetero_config_of(config))
        self.decilm_config = config


__all__ = ["DeciLMForCausalLM", "hetero_config_of"]
