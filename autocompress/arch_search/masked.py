"""A masked forward of the teacher: the pruned model's output without pruning.

``MaskedTeacher(model, space)`` runs the teacher's own weights (frozen, never
copied) through a functional Llama-family forward in which every prunable
dimension is multiplied by a mask vector built from choice weights:

- hidden channels: the residual stream is masked, each RMSNorm divides by the
  number of *kept* channels (so it equals the norm of the sliced model), and
  every block's output is masked again;
- FFN neurons: the input of ``down_proj`` is masked;
- query heads: each head's attention output (the input of ``o_proj``) is masked;
- KV groups: each KV variant ``G'`` (a divisor of the teacher's ``G``) is run
  with K/V mean-pooled over contiguous clusters of ``G/G'`` groups — the same
  pooling ``prune`` applies to the K/V weights (pooling the projection output
  equals projecting with the pooled weights; Qwen3's k-norm comes after the
  pooling, as in the pruned model). The output is the mask-weighted sum over
  variants, so with a one-hot choice it is *exactly* the pruned attention;
- a no-op block contributes nothing (its output, biases included, times 0).

With one-hot weights the logits equal those of ``prune(teacher, importance,
spec)`` (tested). With straight-through Gumbel samples (hard in the forward,
soft in the backward) the gradient reaches every option's weight, because each
option's contribution is a mask over quantities computed anyway.

Weights: ``w_hidden [H]``, ``w_attention [L, Ka]``, ``w_ffn [L, Kf]`` (rows sum to 1).
Attention is full causal attention (a sliding window shorter than the sequence
is refused).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autocompress.arch_search.space import Choice, SearchSpace
from autocompress.errors import AutoCompressError


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``[B, heads, T, d]`` with ``cos/sin [B, T, d]`` (Llama convention)."""
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def _masked_rms(x: torch.Tensor, norm: nn.Module, kept: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the kept channels only (masked channels of ``x`` are zero)."""
    variance = x.pow(2).sum(-1, keepdim=True) / kept
    return norm.weight * (x * torch.rsqrt(variance + norm.variance_epsilon))


class MaskedTeacher(nn.Module):
    """Differentiable-in-the-masks forward of a Llama-family teacher."""

    def __init__(self, model: nn.Module, space: SearchSpace):
        super().__init__()
        self.model = model.eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.space = space
        config = model.config
        window = getattr(config, "sliding_window", None)
        if window is not None and getattr(config, "use_sliding_window", True) and window < 4096:
            self.sliding_window = int(window)
        else:
            self.sliding_window = None
        att = space.teacher.layers[0].attention
        self.num_heads, self.num_groups = att.num_heads, att.num_kv_heads
        self.head_dim = space.teacher.head_dim
        self.scaling = self.head_dim**-0.5
        for name in ("hidden_masks", "ffn_masks", "head_masks", "attention_alive", "ffn_alive"):
            self.register_buffer(name, getattr(space, name).float(), persistent=False)

    # ------------------------------------------------------------ weights
    def one_hot(self, choice: Choice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Choice weights of one architecture."""
        s = self.space
        w_hidden = F.one_hot(torch.tensor(choice.hidden), len(s.hidden_options)).float()
        w_att = F.one_hot(torch.tensor(choice.attention), len(s.attention_options)).float()
        w_ffn = F.one_hot(torch.tensor(choice.ffn), len(s.ffn_options)).float()
        return w_hidden, w_att, w_ffn

    # ------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        w_hidden: torch.Tensor,
        w_attention: torch.Tensor,
        w_ffn: torch.Tensor,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, vocab]`` of the architecture the weights select.

        ``return_hidden`` also returns the final normed hidden states ``[B, T, h]``.
        """
        if self.sliding_window is not None and input_ids.shape[1] > self.sliding_window:
            raise AutoCompressError(
                f"sequence of {input_ids.shape[1]} tokens exceeds the sliding window "
                f"{self.sliding_window}", hint="use a shorter dnas.seq_len for the search",
            )
        return self._run(input_ids, w_hidden, w_attention, w_ffn, return_hidden=return_hidden)

    def forward_choice(self, input_ids: torch.Tensor, choice: Choice) -> torch.Tensor:
        """Logits of one discrete architecture."""
        return self(input_ids, *self.one_hot(choice))

    @torch.no_grad()
    def block_inputs(self, input_ids: torch.Tensor, choice: Choice) -> list[torch.Tensor]:
        """The residual stream entering each block of ``choice``: attention of layer ``i``
        is block ``2i``, its FFN ``2i + 1``. An architecture that differs from ``choice``
        only from block ``j`` on computes the same stream up to there (``forward_from``)."""
        entering: list[torch.Tensor] = []
        self._run(input_ids, *self.one_hot(choice), record=entering)
        return entering

    @torch.no_grad()
    def forward_from(self, input_ids: torch.Tensor, choice: Choice, block: int,
                     entering: torch.Tensor) -> torch.Tensor:
        """Logits of ``choice`` from block ``block`` on, given the stream ``entering`` it
        (``block_inputs`` of an architecture equal to ``choice`` before that block): the
        measured scores change one block at a time, so each skips the blocks before it."""
        return self._run(input_ids, *self.one_hot(choice), start=block, entering=entering)

    def _run(self, input_ids, w_hidden, w_attention, w_ffn, return_hidden: bool = False,
             start: int = 0, entering: torch.Tensor | None = None,
             record: list[torch.Tensor] | None = None):
        base = self.model.model
        hidden_mask = w_hidden @ self.hidden_masks  # [h]
        kept = hidden_mask.sum()
        x = base.embed_tokens(input_ids) * hidden_mask if entering is None else entering
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        cos, sin = base.rotary_emb(x, positions)
        for block in range(start, 2 * len(base.layers)):
            index, is_ffn = divmod(block, 2)
            layer = base.layers[index]
            if record is not None:
                record.append(x)  # never modified in place: each block makes a new tensor
            if not is_ffn and self._needed(layer, "self_attn", w_attention[index],
                                           self.attention_alive):
                x = x + self._attention(layer, index, x, cos, sin, kept,
                                        w_attention[index]) * hidden_mask
            elif is_ffn and self._needed(layer, "mlp", w_ffn[index], self.ffn_alive):
                x = x + self._ffn(layer, index, x, kept, w_ffn[index]) * hidden_mask
        normed = _masked_rms(x, base.norm, kept)
        logits = self.model.lm_head(normed)
        return (logits, normed) if return_hidden else logits

    # ------------------------------------------------------------- blocks
    @staticmethod
    def _needed(layer, name: str, weights: torch.Tensor, alive: torch.Tensor) -> bool:
        """Run a block unless it is absent, or removed while no gradient is needed."""
        if getattr(layer, name, None) is None:
            return False
        return torch.is_grad_enabled() or bool((weights @ alive).any())

    def _attention(self, layer, index, x, cos, sin, kept, weights) -> torch.Tensor:
        attn = layer.self_attn
        batch, seq, _ = x.shape
        d, nq, groups = self.head_dim, self.num_heads, self.num_groups
        normed = _masked_rms(x, layer.input_layernorm, kept)
        q = attn.q_proj(normed).view(batch, seq, nq, d).transpose(1, 2)
        k = attn.k_proj(normed).view(batch, seq, groups, d).transpose(1, 2)
        v = attn.v_proj(normed).view(batch, seq, groups, d).transpose(1, 2)
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q)
        q = _rope(q, cos, sin)
        heads = torch.zeros_like(q)
        for variant, kv in enumerate(self.space.kv_variants):
            head_mask = weights @ self.head_masks[index, :, variant]  # [nq]
            if not torch.is_grad_enabled() and not bool(head_mask.any()):
                continue  # evaluation only: a variant nobody selected adds nothing
            kk, vv = self._pooled(k, kv), self._pooled(v, kv)
            if getattr(attn, "k_norm", None) is not None:
                kk = attn.k_norm(kk)
            kk = _rope(kk, cos, sin)
            repeat = nq // kv  # query head h reads pooled KV head h // (nq / kv)
            out = F.scaled_dot_product_attention(
                q, kk.repeat_interleave(repeat, dim=1), vv.repeat_interleave(repeat, dim=1),
                is_causal=True, scale=self.scaling,
            )
            heads = heads + out * head_mask.view(1, nq, 1, 1)
        alive = weights @ self.attention_alive
        heads = heads.transpose(1, 2).reshape(batch, seq, nq * d)
        return attn.o_proj(heads) * alive

    def _pooled(self, kv_states: torch.Tensor, kv: int) -> torch.Tensor:
        """Mean over contiguous clusters of ``G/kv`` groups: ``[B, G, T, d] -> [B, kv, T, d]``."""
        if kv == self.num_groups:
            return kv_states
        batch, groups, seq, d = kv_states.shape
        return kv_states.view(batch, kv, groups // kv, seq, d).mean(dim=2)

    def _ffn(self, layer, index, x, kept, weights) -> torch.Tensor:
        mlp = layer.mlp
        normed = _masked_rms(x, layer.post_attention_layernorm, kept)
        neuron_mask = weights @ self.ffn_masks[index]  # [I]
        inner = mlp.act_fn(mlp.gate_proj(normed)) * mlp.up_proj(normed) * neuron_mask
        alive = weights @ self.ffn_alive
        return mlp.down_proj(inner) * alive
