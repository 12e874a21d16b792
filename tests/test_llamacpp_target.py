"""The llama.cpp engine as a measured target: parsing, measuring, fitting, verifying.

Tiny models (hidden 32, vocabulary 96) served by the real engine; a few runs each.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from autocompress.arch import ArchSpec
from autocompress.costmodel.target import Target
from autocompress.costmodel.workload import Workload
from autocompress.errors import AutoCompressError

llamacpp = pytest.importorskip("autocompress.llamacpp")
if not llamacpp.engine_available():  # pragma: no cover - the set-up installs it
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)

TINY = Workload(name="tiny", isl=12, osl=4, batch=2)
TARGET = "cpu-local/llama.cpp/q8_0"


def _base_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, max_position_embeddings=128, tie_word_embeddings=True)


@pytest.fixture(autouse=True, scope="module")
def _home(tmp_path_factory):
    """One private home for the module: the CPU profile is taken once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOCOMPRESS_HOME", str(tmp_path_factory.mktemp("home")))
        yield


def test_parse_engine_targets():
    target = Target.parse(TARGET, threads=2)
    assert target.engine.name == "llama.cpp" and target.measurable and target.threads == 2
    assert target.weight_bytes == pytest.approx(34 / 32) and target.kv_bytes == 2
    assert Target.parse("cpu-local/llama.cpp").dtype == "q8_0"
    for bad, match in [("h100-sxm/llama.cpp/q8_0", "cpu-local only"),
                       ("cpu-local/llama.cpp/fp32", "not available"),
                       ("cpu-local/hf-eager/q8_0", "not available")]:
        with pytest.raises(AutoCompressError, match=match):
            Target.parse(bad)


def test_attention_work_follows_the_engines_flash_attention():
    """Features count llama.cpp's flash-attention work: the padded KV view (``get_n_kv``:
    a multiple of 256, at least 256, at most the sequence's cells), 64 × 64 tiles for
    micro-batches of ≥ 64 queries per sequence, visible cells one by one below that;
    for this engine only."""
    from autocompress.costmodel.blocks import Env, block_shape, decode_features
    from autocompress.costmodel.measure_llamacpp import (
        decode_kv_view_cells,
        prefill_attention_work,
    )
    from autocompress.costmodel.workload import PRESETS
    from autocompress.modeling.loading import arch_spec_of

    local, datacenter = PRESETS["local-coding-cpu"], PRESETS["datacenter-cpu"]
    # 512 prompt tokens: one micro-batch, 8 query tiles × 1..8 causal KV tiles;
    # decoding past 512 cells pads the view to 768.
    assert prefill_attention_work(local) == (512 * 512, 36 * 64 * 64, 0)
    assert decode_kv_view_cells(local) == 768
    # 6 sequences of 128: micro-batches of 85 (tiles: 64 + 21 queries → 1 + 2 pairs)
    # then 43 queries per sequence (vector path: positions 85..127 see 86..128 cells).
    vector = sum(range(86, 129))
    assert prefill_attention_work(datacenter) == (6 * 128 * 256, 6 * 3 * 64 * 64, 6 * vector)
    assert decode_kv_view_cells(datacenter) == 6 * 256
    long = Workload(name="long", isl=1200, osl=8, batch=1)  # micro-batches of 512, 512, 176
    assert prefill_attention_work(long).view == 512 * 512 + 512 * 1024 + 176 * 1280

    spec = arch_spec_of(_base_config())
    for target, expected in ((TARGET, 768 * 4), ("cpu-local/hf-eager/fp32", None)):
        env = Env.of(spec, local, Target.parse(target))
        features = decode_features(block_shape(spec.layers[0].attention, 32, env), 32, env)
        assert features.get("attn.view_cells") == expected


