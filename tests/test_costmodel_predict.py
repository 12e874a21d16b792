"""Predictions on public configs, targets, workloads, config reading, save/load."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autocompress.arch import ArchSpec
from autocompress.costmodel import CostModel, Target, Workload, get_workload, known_targets
from autocompress.costmodel.configs import load_arch
from autocompress.costmodel.probes import default_base_config
from autocompress.errors import AutoCompressError

# Public config.json contents (meta-llama/Meta-Llama-3-8B and -70B), written out here
# because nothing may be downloaded.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
    "bos_token_id": 128000, "eos_token_id": 128001,
}
LLAMA3_70B = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672,
              "num_attention_heads": 64, "num_hidden_layers": 80}
# A shortened Llama-3.1-Nemotron-51B-style heterogeneous config (DeciLM block_configs).
NEMOTRON = {
    "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 8192,
    "num_attention_heads": 64, "num_hidden_layers": 4, "vocab_size": 128256,
    "tie_word_embeddings": False,
    "block_configs": [
        {"attention": {"n_heads_in_group": 8, "no_op": False, "replace_with_linear": False},
         "ffn": {"ffn_mult": 5.25, "no_op": False, "replace_with_linear": False}},
        {"attention": {"n_heads_in_group": 16, "no_op": False, "replace_with_linear": False},
         "ffn": {"ffn_mult": 2.625, "no_op": False, "replace_with_linear": False}},
        {"attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False},
         "ffn": {"ffn_mult": 1.3125, "no_op": False, "replace_with_linear": False}},
        {"attention": {"n_heads_in_group": None, "no_op": False, "replace_with_linear": True},
         "ffn": {"ffn_mult": None, "no_op": True, "replace_with_linear": False}},
    ],
}


@pytest.fixture
def configs(tmp_path):
    paths = {}
    for name, data in (("8b", LLAMA3_8B), ("70b", LLAMA3_70B), ("nemo", NEMOTRON)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    return paths


def test_llama3_parameter_counts_from_config(configs):
    spec8, notes = load_arch(configs["8b"])
    spec70, _ = load_arch(configs["70b"])
    assert notes == []
    assert spec8.num_params() == pytest.approx(8.03e9, rel=0.005)
    assert spec70.num_params() == pytest.approx(70.55e9, rel=0.005)


def test_8b_fits_an_h100_and_70b_does_not(configs):
    spec8, _ = load_arch(configs["8b"])
    spec70, _ = load_arch(configs["70b"])
    model = CostModel.analytic(Target.parse("h100-sxm/vllm/bf16"))
    for preset in ("interactive", "datacenter"):
        small = model.predict(spec8, get_workload(preset))
        big = model.predict(spec70, get_workload(preset))
        assert small.fits and small.max_concurrency >= get_workload(preset).batch
        assert not big.fits and big.max_concurrency == 0 and big.reason
        # ~16 GB of bf16 weights for 8B, ~141 GB for 70B.
        assert small.memory.weights / 1e9 == pytest.approx(16.06, rel=0.01)
        assert big.memory.weights / 1e9 == pytest.approx(141.1, rel=0.01)
        # Decode at batch 1 is bound by streaming the weights: a few ms per token.
    one = model.predict(spec8, get_workload("interactive"))
    assert 16.06e9 / 3.35e12 * 1e3 < one.tpot_ms < 3 * 16.06e9 / 3.35e12 * 1e3
    # With 4-way tensor parallelism 70B fits and decodes faster than on one (virtual) GPU.
    tp4 = CostModel.analytic(Target.parse("h100-sxm/vllm/bf16", tp=4))
    split = tp4.predict(spec70, get_workload("interactive"))
    assert split.fits and split.tpot_ms < model.predict(spec70, get_workload("interactive")).tpot_ms


def test_bigger_batches_raise_throughput_and_kv(configs):
    spec8, _ = load_arch(configs["8b"])
    model = CostModel.analytic(Target.parse("h100-sxm/trtllm/bf16"))
    one = model.predict(spec8, Workload(isl=1024, osl=128, batch=1))
    many = model.predict(spec8, Workload(isl=1024, osl=128, batch=32))
    assert many.throughput_tok_s > 10 * one.throughput_tok_s
    assert many.memory.kv_cache == pytest.approx(32 * one.memory.kv_cache)
    assert many.tpot_ms > one.tpot_ms


def test_a_workload_that_cannot_fit_reports_the_largest_that_would(configs):
    spec8, _ = load_arch(configs["8b"])
    model = CostModel.analytic(Target.parse("h100-sxm/vllm/bf16"))
    huge = Workload(isl=2_000_000, osl=256, batch=1)
    result = model.predict(spec8, huge)
    assert not result.fits and "KV cache" in result.reason
    assert 0 < result.max_context_tokens < huge.isl + huge.osl
    fitting = model.predict(spec8, huge.with_overrides(isl=result.max_context_tokens - 256))
    assert fitting.fits
    too_long = model.predict(spec8, huge.with_overrides(isl=result.max_context_tokens - 256 + 64))
    assert not too_long.fits


def test_nemotron_nas_block_configs(configs):
    spec, notes = load_arch(configs["nemo"])
    assert [layer.attention.num_kv_heads if layer.attention else None
            for layer in spec.layers] == [8, 4, None, None]
    # intermediate = round_up_256(int(2 * ffn_mult * hidden / 3))
    assert spec.layers[0].ffn.intermediate_size == 28672
    assert spec.layers[1].ffn.intermediate_size == 14336
    assert spec.layers[3].ffn is None
    assert len(notes) == 1 and "layer 3" in notes[0]
    model = CostModel.analytic(Target.parse("h100-sxm/vllm/bf16"))
    assert model.predict(spec, get_workload("interactive")).fits


def test_arch_spec_json_is_completed_from_the_default_teacher(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"hidden_size": 192, "layers": [
        {"attention": {"num_heads": 4, "num_kv_heads": 2}, "ffn": {"intermediate_size": 384}},
        {"attention": None, "ffn": {"intermediate_size": 256}},
    ]}))
    spec, _ = load_arch(path)
    teacher = ArchSpec.from_hf_config(default_base_config())
    assert spec.num_layers == 2 and spec.hidden_size == 192
    assert (spec.head_dim, spec.vocab_size) == (teacher.head_dim, teacher.vocab_size)


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(AutoCompressError) as err:
        Target.parse("a100/vllm/bf16")
    assert "h100-sxm" in err.value.hint and "cpu-local" in err.value.hint
    with pytest.raises(AutoCompressError, match="engine"):
        Target.parse("h100-sxm/tgi/bf16")
    with pytest.raises(AutoCompressError, match="CPU"):
        Target.parse("cpu-local/trtllm/fp32")
    with pytest.raises(AutoCompressError, match="vllm on the CPU"):
        Target.parse("cpu-local/vllm/fp8")
    assert Target.parse("cpu-local/vllm").name == "cpu-local/vllm/fp32"
    assert "cpu-local/vllm/bf16" in known_targets()
    assert "b200/trtllm/fp8" in known_targets()
    assert Target.parse("H200/vLLM").name == "h200/vllm/bf16"


def test_save_load_round_trip_and_tamper_detection(tmp_path):
    model = CostModel.analytic(Target.parse("b200/vllm/fp8"))
    path = tmp_path / "cm.json"
    sha = model.save(path)
    loaded = CostModel.load(path)
    assert loaded.sha256 == sha and loaded.version == model.version
    spec = ArchSpec.uniform(num_layers=2, hidden_size=512, num_heads=8, num_kv_heads=2,
                            intermediate_size=1024, head_dim=64, vocab_size=1000)
    wl = get_workload("datacenter")
    assert loaded.predict(spec, wl).metrics() == model.predict(spec, wl).metrics()
    data = json.loads(path.read_text())
    data["model"]["timing"]["eta_gemm"] = 0.99
    path.write_text(json.dumps(data))
    with pytest.raises(AutoCompressError, match="sha256"):
        CostModel.load(path)


def test_cli_predict_json_and_presets(configs):
    from autocompress.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["costmodel", "predict", "--model", str(configs["8b"]),
                                 "--target", "h100-sxm/vllm/bf16", "--workload", "datacenter",
                                 "--config", "concurrency=8", "--format", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "throughput_tok_s", "memory_gb",
                "max_concurrency", "fits"):
        assert key in out
    assert out["fits"] is True and out["workload"]["batch"] == 8
    result = runner.invoke(app, ["costmodel", "presets", "--format", "json"])
    presets = json.loads(result.output)
    assert {"local-coding", "datacenter", "interactive", "local-coding-cpu", "datacenter-cpu",
            "interactive-cpu"} <= set(presets)
    rows = json.loads(runner.invoke(app, ["costmodel", "targets", "--format", "json"]).output)
    measurable = {r["target"] for r in rows if r["measurable"]}
    assert {"cpu-local/llama.cpp/q4_0", "cpu-local/hf-eager/fp32", "cpu-local/vllm/bf16",
            "cpu-local/vllm/fp32"} <= measurable
    assert "h100-sxm/vllm/bf16" in {r["target"] for r in rows} - measurable
    from autocompress.vllm_engine import engine_available
    installed = {r["target"]: r["engine_installed"] for r in rows}
    assert installed["cpu-local/vllm/bf16"] is engine_available()
    assert installed["cpu-local/hf-eager/fp32"] is True
    result = runner.invoke(app, ["costmodel", "predict", "--model", str(configs["70b"]),
                                 "--target", "rtx-5070/vllm/bf16", "--workload", "interactive"])
    assert result.exit_code == 0 and "does not fit" in result.output


def _fitted_stand_in(target: Target) -> CostModel:
    """A cost model whose timing is a fitted law (what `costmodel fit` saves)."""
    from autocompress.costmodel.laws import ActivationLaw, LinearLaw
    from autocompress.costmodel.model import FitReport

    fit = FitReport(created="2026-12-01T10:00:00", seconds=1.0, threads=1, n_probes=20,
                    n_rows=60, workloads=["interactive-cpu"], timing="paired",
                    train_mape={"tpot": 3.25, "ttft": 5.5}, median_spread={})
    return CostModel(target=target, activation=ActivationLaw.default(), fit=fit,
                     timing=LinearLaw(prefill={"const.call": 1.0}, decode={"const.call": 1.0}))


def test_predict_says_when_nothing_is_fitted_for_a_target_this_machine_times(autocompress_home):
    """On a measurable target with no fit, predict says in one line that its figures are
    the analytic model's and how to fit one; not once a fit is saved, and not on a GPU
    target, whose analytic model is the product."""
    from autocompress.cli import app
    from autocompress.costmodel.model import default_path

    def predict(target: str, *fmt: str):
        result = CliRunner().invoke(app, ["costmodel", "predict", "--model", "default",
                                          "--target", target, "--workload", "interactive-cpu",
                                          *fmt])
        assert result.exit_code == 0, result.output
        return result.output

    line = [text for text in predict("cpu-local/llama.cpp/q8_0").splitlines()
            if "nothing is fitted" in text]
    assert len(line) == 1 and "analytic cost model" in line[0]
    assert "`autocompress costmodel fit --target cpu-local/llama.cpp/q8_0`" in line[0]
    assert json.loads(predict("h100-sxm/vllm/bf16", "--format", "json"))[
        "cost_model_note"] is None
    target = Target.parse("cpu-local/hf-eager/fp32")
    assert "nothing is fitted" in predict(target.name)
    _fitted_stand_in(target).save(default_path(target))
    out = json.loads(predict(target.name, "--format", "json"))
    assert out["cost_model"].startswith("cpu-local/hf-eager/fp32:fitted:")
    assert out["cost_model_note"] is None
