"""Architectures to fit and validate cost models on, drawn from the search's space.

The options are the search's own (``search.options.space_options`` with the default
``SpaceConfig``: hidden sizes, attention as KV groups × query heads per group, FFN
widths, each block removable), so fitting and validation see the architectures the
search will produce. ``sample`` draws heterogeneous specs (each block independently,
removals with a given probability, the first layer always keeps attention so the model
is legal); ``probe_specs`` is the designed probe set of a fit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec

# Block-removal probabilities of the i-th of n sampled specs run evenly over
# [0, MAX_REMOVAL): samples span shallow to full-depth models, as the search's
# results do at tight and loose budgets. (A fixed low probability gave nearly
# all samples full depth, a narrow cost range in which a ranking says little.)
MAX_REMOVAL = 0.6

# Layers of the paired-timing reference (``costmodel.measure``). The reference only has
# to live through the same phase of the machine as each probe, so its size is free; a
# teacher-sized one made every probe run cost a whole teacher run on top (30 layers for
# SmolLM2-135M). The default teacher (8 layers) keeps its own shape.
REFERENCE_MAX_LAYERS = 8


@dataclass(frozen=True)
class ProbeSampler:
    """Draws architectures around ``reference`` from the search's options."""

    reference: ArchSpec
    hidden_options: tuple[int, ...]
    attention_options: tuple[AttentionSpec | None, ...]  # None (removed) last
    ffn_options: tuple[FFNSpec | None, ...]  # None (removed) last

    @classmethod
    def around(cls, reference: ArchSpec, multiple: int = 16,
               export_engine: str | None = None) -> ProbeSampler:
        """The search's default space around ``reference`` (sizes: multiples of ``multiple``;
        with ``export_engine``, only what that engine computes exactly: ``engine_rules``)."""
        from autocompress.arch_search.options import SpaceConfig, space_options

        config = SpaceConfig(granularity=multiple, export_engine=export_engine)
        hidden, attention, ffn = space_options(reference, config)
        return cls(reference, tuple(hidden), tuple(attention), tuple(ffn))

    @classmethod
    def for_target(cls, reference: ArchSpec, target: Any) -> ProbeSampler:
        """The space a search for ``target`` has (``search.context.obeying_the_engine``): a
        vLLM target's holds only what vLLM loads exactly, so its probes can be served."""
        return cls.around(reference, export_engine="vllm" if target.engine.name == "vllm"
                          else None)

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


def timing_reference_spec(base: ArchSpec, max_layers: int = REFERENCE_MAX_LAYERS) -> ArchSpec:
    """The reference a fit times against: ``base``'s first ``max_layers`` layers (all of a
    smaller model). The fit records it; validation and ``verify`` time against the same."""
    if base.num_layers <= max_layers:
        return base
    return base.model_copy(update={"layers": list(base.layers[:max_layers])})


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
