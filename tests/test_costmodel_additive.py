"""The additive decomposition and its differentiable expectation."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.costmodel import CostModel, Target, Workload, expected_costs, expected_max
from autocompress.costmodel.laws import ActivationLaw, LinearLaw
from autocompress.costmodel.probes import ProbeSampler

REFERENCE = ArchSpec.uniform(
    num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=2, intermediate_size=768,
    head_dim=32, vocab_size=4096, tie_word_embeddings=True,
)
WORKLOAD = Workload(isl=96, osl=12, batch=3)


def _fitted_like_cpu_model() -> CostModel:
    """A linear-law model with arbitrary positive coefficients (as a fit would produce)."""
    from autocompress.hardware import HardwareSpec

    cpu = HardwareSpec(name="cpu-local", display_name="test cpu", kind="cpu", memory_gib=8,
                       bandwidth_gb_s=10, flops_tflops={"fp32": 0.05, "bf16": 0.01})
    base = Target.parse("h100-sxm/hf-eager/bf16")
    target = base.model_copy(update={"hardware": cpu, "dtype": "fp32"})
    rng = random.Random(3)
    names = ["attn.call", "attn.flops", "attn.tokens", "attn.scores", "attn.hidden", "ffn.call",
             "ffn.flops", "ffn.tokens", "ffn.hidden", "const.call", "const.hidden",
             "const.head_flops", "attn.weight_bytes", "attn.kv_bytes", "attn.context",
             "ffn.weight_bytes", "const.head_bytes"]
    prefill = {n: rng.uniform(0, 1e-6) for n in names}
    decode = {n: rng.uniform(0, 1e-6) for n in names}
    prefill["attn.call"] = decode["attn.call"] = 0.3
    activation = ActivationLaw(coefficients={
        "attn.qkv_bytes": 1.7, "attn.score_bytes": 0.4, "attn.cache_copy_bytes": 1.0,
        "ffn.width_bytes": 3.2, "const.one": 1e5, "const.hidden_bytes": 2.5,
        "const.logit_bytes": 1.0,
    })
    return CostModel(target=target, timing=LinearLaw(prefill=prefill, decode=decode),
                     activation=activation)


def _fitted_like_llamacpp_model() -> CostModel:
    """The same arbitrary coefficients on llama.cpp, whose features depend on the layer
    (the last layer's FFN runs on the output rows) and on the KV view."""
    model = _fitted_like_cpu_model()
    rng = random.Random(4)
    extra = ["attn.view_cells", "attn.tile_cells", "attn.vector_cells"]
    timing = LinearLaw(prefill={**model.timing.prefill, **{n: rng.uniform(0, 1e-6) for n in extra}},
                       decode={**model.timing.decode, "attn.view_cells": 1e-6})
    activation = ActivationLaw(coefficients={**model.activation.coefficients,
                                             "const.mask_bytes": 0.7})
    return CostModel(target=Target.parse("cpu-local/llama.cpp/q8_0"), timing=timing,
                     activation=activation)


MODELS = {
    "vllm-h100": lambda: CostModel.analytic(Target.parse("h100-sxm/vllm/bf16")),
    "trtllm-5070-fp8": lambda: CostModel.analytic(Target.parse("rtx-5070/trtllm/fp8")),
    "hf-eager-tp2": lambda: CostModel.analytic(Target.parse("h200/hf-eager/bf16", tp=2)),
    "fitted-cpu": _fitted_like_cpu_model,
    "fitted-llamacpp": _fitted_like_llamacpp_model,
}


def _space():
    space = ProbeSampler.around(REFERENCE)
    return (list(space.hidden_options), list(space.attention_options),
            list(space.ffn_options))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_one_hot_expectation_equals_discrete_prediction(name):
    model = MODELS[name]()
    hidden, attention, ffn = _space()
    costs = model.additive_costs(REFERENCE, WORKLOAD, hidden, attention, ffn)
    rng = random.Random(0)
    for _ in range(15):
        a = [rng.randrange(len(attention)) for _ in range(4)]
        a[0] = 0  # keep one attention block: a legal model
        f = [rng.randrange(len(ffn)) for _ in range(4)]
        h = rng.randrange(len(hidden))
        spec = costs.spec_of(a, f, h)
        predicted = model.predict(spec, WORKLOAD)
        got = costs.discrete(a, f, h)
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms", "memory_gb"):
            assert got[metric] == pytest.approx(getattr(predicted, metric), rel=1e-12, abs=0)


def test_costs_are_additive_over_blocks():
    """Changing one block changes the prediction by exactly that block's table difference."""
    model = _fitted_like_cpu_model()
    hidden, attention, ffn = _space()
    costs = model.additive_costs(REFERENCE, WORKLOAD, hidden, attention, ffn)
    base = model.predict(costs.spec_of([0, 0, 0, 0], [0, 0, 0, 0], 1), WORKLOAD)
    changed = model.predict(costs.spec_of([0, 0, 3, 0], [0, 0, 0, 0], 1), WORKLOAD)
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        table = costs.attention[metric]
        delta = float(table[2, 3, 1] - table[2, 0, 1])
        assert getattr(changed, metric) - getattr(base, metric) == pytest.approx(delta, rel=1e-9)
    # Removing an FFN block removes its weights from memory exactly.
    removed = model.predict(costs.spec_of([0, 0, 0, 0], [0, len(ffn) - 1, 0, 0], 1), WORKLOAD)
    weights = costs.ffn["memory_gb"][1, 0, 1] - costs.ffn["memory_gb"][1, -1, 1]
    assert base.memory.weights - removed.memory.weights == pytest.approx(float(weights) * 1e9)


def test_expected_costs_are_differentiable_and_interpolate():
    model = MODELS["vllm-h100"]()
    hidden, attention, ffn = _space()
    costs = model.additive_costs(REFERENCE, WORKLOAD, hidden, attention, ffn)
    logits_a = torch.randn(4, len(attention), dtype=torch.float64, requires_grad=True)
    logits_f = torch.randn(4, len(ffn), dtype=torch.float64, requires_grad=True)
    logits_h = torch.randn(len(hidden), dtype=torch.float64, requires_grad=True)
    out = expected_costs(costs, logits_a.softmax(-1), logits_f.softmax(-1), logits_h.softmax(-1))
    sum(out.values()).backward()
    out = {k: v.detach() for k, v in out.items()}
    for grad in (logits_a.grad, logits_f.grad, logits_h.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # An expectation lies between the cheapest and the dearest architecture.
    smallest = costs.discrete([len(attention) - 1] * 4, [len(ffn) - 1] * 4, len(hidden) - 1)
    largest = costs.discrete([0] * 4, [0] * 4, 0)
    for metric, value in out.items():
        assert smallest[metric] <= value.item() <= largest[metric]


def test_expected_max_matches_enumeration():
    rng = torch.Generator().manual_seed(0)
    values = [torch.rand(3, 3, generator=rng, dtype=torch.float64),
              torch.rand(2, 4, generator=rng, dtype=torch.float64)]
    values[0][0, 1] = 0.0  # a no-op option
    probs = [torch.rand(3, 3, generator=rng, dtype=torch.float64).softmax(-1),
             torch.rand(2, 4, generator=rng, dtype=torch.float64).softmax(-1)]
    variables = [(values[0][i], probs[0][i]) for i in range(3)]
    variables += [(values[1][i], probs[1][i]) for i in range(2)]
    brute = 0.0
    for choice in itertools.product(*[range(len(v)) for v, _ in variables]):
        weight, peak = 1.0, 0.0
        for (v, p), k in zip(variables, choice, strict=True):
            weight *= float(p[k])
            peak = max(peak, float(v[k]))
        brute += weight * peak
    assert float(expected_max(values, probs)) == pytest.approx(brute, rel=1e-12)


def test_per_layer_option_lists_and_shape_checks():
    model = MODELS["vllm-h100"]()
    per_layer_att = [[AttentionSpec(num_heads=8, num_kv_heads=2), None]] + [
        [AttentionSpec(num_heads=4, num_kv_heads=1), None]
    ] * 3
    costs = model.additive_costs(REFERENCE, WORKLOAD, [256], per_layer_att,
                                 [FFNSpec(intermediate_size=768), None])
    assert costs.attention["tpot_ms"].shape == (4, 2, 1)
    spec = costs.spec_of([0, 0, 1, 0], [0, 1, 0, 0], 0)
    assert spec.layers[1] == LayerSpec(attention=AttentionSpec(num_heads=4, num_kv_heads=1),
                                       ffn=None)
    with pytest.raises(ValueError, match="p_attention"):
        costs.expected(torch.ones(4, 3, dtype=torch.float64) / 3,
                       torch.ones(4, 2, dtype=torch.float64) / 2,
                       torch.ones(1, dtype=torch.float64))
