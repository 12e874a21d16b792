"""The measuring harness and validation on tiny real models (no timed assertions)."""

from __future__ import annotations

import json
import mmap
import resource
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import autocompress.costmodel.measure as measure
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


# ------------------------------------------------------------------ paired timing


def _slow_reference(seconds: float):
    """A second tiny Llama whose every forward takes at least ``seconds`` longer."""
    import time

    torch.manual_seed(1)
    reference = LlamaForCausalLM(TINY).eval()
    reference.register_forward_pre_hook(lambda module, args: time.sleep(seconds))
    return reference


def test_paired_run_alternates_and_keeps_each_models_times(llama):
    """Lockstep: model and reference alternate call by call, in either order, and
    each one's times land in its own list (the reference is the one that sleeps)."""
    from autocompress.costmodel.measure import generate_paired

    reference = _slow_reference(0.02)
    calls: list[str] = []
    hooks = [llama.register_forward_pre_hook(lambda m, a: calls.append("model")),
             reference.register_forward_pre_hook(lambda m, a: calls.append("reference"))]
    ids = prompt_ids(llama, Workload(isl=8, osl=5))
    try:
        for reference_first in (False, True):
            calls.clear()
            run = generate_paired(llama, reference, ids, ids, osl=5, prefills=3,
                                  reference_first=reference_first)
            pair = ["reference", "model"] if reference_first else ["model", "reference"]
            assert calls == pair * (3 + 4)
            assert len(run.prefills) == len(run.reference_prefills) == 3
            assert len(run.steps) == len(run.reference_steps) == 4
            assert min(run.reference_steps + run.reference_prefills) >= 0.02
            assert sorted(run.steps)[2] < sorted(run.reference_steps)[2]
    finally:
        for hook in hooks:
            hook.remove()


def test_paired_measurement_is_the_ratio_times_the_reference_floor(llama):
    from autocompress.costmodel.measure import PAIRED_PREFILLS

    reference = _slow_reference(0.005)
    workload = Workload(isl=16, osl=5)
    m = measure_model(llama, workload, repeats=3, warmup=1, memory=False, reference=reference)
    p = m.paired
    assert m.timing == "paired" and p is not None
    assert p.ttft_ratio.n == p.tpot_ratio.n == 3
    assert p.reference_ttft_ms.n == 3 * PAIRED_PREFILLS and p.reference_tpot_ms.n == 3 * 4
    assert p.reference_params == sum(x.numel() for x in reference.parameters())
    # The reported times are the ratios expressed through the reference's floor.
    assert m.tpot_ms.median == pytest.approx(p.tpot_ratio.median * p.reference_tpot_ms.p10)
    assert m.ttft_ms.median == pytest.approx(p.ttft_ratio.median * p.reference_ttft_ms.p10)
    assert m.tpot_ms.q1 == pytest.approx(p.tpot_ratio.q1 * p.reference_tpot_ms.p10)
    assert m.metrics()["tpot_ms"] == m.tpot_ms.median
    # The same model sleeping nothing is faster than the sleeping reference.
    assert p.reference_tpot_ms.p10 >= 5.0 and 0 < p.tpot_ratio.median < 1
    assert p.absolute_tpot_ms.median < p.reference_tpot_ms.median
    # Unpaired measurements say so.
    assert measure_model(llama, workload, repeats=1, warmup=0, memory=False).timing == "absolute"


def test_paired_reference_must_cover_the_vocabulary(llama):
    small = LlamaForCausalLM(TINY.__class__(**{**TINY.to_dict(), "vocab_size": 128})).eval()
    with pytest.raises(ValueError, match="smaller vocabulary"):
        measure_model(llama, Workload(isl=4, osl=2), repeats=1, reference=small)


def _local_cpu_target() -> Target:
    from autocompress.hardware import HardwareSpec

    cpu = HardwareSpec(name="cpu-local", display_name="cpu", kind="cpu", memory_gib=4,
                       bandwidth_gb_s=10, flops_tflops={"fp32": 0.05})
    return Target.parse("h100-sxm/hf-eager/bf16").model_copy(
        update={"hardware": cpu, "dtype": "fp32"})


