"""A heterogeneous Llama-family decoder as a real transformers model.

Every layer is a pre-norm Llama block (RMSNorm -> attention -> residual, RMSNorm
-> gated MLP -> residual) whose shape comes from ``config.block_configs``: its own
query-head and KV-head counts (GQA), its own FFN width, or no attention / no FFN
at all. Module and weight names match ``LlamaForCausalLM`` exactly, so a Llama,
Mistral, Qwen2 or Qwen3 state dict loads unchanged into the equivalent hetero
model (Qwen2's q/k/v biases and Qwen3's q/k norms included).

This file is saved next to the weights for ``trust_remote_code=True`` loading,
so it only imports transformers, torch and its sibling config file.

It follows the installed ``transformers`` Llama implementation (v5): the KV
cache arrives as ``cache=``, attention goes through ``ALL_ATTENTION_FUNCTIONS``,
and layers without attention are typed ``moe`` in ``config.layer_types`` so the
``DynamicCache`` gives them a dummy slot.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import (
    ALL_ATTENTION_FUNCTIONS,
    PreTrainedModel,
    slice_logits_to_keep,
)
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_autocompress_hetero import HeteroConfig


class HeteroRMSNorm(nn.Module):
    """RMSNorm computed in fp32, as in Llama."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class HeteroRotaryEmbedding(nn.Module):
    """RoPE cos/sin tables; honours ``rope_parameters`` (theta and scaling type)."""

    def __init__(self, config: HeteroConfig):
        super().__init__()
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        rope_init_fn: Callable = self.compute_default_rope_parameters
        if self.rope_type != "default":
            rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = rope_init_fn(config)
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(
        config: HeteroConfig, **kwargs
    ) -> tuple[torch.Tensor, float]:
        base = config.rope_parameters["rope_theta"]
        dim = config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq, 1.0

    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        inv_freq = self.inv_freq.to(device=x.device, dtype=torch.float)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, n_kv, T, d] -> [B, n_kv * n_rep, T, d] (each KV head serves n_rep queries)."""
    batch, num_kv, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, num_kv, n_rep, slen, head_dim)
    return expanded.reshape(batch, num_kv * n_rep, slen, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


class HeteroAttention(nn.Module):
    """GQA self-attention with this layer's own head counts."""

    def __init__(self, config: HeteroConfig, layer_idx: int, num_heads: int, num_kv_heads: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = num_heads
        self.num_key_value_heads = num_kv_heads
        self.num_key_value_groups = num_heads // num_kv_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        is_sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.sliding_window = config.sliding_window if is_sliding else None

        h, d, qkv_bias = config.hidden_size, self.head_dim, config.attention_bias
        self.q_proj = nn.Linear(h, num_heads * d, bias=qkv_bias)
        self.k_proj = nn.Linear(h, num_kv_heads * d, bias=qkv_bias)
        self.v_proj = nn.Linear(h, num_kv_heads * d, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * d, h, bias=config.attention_output_bias)
        if config.qk_norm:  # Qwen3: RMSNorm over head_dim, shared by all heads
            self.q_norm = HeteroRMSNorm(d, eps=config.rms_norm_eps)
            self.k_norm = HeteroRMSNorm(d, eps=config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape)
        key_states = self.k_proj(hidden_states).view(hidden_shape)
        if self.q_norm is not None:
            query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)
        query_states = query_states.transpose(1, 2)
        key_states = key_states.transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            key_states, value_states = cache.update(
                key_states, value_states, self.layer_idx, kwargs=kwargs
            )

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class HeteroMLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)) with this layer's own width."""

    def __init__(self, config: HeteroConfig, intermediate_size: int):
        super().__init__()
        h, width, bias = config.hidden_size, intermediate_size, config.mlp_bias
        self.hidden_size = h
        self.intermediate_size = width
        self.gate_proj = nn.Linear(h, width, bias=bias)
        self.up_proj = nn.Linear(h, width, bias=bias)
        self.down_proj = nn.Linear(width, h, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class HeteroDecoderLayer(GradientCheckpointingLayer):
    """One pre-norm block; a removed sub-block (and its norm) is simply absent."""

    def __init__(self, config: HeteroConfig, layer_idx: int):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.layer_idx = layer_idx
        block = config.block_configs[layer_idx]
        attention, ffn = block["attention"], block["ffn"]
        if attention is not None:
            self.input_layernorm = HeteroRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.self_attn = HeteroAttention(
                config, layer_idx, attention["num_heads"], attention["num_kv_heads"]
            )
        else:
            self.input_layernorm = self.self_attn = None
        if ffn is not None:
            self.post_attention_layernorm = HeteroRMSNorm(
                config.hidden_size, eps=config.rms_norm_eps
            )
            self.mlp = HeteroMLP(config, ffn["intermediate_size"])
        else:
            self.post_attention_layernorm = self.mlp = None

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        if self.self_attn is not None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
                **kwargs,
            )
            hidden_states = residual + hidden_states
        if self.mlp is not None:
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = residual + self.mlp(hidden_states)
        return hidden_states


class HeteroPreTrainedModel(PreTrainedModel):
    config_class = HeteroConfig
    config: HeteroConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HeteroDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    _can_record_outputs = {
        "hidden_states": HeteroDecoderLayer,
        "attentions": HeteroAttention,
    }


class HeteroModel(HeteroPreTrainedModel):
    """Embeddings -> heterogeneous decoder layers -> final RMSNorm."""

    def __init__(self, config: HeteroConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [HeteroDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = HeteroRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = HeteroRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def _causal_masks(self, mask_kwargs: dict) -> dict[str, torch.Tensor | None]:
        """One mask per attention layer type in use; layers without attention get None."""
        types = set(self.config.layer_types)
        masks: dict[str, torch.Tensor | None] = {"moe": None}
        if "full_attention" in types:
            masks["full_attention"] = create_causal_mask(**mask_kwargs)
        if "sliding_attention" in types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        return masks

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
            position_ids = (position_ids + past_seen_tokens).unsqueeze(0)

        # `generate` may already have prepared the masks as a dict.
        if not isinstance(causal_mask_mapping := attention_mask, dict):
            causal_mask_mapping = self._causal_masks(
                {
                    "config": self.config,
                    "inputs_embeds": inputs_embeds,
                    "attention_mask": attention_mask,
                    "cache": cache,
                    "position_ids": position_ids,
                }
            )

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        for i, decoder_layer in enumerate(self.layers[: self.config.num_hidden_layers]):
            hidden_states = decoder_layer(
                hidden_states,
                attention_mask=causal_mask_mapping.get(self.config.layer_types[i]),
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                **kwargs,
            )
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, cache=cache)


class HeteroForCausalLM(HeteroPreTrainedModel, GenerationMixin):
    """Heterogeneous decoder with a language-modelling head (tied or not)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: HeteroConfig):
        super().__init__(config)
        self.model = HeteroModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        outputs: BaseModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


__all__ = ["HeteroForCausalLM", "HeteroModel", "HeteroPreTrainedModel"]
