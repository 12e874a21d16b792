"""A default search space around a teacher, for probing and validating cost models.

The search (issue 5) owns the real choice sets; this one mirrors ``search.space`` so
that fitting and validation see the architectures the search will produce:

- hidden size: 100%, 87.5%, 75%, 62.5%, 50% of the teacher's (multiples of 16);
- attention per layer: ``kv`` KV groups (each divisor of the teacher's count)
  × ``g`` query heads per group (1 … teacher's), or removed;
- FFN per layer: 100%, 75%, 50%, 25% of the teacher's width (multiples of 16),
  or removed.

``sample`` draws heterogeneous specs (each block independently, removals with a
small probability, the first layer always keeps attention so the model is legal).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec

HIDDEN_FRACTIONS = (1.0, 0.875, 0.75, 0.625, 0.5)
# Block-removal probabilities of the i-th of n sampled specs run evenly over
# [0, MAX_REMOVAL): samples span shallow to full-depth models, as the search's
# results do at tight and loose budgets. (A fixed low probability gave nearly
# all samples full depth, a narrow cost range in which a ranking says little.)
MAX_REMOVAL = 0.6
FFN_FRACTIONS = (1.0, 0.75, 0.5, 0.25)


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


@dataclass(frozen=True)
class SearchSpace:
    reference: ArchSpec
    hidden_options: tuple[int, ...]
    attention_options: tuple[AttentionSpec | None, ...]  # None (removed) last
    ffn_options: tuple[FFNSpec | None, ...]  # None (removed) last

    @classmethod
    def around(cls, reference: ArchSpec, multiple: int = 16) -> SearchSpace:
        """The default space of a (homogeneous or not) teacher spec."""
        h = reference.hidden_size
        hidden = tuple(dict.fromkeys(_round_to(h * f, multiple) for f in HIDDEN_FRACTIONS))
        first_att = next(layer.attention for layer in reference.layers if layer.attention)
        width = max(layer.ffn.intermediate_size for layer in reference.layers if layer.ffn)
        groups = first_att.num_heads // first_att.num_kv_heads
        kv_choices = [k for k in range(1, first_att.num_kv_heads + 1)
                      if first_att.num_kv_heads % k == 0]
        attention = tuple(
            AttentionSpec(num_heads=kv * g, num_kv_heads=kv)
            for kv in sorted(kv_choices, reverse=True)
            for g in range(groups, 0, -1)
        )
        ffn = tuple(
            FFNSpec(intermediate_size=w)
            for w in dict.fromkeys(_round_to(width * f, multiple) for f in FFN_FRACTIONS)
        )
        return cls(reference, hidden, (*attention, None), (*ffn, None))

    def sample(self, rng: random.Random, p_remove: float = 0.15) -> ArchSpec:
        """One heterogeneous spec drawn from the space."""
        kept_att = [o for o in self.attention_options if o is not None]
        kept_ffn = [o for o in self.ffn_options if o is not None]
        layers = []
        for index in range(self.reference.num_layers):
            removable = index > 0
            att = None if removable and rng.random() < p_remove else rng.choice(kept_att)
            ffn = None if rng.random() < p_remove else rng.choice(kept_ffn)
            layers.append(LayerSpec(attention=att, ffn=ffn))
        hidden = rng.choice(self.hidden_options)
        return self.reference.model_copy(update={"hidden_size": hidden, "layers": layers})

    def uniform(self, hidden: int, attention: AttentionSpec | None,
                ffn: FFNSpec | None) -> ArchSpec:
        """Every layer the same (the first layer keeps attention if ``attention`` is None)."""
        first_att = attention or self.attention_options[-2]
        layers = [LayerSpec(attention=first_att if i == 0 and attention is None else attention,
                            ffn=ffn) for i in range(self.reference.num_layers)]
        return self.reference.model_copy(update={"hidden_size": hidden, "layers": layers})

    def sample_spread(self, count: int, rng: random.Random) -> list[ArchSpec]:
        """``count`` distinct specs whose removal probability is stratified over depths."""
        specs: dict[str, ArchSpec] = {}
        attempt = 0
        while len(specs) < count:
            p_remove = MAX_REMOVAL * ((len(specs) + rng.random()) / count)
            spec = self.sample(rng, p_remove=p_remove)
            specs.setdefault(spec.to_json(indent=None), spec)
            attempt += 1
            if attempt > 100 * count:
                raise ValueError(f"the space has fewer than {count} distinct specs")
        order = list(specs.values())
        rng.shuffle(order)  # measured in random order of size
        return order

    def probe_specs(self, count: int, seed: int = 0) -> list[ArchSpec]:
        """A designed probe set: the corners of the space, then random samples."""
        largest_att, smallest_att = self.attention_options[0], self.attention_options[-2]
        largest_ffn, smallest_ffn = self.ffn_options[0], self.ffn_options[-2]
        h_max, h_min = self.hidden_options[0], self.hidden_options[-1]
        corners = [
            self.uniform(h_max, largest_att, largest_ffn),  # the teacher's shape
            self.uniform(h_min, smallest_att, smallest_ffn),
            self.uniform(h_max, largest_att, None),  # attention only
            self.uniform(h_max, None, largest_ffn),  # FFN only (+ one attention)
            self.uniform(h_min, largest_att, largest_ffn),
            self.uniform(h_max, smallest_att, smallest_ffn),
        ]
        probes = corners[:count]
        if len(probes) < count:
            probes += self.sample_spread(count - len(probes), random.Random(seed))
        return probes


def default_base_config() -> Any:
    """The default teacher's config, or a LlamaConfig of its documented shape.

    Until ``autocompress teacher train`` has written the bundled teacher, the
    cost model is fitted and validated on the same shape: Llama, hidden 256,
    8 layers, 8 heads of 32, 2 KV heads, FFN 768, vocabulary 4096, tied embeddings.
    """
    from transformers import AutoConfig, LlamaConfig

    from autocompress import paths

    config_file = paths.default_teacher_dir() / "config.json"
    if config_file.exists():
        return AutoConfig.from_pretrained(config_file.parent)
    return LlamaConfig(
        hidden_size=256,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=768,
        vocab_size=4096,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