def test_fit_records_its_reference_and_verify_times_against_it(llama, tmp_path):
    """A paired fit saves its reference; measuring as fitted and validating pair with
    it; a model fitted before pairing existed (no such fields) still measures alone."""
    from autocompress.costmodel.fit import fit_cost_model
    from autocompress.costmodel.measure import measure_as_fitted
    from autocompress.costmodel.validate import validate_cost_model

    workload = Workload(name="tiny", isl=16, osl=4)
    model, rows = fit_cost_model(_local_cpu_target(), TINY, [workload], n_probes=5, repeats=1,
                                 warmup=0, progress=False)
    assert model.fit.timing == "paired" and rows[0].paired is not None
    assert ArchSpec.model_validate(model.fit.reference_spec) == ArchSpec.from_hf_config(TINY)
    assert model.fit.reference_ms["tiny"]["tpot_ms"] > 0
    model.save(tmp_path / "cm.json")
    loaded = CostModel.load(tmp_path / "cm.json")
    assert loaded.fit.reference_spec == model.fit.reference_spec

    measurement, _ = measure_as_fitted(llama, workload, loaded, repeats=1, warmup=0,
                                       memory=False)
    assert measurement.timing == "paired"
    assert measurement.paired.reference_params == ArchSpec.from_hf_config(TINY).num_params()
    # Scaled by the fit's pooled reference times, not this short session's.
    fitted = loaded.fit.reference_ms["tiny"]
    assert measurement.paired.scale_source == "fit"
    assert measurement.tpot_ms.median == pytest.approx(
        measurement.paired.tpot_ratio.median * fitted["tpot_ms"])
    assert measurement.ttft_ms.median == pytest.approx(
        measurement.paired.ttft_ratio.median * fitted["ttft_ms"])
    # A workload of another shape has no fitted scale: this session's floor is used.
    other, _ = measure_as_fitted(llama, workload.with_overrides(isl=8), loaded, repeats=1,
                                 warmup=0, memory=False)
    assert other.paired.scale_source == "session"
    assert other.tpot_ms.median == pytest.approx(
        other.paired.tpot_ratio.median * other.paired.reference_tpot_ms.p10)

    report = validate_cost_model(loaded, TINY, [workload], n=3, repeats=1, warmup=0,
                                 progress=False)
    assert report.timing == "paired" and set(report.reference_drift) == {"tiny"}
    assert report.samples[0].absolute_spread.keys() == {"ttft_ms", "tpot_ms"}
    assert set(report.at_fit_scale["mape"]) == {"ttft", "tpot", "memory"}

    # A model fitted before paired timing existed: its file has none of the new keys
    # (and so its old content hash still holds); it measures alone.
    absolute = model.fit.model_copy(update={"timing": "absolute", "reference_spec": None,
                                            "reference_ms": {}})
    model.model_copy(update={"fit": absolute}).save(tmp_path / "old.json")
    saved = json.loads((tmp_path / "old.json").read_text())["model"]["fit"]
    assert not {"timing", "reference_spec", "reference_ms"} & set(saved)
    legacy = CostModel.load(tmp_path / "old.json")
    assert legacy.fit.timing == "absolute"
    assert measure_as_fitted(llama, workload, legacy, repeats=1, warmup=0,
                             memory=False)[0].timing == "absolute"


def test_robust_stat_scaled():
    from autocompress.hardware import RobustStat

    stat = RobustStat.of([1.0, 2.0, 3.0, 4.0, 5.0])
    doubled = stat.scaled(2.0, "ms")
    assert (doubled.median, doubled.q1, doubled.q3, doubled.p10, doubled.minimum) == (
        2 * stat.median, 2 * stat.q1, 2 * stat.q3, 2 * stat.p10, 2 * stat.minimum)
    assert doubled.n == stat.n and doubled.unit == "ms" and doubled.spread == stat.spread


def _stack_depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


@pytest.mark.skipif(not hasattr(resource, "RUSAGE_THREAD"), reason="Linux counts per thread")
def test_quiet_padding_picks_the_shallowest_padding_without_page_faults():
    """A trial that maps and touches fresh pages when it runs shallower than 30 frames below
    its first call: the padding picked is the first one at least 30 frames deep."""
    first_depth: list[int] = []

    def trial() -> None:
        depth = _stack_depth()
        if not first_depth:
            first_depth.append(depth)
        if depth < first_depth[0] + 30:
            with mmap.mmap(-1, 64 * mmap.PAGESIZE) as pages:
                for page in range(64):
                    pages[page * mmap.PAGESIZE] = 1

    assert measure.quiet_padding(trial, paddings=(0, 12, 24, 36, 48)) == 36
    assert measure.quiet_padding(lambda: None, paddings=(12, 0, 24)) == 0  # a tie: the least


def test_each_model_is_timed_under_the_padding_picked_for_it(llama, monkeypatch):
    """A padding of 40 frames puts the timed runs exactly 40 frames deeper than none."""

    def timed_depths(padding: int) -> list[int]:
        depths: list[int] = []
        monkeypatch.setattr(measure, "quiet_padding", lambda trial, paddings=(): padding)
        hook = llama.register_forward_pre_hook(lambda *_: depths.append(_stack_depth()))
        try:
            measure_model(llama, Workload(isl=8, osl=3), repeats=1, warmup=0, memory=False)
        finally:
            hook.remove()
        return depths

    plain, padded = timed_depths(0), timed_depths(40)
    assert len(plain) == len(padded) == 3  # prefill + 2 decode steps
    assert [b - a for a, b in zip(plain, padded, strict=True)] == [40, 40, 40]
