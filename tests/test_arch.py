"""ArchSpec: JSON round trip, parameter counts, legality rules."""

from __future__ import annotations

import json
import random

import pytest
import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec, sample_spec
from autocompress.errors import AutoCompressError
from autocompress.modeling import arch_spec_of, build_model
from autocompress.modeling.tiny import FAMILIES, tiny_config, tiny_model

torch.set_num_threads(1)


def _layer(heads, kv, width):
    attention = AttentionSpec(num_heads=heads, num_kv_heads=kv) if heads else None
    ffn = FFNSpec(intermediate_size=width) if width else None
    return LayerSpec(attention=attention, ffn=ffn)


def test_hand_written_json_with_nulls_round_trips():
    text = json.dumps(
        {
            "hidden_size": 48,
            "layers": [
                {"attention": {"num_heads": 4, "num_kv_heads": 2}, "ffn": None},
                {"attention": None, "ffn": {"intermediate_size": 40}},
            ],
        }
    )
    spec = ArchSpec.from_json(text)
    assert spec.layers[0].ffn is None and spec.layers[1].attention is None
    assert spec.head_dim is None  # optional fields may be left out
    again = ArchSpec.from_json(spec.to_json())
    assert again == spec
    # Removed blocks stay explicit nulls in the written JSON.
    assert json.loads(spec.to_json())["layers"][0]["ffn"] is None


def test_json_file_round_trip_keeps_optional_fields(tmp_path):
    spec = arch_spec_of(tiny_config("qwen3", tied=True))
    path = tmp_path / "arch.json"
    spec.to_json(path)
    assert ArchSpec.from_json(path) == spec
    assert ArchSpec.from_json(str(path)).qk_norm is True


@pytest.mark.parametrize(
    "bad, where",
    [
        ('{"hidden_size": 8}', "layers"),
        ('{"hidden_size": 8, "layers": [{"attention": {"num_heads": 2}}]}', "num_kv_heads"),
        ('{"hidden_size": 8, "layers": [], "typo_field": 1}', "typo_field"),
    ],
)
def test_invalid_json_is_a_user_error_naming_the_field(bad, where):
    with pytest.raises(AutoCompressError) as err:
        ArchSpec.from_json(bad)
    assert where in str(err.value)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(AutoCompressError, match="not found"):
        ArchSpec.from_json(tmp_path / "nope.json")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_teacher_param_count_is_exact(family, tied):
    model = tiny_model(family, tied=tied, gqa_ratio=2)
    assert arch_spec_of(model).num_params() == sum(p.numel() for p in model.parameters())


def test_llama_biases_counted():
    model = tiny_model("llama", attention_bias=True, mlp_bias=True)
    spec = arch_spec_of(model)
    assert spec.attention_bias and spec.attention_output_bias and spec.mlp_bias
    assert spec.num_params() == sum(p.numel() for p in model.parameters())


def test_qwen2_has_qkv_bias_but_no_output_bias():
    spec = arch_spec_of(tiny_config("qwen2"))
    assert spec.attention_bias is True and spec.attention_output_bias is False


@pytest.mark.parametrize("seed", range(4))
def test_random_hetero_spec_param_count_matches_built_model(seed):
    base = tiny_config("qwen3", tied=seed % 2 == 0, gqa_ratio=2, num_layers=4)
    spec = sample_spec(arch_spec_of(base), random.Random(seed))
    model = build_model(spec, base, seed=seed)
    assert spec.num_params() == sum(p.numel() for p in model.parameters())


def test_num_params_needs_vocab_and_head_dim():
    spec = ArchSpec(hidden_size=8, layers=[_layer(2, 1, 8)])
    with pytest.raises(AutoCompressError, match="vocab_size|head_dim"):
        spec.num_params()


def test_legality_names_layer_and_gqa_rule():
    spec = ArchSpec(hidden_size=64, layers=[_layer(4, 2, 64), _layer(6, 4, 64)])
    with pytest.raises(AutoCompressError) as err:
        spec.validate_legality()
    assert "layer 1" in str(err.value) and "multiple of num_kv_heads" in str(err.value)
    assert "layer 0" not in str(err.value)


def test_legality_granularity():
    spec = ArchSpec(hidden_size=192, layers=[_layer(4, 2, 256), _layer(4, 2, 200)])
    spec.validate_legality()  # no granularity: fine
    errors = spec.legality_errors(granularity=64)
    assert errors == ["layer 1: intermediate_size 200 is not a multiple of 64"]
    assert spec.legality_errors(granularity={"hidden": 128}) == [
        "model: hidden_size 192 is not a multiple of 128"
    ]
    assert "layer 0" in spec.legality_errors(granularity={"heads": 8})[0]


def test_legality_needs_one_attention_layer():
    spec = ArchSpec(hidden_size=8, layers=[_layer(0, 0, 8), _layer(0, 0, 0)])
    assert any("attention" in e for e in spec.legality_errors())


def test_legality_against_teacher():
    teacher = arch_spec_of(tiny_config("llama", gqa_ratio=2))  # 4 heads, 2 KV, ffn 96, h 64
    good = ArchSpec(hidden_size=48, layers=[_layer(2, 1, 32)] * 3, head_dim=16)
    assert good.legality_errors(reference=teacher) == []
    bad = ArchSpec(hidden_size=80, layers=[_layer(8, 4, 128)], head_dim=8)
    errors = bad.legality_errors(reference=teacher)
    assert any("head_dim" in e for e in errors)
    assert any(e.startswith("model: hidden_size 80") for e in errors)
    assert any(e.startswith("layer 0: 8 heads") for e in errors)
    assert any(e.startswith("layer 0: 4 KV heads") for e in errors)
    assert any(e.startswith("layer 0: intermediate_size 128") for e in errors)


def test_complete_from_fills_only_unset_fields():
    teacher = arch_spec_of(tiny_config("qwen3", tied=True))
    spec = ArchSpec(hidden_size=32, layers=[_layer(2, 2, 16)], tie_word_embeddings=False)
    done = spec.complete_from(teacher)
    assert done.missing_fields() == []
    assert done.tie_word_embeddings is False and done.qk_norm is True
    assert done.vocab_size == teacher.vocab_size


def test_summaries():
    spec = ArchSpec(hidden_size=8, layers=[_layer(4, 2, 8), _layer(0, 0, 8), _layer(2, 1, 0)])
    assert spec.num_layers == 3
    assert spec.kv_heads_total() == 3 and spec.heads_total() == 6
    assert spec.attention_layers() == [0, 2] and spec.ffn_layers() == [0, 1]
    assert not spec.is_homogeneous()
    assert ArchSpec.uniform(
        num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, intermediate_size=4
    ).is_homogeneous()


def test_unsupported_config_is_refused():
    from transformers import GPT2Config

    with pytest.raises(AutoCompressError) as err:
        ArchSpec.from_hf_config(GPT2Config(n_layer=1, n_embd=8, n_head=2))
    assert "llama" in str(err.value) and "qwen3" in str(err.value)
