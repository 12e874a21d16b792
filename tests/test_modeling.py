"""The heterogeneous transformers model: equivalence, save/load, KV cache, loading errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec, sample_spec
from autocompress.errors import AutoCompressError
from autocompress.modeling import (
    HeteroForCausalLM,
    arch_spec_of,
    build_model,
    load_causal_lm,
    to_hetero,
)
from autocompress.modeling.tiny import FAMILIES, tiny_config, tiny_model

torch.set_num_threads(1)


def _tokens(vocab: int, batch: int = 2, length: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _incremental_logits(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits for every position: prefill with the cache, then one token at a time."""
    with torch.no_grad():
        out = model(ids[:, :prefill], use_cache=True)
        cache, logits = out.cache, [out.logits]
        for t in range(prefill, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("gqa_ratio", [1, 2, 4])
def test_to_hetero_reproduces_teacher_logits(family, tied, gqa_ratio):
    teacher = tiny_model(family, tied=tied, gqa_ratio=gqa_ratio)
    hetero = to_hetero(teacher)
    assert isinstance(hetero, HeteroForCausalLM)
    assert hetero.config.tie_word_embeddings == tied
    if tied:
        assert hetero.lm_head.weight.data_ptr() == hetero.model.embed_tokens.weight.data_ptr()
    ids = _tokens(teacher.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(hetero(ids).logits, teacher(ids).logits, rtol=0, atol=1e-5)


def test_mistral_sliding_window_is_kept():
    teacher = tiny_model("mistral", sliding_window=4)
    hetero = to_hetero(teacher)
    assert set(hetero.config.layer_types) == {"sliding_attention"}
    ids = _tokens(teacher.config.vocab_size, length=12)
    with torch.no_grad():
        torch.testing.assert_close(hetero(ids).logits, teacher(ids).logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        _incremental_logits(hetero, ids, 5), _incremental_logits(teacher, ids, 5), rtol=0, atol=1e-5
    )


def test_rope_theta_and_scaling_are_kept():
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}
    teacher = tiny_model("llama", rope_parameters=rope)
    hetero = to_hetero(teacher)
    assert hetero.config.rope_parameters["rope_theta"] == 5000.0
    ids = _tokens(teacher.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(hetero(ids).logits, teacher(ids).logits, rtol=0, atol=1e-5)


def _random_hetero(seed: int, family: str = "qwen3"):
    base = tiny_config(family, tied=seed % 2 == 1, gqa_ratio=[1, 2, 4][seed % 3], num_layers=4)
    spec = sample_spec(arch_spec_of(base), random.Random(seed), p_no_attention=0.3)
    return spec, build_model(spec, base, seed=seed)


@pytest.mark.parametrize("seed", range(6))
def test_random_hetero_params_save_load_and_cache(seed, tmp_path):
    family = FAMILIES[seed % len(FAMILIES)]
    spec, model = _random_hetero(seed, family)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    assert arch_spec_of(model) == spec

    ids = _tokens(model.config.vocab_size, length=9, seed=seed)
    with torch.no_grad():
        full = model(ids).logits
    torch.testing.assert_close(_incremental_logits(model, ids, 4), full, rtol=0, atol=1e-5)

    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is HeteroForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, full, rtol=0, atol=0)
    again, tokenizer = load_causal_lm(tmp_path)
    assert tokenizer is None and arch_spec_of(again) == spec


def test_first_layer_without_attention_cache_matches_no_cache():
    base = tiny_config("llama", num_layers=3)
    spec = ArchSpec(
        hidden_size=64,
        layers=[
            LayerSpec(attention=None, ffn=FFNSpec(intermediate_size=32)),
            LayerSpec(attention=AttentionSpec(num_heads=2, num_kv_heads=1), ffn=None),
            LayerSpec(attention=None, ffn=None),
        ],
    )
    model = build_model(spec, base, seed=1)
    assert model.config.layer_types == ["moe", "full_attention", "moe"]
    ids = _tokens(base.vocab_size, length=8)
    with torch.no_grad():
        full = model(ids).logits
    torch.testing.assert_close(_incremental_logits(model, ids, 3), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 3])