def test_measure_fit_and_verify_in_the_engine(tmp_path):
    """Multi-sequence runs in the engine; the fitted memory is the engine's buffers."""
    from autocompress.costmodel.fit import fit_cost_model
    from autocompress.costmodel.measure_llamacpp import context_per_sequence
    from autocompress.gguf_export import write_gguf
    from autocompress.limits import Limits
    from autocompress.modeling import build_model
    from autocompress.verify import verify

    target = Target.parse(TARGET)
    model, rows = fit_cost_model(target, _base_config(), [TINY], n_probes=5, repeats=2,
                                 warmup=0, progress=False)
    assert model.source == "fitted" and len(rows) == 5
    for row in rows:
        spec = ArchSpec.model_validate(row.spec)
        predicted = model.memory_bytes(spec, TINY)
        # The KV cache is exact: 2 sequences × 256 cells × K and V in f16.
        cells = TINY.batch * context_per_sequence(TINY)
        assert predicted.kv_cache == pytest.approx(cells * 2 * 2 * 8 * spec.kv_heads_total())
        assert predicted.total == pytest.approx(row.memory_bytes, rel=0.1)
        assert row.ttft_ms.median > 0 and row.tpot_ms.median > 0 and row.paired is not None

    spec = ArchSpec.model_validate(rows[1].spec)
    path = tmp_path / "student.gguf"
    write_gguf(build_model(spec, _base_config(), seed=3), None, path, "q8_0")
    generous = verify(path, target, TINY, Limits(max_tpot_ms=1e4, max_memory_gb=1.0),
                      repeats=2, warmup=0, cost_model=model)
    assert generous.ok and generous.measurement["memory_method"] == "llama.cpp-buffers"
    assert generous.predicted is not None and generous.measurement["timing"] == "paired"
    assert "llama.cpp" in generous.measurement["what"]
    assert "AVX2" in generous.measurement["kernels"].split()  # the Makefile builds AVX2 in
    impossible = verify(path, target, TINY, Limits(max_memory_gb=1e-6), repeats=1, warmup=0,
                        cost_model=model)
    assert not impossible.ok and impossible.violations == ["memory_gb"]
    with pytest.raises(AutoCompressError, match="q8_0 weights"):
        verify(path, Target.parse("cpu-local/llama.cpp/f32"), TINY, Limits(), repeats=1)


def test_the_reference_gguf_is_written_once_per_spec_and_type():
    """Every timing against one fit pairs with the same reference file (fixed weights)."""
    from autocompress.costmodel.measure_llamacpp import reference_gguf
    from autocompress.modeling.loading import arch_spec_of

    spec = arch_spec_of(_base_config())
    first = reference_gguf(spec, "q8_0")
    assert first.exists() and first.stat().st_size > 0
    assert reference_gguf(spec.model_dump(mode="json"), "q8_0") == first  # as a fit stores it
    other = reference_gguf(spec, "f32")
    assert other != first and other.stat().st_size > first.stat().st_size
    first.unlink()  # removed behind its back: written again, not a dangling path
    assert reference_gguf(spec, "q8_0").exists()


def test_engine_greedy_tokens_do_not_depend_on_the_batch(tmp_path):
    """Two sequences in one decode call give each the tokens it gets alone."""
    from autocompress.costmodel.measure_llamacpp import open_session
    from autocompress.gguf_export import write_gguf
    from autocompress.modeling import build_model
    from autocompress.modeling.loading import arch_spec_of

    torch.manual_seed(0)
    spec = arch_spec_of(_base_config())
    path = tmp_path / "m.gguf"
    write_gguf(build_model(spec, _base_config(), seed=1), None, path, "f32")
    prompts = [[1, 5, 9, 33, 2, 7, 8, 90, 11, 3, 4, 6], [60, 2, 2, 17, 40, 41, 5, 5, 6, 7, 1, 0]]

    def generate(session, batch_prompts):
        tokens = session.prefill(session.prepare_prefill(batch_prompts),
                                 [len(p) for p in batch_prompts])
        out = [tokens]
        for _ in range(3):
            tokens = session.decode(tokens)
            out.append(tokens)
        return [list(col) for col in zip(*out, strict=True)]

    with open_session(path, TINY, threads=1) as both:
        together = generate(both, prompts)
    alone = []
    for prompt in prompts:
        with open_session(path, TINY.model_copy(update={"batch": 1}), threads=1) as one:
            alone += generate(one, [prompt])
    assert together == alone
