"""Export to nemotron-nas (DeciLMForCausalLM block_configs) and the per_layer_config record."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.errors import AutoCompressError
from autocompress.export import (
    export_nemotron_nas,
    export_refusal,
    ffn_mult_for,
    ffn_mult_to_intermediate_size,
    load_nemotron_nas,
    spec_from_nemotron_nas,
)
from autocompress.importance import random_importance
from autocompress.modeling import arch_spec_of
from autocompress.modeling.tiny import tiny_model
from autocompress.prune import prune

torch.set_num_threads(1)


def _layer(heads, kv, width):
    attention = AttentionSpec(num_heads=heads, num_kv_heads=kv) if heads else None
    return LayerSpec(attention=attention, ffn=FFNSpec(intermediate_size=width) if width else None)


def _student(tmp_path, layers, family="llama", tied=True, **kwargs):
    teacher = tiny_model(family, tied=tied, gqa_ratio=1, intermediate_size=512, **kwargs)
    spec = ArchSpec(hidden_size=64, layers=layers)
    student = prune(teacher, random_importance(teacher), spec)
    path = tmp_path / "student"
    student.save_pretrained(path)
    return student, path


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("hidden", [64, 96, 2048, 4096, 5120, 8192])
def test_ffn_mult_rule_round_trips_every_multiple_of_256(hidden):
    for width in range(256, 8 * hidden + 1, 256):
        mult = ffn_mult_for(width, hidden)
        assert mult is not None and ffn_mult_to_intermediate_size(mult, hidden) == width
        assert round(mult, 6) == mult  # the hub's FFNConfig rounds ffn_mult to 6 digits
    assert ffn_mult_for(300, hidden) is None


def test_rule_matches_known_nemotron_value():
    # Llama-3.1-70B-style block: hidden 8192, ffn_mult 5.25 -> 28672.
    assert ffn_mult_to_intermediate_size(5.25, 8192) == 28672


def test_export_round_trip_gives_identical_logits(tmp_path):
    layers = [_layer(4, 4, 512), _layer(4, 1, 256), _layer(0, 0, 256)]
    student, path = _student(tmp_path, layers)
    report = export_nemotron_nas(path, tmp_path / "nas")
    assert report.engines == ["vllm", "trtllm", "hf"]  # no tokenizer: not llama.cpp
    assert "tokenizer: missing" in report.refused["llama.cpp"][0]
    config = json.loads((tmp_path / "nas" / "config.json").read_text())
    assert config["architectures"] == ["DeciLMForCausalLM"]
    assert config["num_attention_heads"] == 4
    blocks = config["block_configs"]
    assert blocks[1]["attention"] == {
        "no_op": False,
        "replace_with_linear": False,
        "n_heads_in_group": 4,
    }
    assert blocks[2]["attention"]["no_op"] is True and blocks[2]["ffn"]["no_op"] is False
    assert ffn_mult_to_intermediate_size(blocks[0]["ffn"]["ffn_mult"], 64) == 512
    assert spec_from_nemotron_nas(config) == arch_spec_of(student)
    assert report.num_params == arch_spec_of(student).num_params()

    reloaded = load_nemotron_nas(tmp_path / "nas")
    ids = torch.randint(3, 128, (2, 9))
    torch.testing.assert_close(_logits(reloaded, ids), _logits(student, ids), rtol=0, atol=1e-6)


def test_exported_config_loads_with_attribute_access(tmp_path):
    _, path = _student(tmp_path, [_layer(4, 2, 256), _layer(0, 0, 512), _layer(4, 4, 0)])
    export_nemotron_nas(path, tmp_path / "nas")
    config = AutoConfig.from_pretrained(tmp_path / "nas", trust_remote_code=True)
    assert config.model_type == "nemotron-nas" and config.num_hidden_layers == 3
    block = config.block_configs[1]
    assert block.attention.no_op is True and block.ffn.ffn_mult is not None
    assert config.block_configs[0].attention.n_heads_in_group == 2
    # vLLM takes ffn_mult when the block has it (hasattr); both give the same width.
    assert ffn_mult_to_intermediate_size(block.ffn.ffn_mult, 64) == block.ffn.intermediate_size
    json.dumps(config.to_dict())  # stays serialisable


def test_widths_ffn_mult_cannot_express_are_padded_or_written_exactly(tmp_path):
    student, path = _student(tmp_path, [_layer(4, 2, 300), _layer(4, 2, 256), _layer(4, 2, 0)])
    ids = torch.randint(3, 128, (1, 7))
    # Default: zero-padded to 512 so that ffn_mult readers (TensorRT-LLM) load it.
    report = export_nemotron_nas(path, tmp_path / "nas")
    assert "trtllm" in report.engines and report.stand_ins["ffn-width"] == "layer 0"
    block = json.loads((tmp_path / "nas" / "config.json").read_text())["block_configs"][0]
    assert block["ffn"]["intermediate_size"] == 512
    assert ffn_mult_to_intermediate_size(block["ffn"]["ffn_mult"], 64) == 512
    assert report.added_params == 3 * 64 * (512 - 300)
    reloaded = load_nemotron_nas(tmp_path / "nas")
    torch.testing.assert_close(_logits(reloaded, ids), _logits(student, ids), rtol=0, atol=1e-6)

    # For vLLM alone: the exact width, as intermediate_size (no ffn_mult key at all).
    export_nemotron_nas(path, tmp_path / "vllm", engines=["vllm"])
    block = json.loads((tmp_path / "vllm" / "config.json").read_text())["block_configs"][0]
    assert block["ffn"] == {"no_op": False, "replace_with_linear": False, "intermediate_size": 300}
    reloaded = load_nemotron_nas(tmp_path / "vllm")
    torch.testing.assert_close(_logits(reloaded, ids), _logits(student, ids), rtol=0, atol=1e-6)


def test_per_layer_query_heads_are_refused(tmp_path):
    _, path = _student(tmp_path, [_layer(4, 2, 256), _layer(2, 2, 256), _layer(4, 4, 256)])
    with pytest.raises(AutoCompressError, match=r"query heads differ.*query heads \[2, 4\]"):
        export_nemotron_nas(path, tmp_path / "nas")
    assert not (tmp_path / "nas").exists()  # nothing half-written
    # the same rule, as a reason, without an export (the matrix's refused cells)
    assert "query heads [2, 4]" in export_refusal(path, "vllm")
    assert not (tmp_path / "nas").exists()
    _, uniform = _student(tmp_path / "uniform", [_layer(4, 2, 256), _layer(4, 4, 256)])
    assert export_refusal(uniform, "vllm") is None


def test_qwen3_is_refused(tmp_path):
    teacher = tiny_model("qwen3", intermediate_size=256)
    teacher.save_pretrained(tmp_path / "q3")
    with pytest.raises(AutoCompressError, match=r"q/k RMSNorm \(Qwen3\) \[qk-norm\]"):
        export_nemotron_nas(tmp_path / "q3", tmp_path / "nas")


def test_qwen2_bias_is_written_as_qkv_bias(tmp_path):
    teacher = tiny_model("qwen2", intermediate_size=256)
    teacher.save_pretrained(tmp_path / "q2")
    report = export_nemotron_nas(tmp_path / "q2", tmp_path / "nas")
    config = json.loads((tmp_path / "nas" / "config.json").read_text())
    assert config["qkv_bias"] is True and config["attention_bias"] is False
    assert "trtllm" not in report.engines and "[bias]" in report.refused["trtllm"][0]
    with pytest.raises(AutoCompressError, match=r"trtllm: non-zero .* bias \[bias\]"):
        export_nemotron_nas(tmp_path / "q2", tmp_path / "trt", engines=["trtllm"])
    ids = torch.randint(3, 128, (1, 7))
    torch.testing.assert_close(
        _logits(load_nemotron_nas(tmp_path / "nas"), ids), _logits(teacher, ids), rtol=0, atol=1e-6
    )


def test_per_layer_config_record_parses_in_transformers(tmp_path):
    _, path = _student(tmp_path, [_layer(4, 2, 256), _layer(0, 0, 512), _layer(4, 4, 0)])
    export_nemotron_nas(path, tmp_path / "nas")
    record = json.loads((tmp_path / "nas" / "per_layer_config.json").read_text())
    config = LlamaConfig.from_dict(record)
    assert config.is_heterogeneous
    layers = config.per_layer_config
    assert layers[0].num_key_value_heads == 2 and layers[2].num_key_value_heads == 4
    assert layers[1].intermediate_size == 512 and layers[0].intermediate_size == 256
    assert layers[1].skip == ["self_attn"] and layers[2].skip == ["mlp"]


def test_non_empty_output_is_not_overwritten(tmp_path):
    _, path = _student(tmp_path, [_layer(4, 2, 256)] * 3)
    (tmp_path / "nas").mkdir()
    (tmp_path / "nas" / "keep.txt").write_text("x")
    with pytest.raises(AutoCompressError, match="not empty"):
        export_nemotron_nas(path, tmp_path / "nas")
    export_nemotron_nas(path, tmp_path / "nas", overwrite=True)
    assert not (tmp_path / "nas" / "keep.txt").exists()