def test_generate_with_and_without_cache_agree(seed):
    _, model = _random_hetero(seed)
    prompt = _tokens(model.config.vocab_size, batch=1, length=5, seed=seed)
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    cached = model.generate(
        prompt, use_cache=True, return_dict_in_generate=True, output_logits=True, **kwargs
    )
    plain = model.generate(
        prompt, use_cache=False, return_dict_in_generate=True, output_logits=True, **kwargs
    )
    assert cached.sequences.shape == (1, 13)
    torch.testing.assert_close(
        torch.stack(cached.logits), torch.stack(plain.logits), rtol=0, atol=1e-5
    )
    assert torch.equal(cached.sequences, plain.sequences)


def test_hidden_states_output():
    _, model = _random_hetero(2)
    ids = _tokens(model.config.vocab_size)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1


@pytest.mark.slow
def test_remote_code_loads_without_autocompress(tmp_path):
    """The saved directory carries its modeling code: it loads where autocompress is absent."""
    spec, model = _random_hetero(4)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    assert "AutoModelForCausalLM" in config["auto_map"]
    assert (model_dir / "modeling_autocompress_hetero.py").exists()
    ids = _tokens(model.config.vocab_size, length=6)
    with torch.no_grad():
        expected = model(ids).logits
    torch.save({"ids": ids, "expected": expected}, tmp_path / "io.pt")

    # -I: ignore PYTHONPATH and the cwd; -S: no site hooks (so no editable install
    # of autocompress); then only the real site-packages directory is added back.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.append({sysconfig.get_paths()["purelib"]!r})
        try:
            import autocompress
        except ImportError:
            pass
        else:
            raise SystemExit("autocompress is importable: test is not isolated")
        import torch
        from transformers import AutoModelForCausalLM
        io = torch.load({str(tmp_path / "io.pt")!r})
        model = AutoModelForCausalLM.from_pretrained({str(model_dir)!r}, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            got = model(io["ids"]).logits
        torch.testing.assert_close(got, io["expected"], rtol=0, atol=1e-6)
        print("REMOTE-OK", type(model).__name__)
        """
    )
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REMOTE-OK HeteroForCausalLM" in result.stdout


def test_load_causal_lm_of_stock_teacher(tmp_path):
    teacher = tiny_model("qwen2", tied=True)
    teacher.save_pretrained(tmp_path)
    model, tokenizer = load_causal_lm(tmp_path)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tokenizer is None
    assert not model.training


def test_unsupported_architecture_lists_supported(tmp_path):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    gpt2.save_pretrained(tmp_path)
    with pytest.raises(AutoCompressError) as err:
        load_causal_lm(tmp_path)
    text = str(err.value)
    assert "GPT2LMHeadModel" in text
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert name in text
    with pytest.raises(AutoCompressError, match="supported"):
        arch_spec_of(gpt2)


def test_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(AutoCompressError, match="does not exist"):
        load_causal_lm(tmp_path / "nowhere")


def test_corrupt_config_is_a_user_error(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(AutoCompressError, match="not valid JSON"):
        load_causal_lm(tmp_path)


def test_truncated_weights_are_a_user_error(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(AutoCompressError, match="corrupt"):
        load_causal_lm(tmp_path)


def test_weights_not_matching_config_are_a_user_error(tmp_path):
    tiny_model("llama", num_layers=2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AutoCompressError, match="corrupt|does not match"):
        load_causal_lm(tmp_path)


def test_build_model_without_a_teacher_config():
    spec = ArchSpec(
        hidden_size=40,
        layers=[
            LayerSpec(attention=AttentionSpec(num_heads=3, num_kv_heads=1), ffn=None),
            LayerSpec(attention=None, ffn=FFNSpec(intermediate_size=24)),
        ],
        head_dim=8,
        vocab_size=50,
    )
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    with pytest.raises(AutoCompressError, match="head_dim"):
        build_model(spec.model_copy(update={"head_dim": None}))
