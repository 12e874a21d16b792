"""The measuring harness and validation on tiny real models (no timed assertions)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.costmodel import CostModel, Target, Workload, measure_many, measure_model
from autocompress.costmodel.measure import generate_once, model_bytes, prompt_ids

TINY = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=256,
                   tie_word_embeddings=True, max_position_embeddings=512)


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(TINY).eval()


def test_generate_once_matches_generate(llama):
    """The harness decodes exactly what transformers' greedy generate produces."""
    workload = Workload(isl=12, osl=6)
    ids = prompt_ids(llama, workload, seed=3)
    _, steps, cache = generate_once(llama, ids, workload.osl)
    assert len(steps) == workload.osl - 1
    assert cache.get_seq_length() == workload.final_context
    reference = llama.generate(ids, max_new_tokens=workload.osl, do_sample=False,
                               attention_mask=torch.ones_like(ids))
    # Re-run the harness loop, collecting the tokens it chooses.
    from transformers import DynamicCache

    tokens, cache = [], DynamicCache(config=llama.config)
    with torch.inference_mode():
        out = llama(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for _ in range(workload.osl):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            out = llama(input_ids=token, cache=cache, use_cache=True)
    assert torch.equal(torch.cat(tokens, 1), reference[:, ids.shape[1]:])


def test_measure_model_reports_robust_statistics(llama):
    workload = Workload(isl=32, osl=5, batch=2)
    m = measure_model(llama, workload, repeats=3, warmup=1)
    assert m.ttft_ms.n == 3 and m.tpot_ms.n == 3 and m.tpot_steps_ms.n == 3 * 4
    t = m.ttft_ms
    assert 0 < t.minimum <= t.p10 <= t.q1 <= t.median <= t.q3
    assert m.metrics("floor")["tpot_ms"] <= m.tpot_steps_ms.median
    assert m.tpot_ms.median > 0
    assert m.e2e_ms == pytest.approx(m.ttft_ms.median + 4 * m.tpot_ms.median)
    assert m.throughput_tok_s == pytest.approx(2000 / m.tpot_ms.median)
    assert m.memory_bytes >= model_bytes(llama)
    assert m.threads == torch.get_num_threads() and m.device == "cpu"


def test_memory_grows_with_the_kv_cache(llama):
    """Peak memory follows the cache: 8 sequences need at least the extra KV bytes."""
    small = Workload(isl=256, osl=4, batch=1)
    large = small.with_overrides(batch=8)
    m_small = measure_model(llama, small, repeats=1, warmup=0)
    m_large = measure_model(llama, large, repeats=1, warmup=0)
    assert m_small.memory_method == "cpu-live-tensor-bytes"
    kv = m_large.memory_detail["final_cache"] - m_small.memory_detail["final_cache"]
    assert kv == 7 * m_small.memory_detail["final_cache"]
    assert m_large.memory_bytes - m_small.memory_bytes >= kv
    # Repeating a memory measurement gives nearly the same figure.
    again = measure_model(llama, large, repeats=1, warmup=0)
    assert again.memory_bytes == m_large.memory_bytes  # exact, not sampled


def test_measure_many_interleaves_hetero_models():
    """Heterogeneous models (first layer without attention included) measure side by side."""
    from autocompress.modeling import build_model

    base = ArchSpec.from_hf_config(TINY)
    specs = [
        base,
        base.model_copy(update={"layers": [
            LayerSpec(attention=None, ffn=FFNSpec(intermediate_size=64)),
            LayerSpec(attention=AttentionSpec(num_heads=2, num_kv_heads=1), ffn=None),
        ]}),
    ]
    models = [build_model(spec, TINY, seed=i) for i, spec in enumerate(specs)]
    results = measure_many(models, Workload(isl=16, osl=4), repeats=2, warmup=1,
                           progress=False)
    assert len(results) == 2
    assert all(r.ttft_ms.n == 2 and r.tpot_ms.median > 0 for r in results)
    assert results[1].memory_detail["final_cache"] < results[0].memory_detail["final_cache"]


def test_validation_report_and_plot(tmp_path, autocompress_home):
    """A tiny end-to-end validation: JSON keys, finite scores, a PNG."""
    from autocompress.costmodel.validate import plot_validation, validate_cost_model
    from autocompress.hardware import HardwareSpec

    cpu = HardwareSpec(name="cpu-local", display_name="cpu", kind="cpu", memory_gib=4,
                       bandwidth_gb_s=10, flops_tflops={"fp32": 0.05})
    target = Target.parse("h100-sxm/hf-eager/bf16").model_copy(
        update={"hardware": cpu, "dtype": "fp32"})
    model = CostModel.analytic(target)
    report = validate_cost_model(model, TINY, [Workload(name="tiny", isl=16, osl=4)], n=4,
                                 repeats=1, warmup=1, progress=False)
    data = json.loads(report.model_dump_json())
    assert data["n"] == 4 and len(data["samples"]) == 4
    for key in ("ttft", "tpot", "memory"):
        assert data["mape"][key] >= 0 and -1 <= data["kendall_tau"][key] <= 1
    assert {"measured", "predicted", "spread", "spec"} <= set(data["samples"][0])
    floor = data["samples"][0]["measured_by_statistic"]["floor"]
    median = data["samples"][0]["measured_by_statistic"]["median"]
    assert floor["tpot_ms"] <= median["tpot_ms"] and floor["memory_gb"] == median["memory_gb"]
    assert set(data["by_statistic"]) == {"median", "floor"}
    png = plot_validation(report, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
