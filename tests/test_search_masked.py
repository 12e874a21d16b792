"""The masked teacher equals the pruned model, and the search space's masks are nested."""

from __future__ import annotations

import random

import pytest
import torch

from autocompress.arch_search.dnas import _straight_through
from autocompress.arch_search.masked import MaskedTeacher
from autocompress.arch_search.space import Choice, SearchSpace, SpaceConfig
from autocompress.importance import compute_importance
from autocompress.modeling import arch_spec_of
from autocompress.modeling.tiny import FAMILIES, tiny_model
from autocompress.prune import prune

VOCAB = 128


def _setup(family: str, tied: bool = False, seed: int = 0):
    model = tiny_model(family, tied=tied, gqa_ratio=2, num_heads=8, num_layers=3, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, VOCAB, (2, 16), generator=gen) for _ in range(2)]
    imp = compute_importance(model, batches, removal_batches=0, progress=False)
    space = SearchSpace.build(arch_spec_of(model), imp,
                              SpaceConfig(granularity=8, protect_first_last=False))
    return model, imp, space


def _random_choice(space: SearchSpace, rng: random.Random) -> Choice:
    while True:
        choice = Choice(
            rng.randrange(len(space.hidden_options)),
            tuple(rng.randrange(len(space.attention_options)) for _ in range(space.num_layers)),
            tuple(rng.randrange(len(space.ffn_options)) for _ in range(space.num_layers)),
        )
        if space.is_legal(choice):
            return choice


@pytest.mark.parametrize("family", FAMILIES)
def test_full_choice_reproduces_teacher_logits(family):
    model, _, space = _setup(family, tied=family in ("qwen3", "llama"))
    masked = MaskedTeacher(model, space)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got = masked.forward_choice(ids, space.full_choice())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_one_hot_choice_equals_pruned_model(family):
    """Every option (incl. fewer KV groups, no-ops, smaller hidden) is the pruned model."""
    model, imp, space = _setup(family, tied=family == "qwen3", seed=1)
    masked = MaskedTeacher(model, space)
    rng = random.Random(family)
    ids = torch.randint(0, VOCAB, (2, 10))
    kinds = set()
    for _ in range(6):
        choice = _random_choice(space, rng)
        spec = space.spec_of(choice)
        kinds |= {a.num_kv_heads for a in (la.attention for la in spec.layers) if a}
        with torch.no_grad():
            expected = prune(model, imp, spec)(input_ids=ids).logits
            got = masked.forward_choice(ids, choice)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert len(kinds) > 1, "the random choices should cover several KV-group counts"


def test_masks_are_nested_prefixes():
    _, imp, space = _setup("llama")
    h = space.hidden_masks
    assert torch.all(h[:-1] >= h[1:]), "a smaller hidden option keeps a subset"
    assert h.sum(1).tolist() == [float(x) for x in space.hidden_options]
    ffn = space.ffn_masks[0]
    assert torch.all(ffn[:-1] >= ffn[1:])
    assert ffn[-1].sum() == 0  # the no-op
    order = imp.ffn_order(0)
    width = space.ffn_options[2].intermediate_size
    assert set(torch.nonzero(ffn[2]).flatten().tolist()) == set(order[:width].tolist())


def test_straight_through_gradient_reaches_every_option():
    model, _, space = _setup("llama")
    masked = MaskedTeacher(model, space)
    alpha = [torch.zeros(len(space.hidden_options), requires_grad=True),
             torch.zeros(space.num_layers, len(space.attention_options), requires_grad=True),
             torch.zeros(space.num_layers, len(space.ffn_options), requires_grad=True)]
    gen = torch.Generator().manual_seed(0)
    weights = [_straight_through(a, 0.5, gen) for a in alpha]
    for w in weights:  # the forward sees one-hot samples
        assert torch.equal(w.detach().sum(-1), torch.ones_like(w.detach().sum(-1)))
        assert set(w.detach().unique().tolist()) <= {0.0, 1.0}
    ids = torch.randint(0, VOCAB, (2, 8))
    masked(ids, *weights).logsumexp(-1).mean().backward()
    for a in alpha:
        assert a.grad is not None and bool((a.grad != 0).any())
    assert all(p.grad is None for p in model.parameters()), "teacher weights stay frozen"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_measured_scores_from_a_blocks_input_equal_whole_forwards(family):
    """A one-block change run from that block's input (the stream before it is the
    anchor's) scores exactly what the whole forward of the changed architecture scores."""
    from autocompress.arch_search.discretize import choice_kl, measured_scores, teacher_logits

    model, _, space = _setup(family, tied=family == "qwen3", seed=2)
    masked = MaskedTeacher(model, space)
    anchor = _random_choice(space, random.Random(family))
    batches = [torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    scores = measured_scores(masked, anchor, batches, radius=None)
    reference = teacher_logits(model, batches)
    base = choice_kl(masked, anchor, batches, reference)
    checked = 0
    for kind, table in (("attention", scores.attention), ("ffn", scores.ffn)):
        for layer in range(space.num_layers):
            for k in range(table.shape[1]):
                cand = anchor.replace_block(kind, layer, k)
                if k == getattr(anchor, kind)[layer] or not space.is_legal(cand) \
                        or not torch.isfinite(torch.tensor(table[layer, k])):
                    continue
                whole = choice_kl(masked, cand, batches, reference) - base
                assert table[layer, k] == pytest.approx(whole, abs=1e-6)
                checked += 1
    assert checked >= 2 * space.num_layers  # several options of every layer's two blocks
