"""GGUF export: tiny homogeneous and heterogeneous models run in llama.cpp as in PyTorch.

Each model is written as f32 GGUF and evaluated by the real engine (f32 KV
cache, flash attention off: it computes in f16 inside) on the same token ids;
logits must match PyTorch's within ``ATOL`` = 1e-4 (max absolute difference over
every position and vocabulary entry; the logits reach ≈ 6, measured error ≈ 7e-6;
a missing q/k rope permutation gives ≈ 6).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.errors import AutoCompressError
from autocompress.gguf_export import gguf_layout, write_gguf

llamacpp = pytest.importorskip("autocompress.llamacpp")
if not llamacpp.engine_available():  # pragma: no cover - the set-up installs it
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)

TEACHER = Path(__file__).parents[1] / "autocompress" / "assets" / "default-teacher"
VOCAB = 4096  # the bundled teacher's tokenizer, which tiny models borrow
ATOL = 1e-4
IDS = [0, 17, 345, 4095, 12, 900, 77, 3000, 5, 64, 2048, 1, 33, 999, 4000, 250]


def _att(q: int, kv: int) -> AttentionSpec:
    return AttentionSpec(num_heads=q, num_kv_heads=kv)


def _ffn(width: int) -> FFNSpec:
    return FFNSpec(intermediate_size=width)


def _model(layers: list[LayerSpec], *, tied: bool = False, bias: bool = False, seed: int = 0):
    """A HeteroForCausalLM of these layers (hidden 64, head_dim 16), norms randomised."""
    from autocompress.modeling import build_model

    spec = ArchSpec(hidden_size=64, layers=layers, head_dim=16, vocab_size=VOCAB,
                    tie_word_embeddings=tied, attention_bias=bias,
                    attention_output_bias=False, mlp_bias=False, qk_norm=False)
    model = build_model(spec, None, seed=seed)
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:  # larger than the 0.02 init, so that attention patterns are not flat
                param.normal_(0.0, 0.15)
    return model


def _check(model, path: Path) -> float:
    """Write ``model`` as f32 GGUF, run IDS in llama.cpp, return max |Δ logit|."""
    report = write_gguf(model, TEACHER, path, "f32")
    with torch.no_grad():
        expected = model(torch.tensor([IDS])).logits[0].numpy()
    with llamacpp.EngineSession(path, n_ctx=64, kv_type="f32", all_logits=True,
                                flash_attn=False) as engine:
        got = engine.logits(IDS)
    assert got.shape == expected.shape
    assert float(abs(expected).max()) > 2.0  # the comparison is not of near-zeros
    delta = float(abs(got - expected).max())
    assert delta < ATOL, f"{report.architecture}: max |Δ logit| {delta:.2e}"
    return delta


HOMOGENEOUS = [LayerSpec(attention=_att(6, 2), ffn=_ffn(96)) for _ in range(3)]
HETERO = [
    LayerSpec(attention=_att(6, 2), ffn=_ffn(96)),   # GQA ratio 3
    LayerSpec(attention=_att(3, 1), ffn=_ffn(40)),   # fewer heads, other width
    LayerSpec(attention=None, ffn=_ffn(64)),         # attention removed
    LayerSpec(attention=_att(4, 4), ffn=None),       # attention only (n_ff trap)
    LayerSpec(),                                     # whole block removed
    LayerSpec(attention=_att(2, 1), ffn=_ffn(32)),
]


def test_homogeneous_llama_matches(tmp_path):
    _check(_model(HOMOGENEOUS, bias=True), tmp_path / "homo.gguf")


def test_heterogeneous_deci_matches(tmp_path):
    model = _model(HETERO, tied=True, seed=3)
    _check(model, tmp_path / "hetero.gguf")
    layout = gguf_layout(ArchSpec.from_hf_config(model.config))
    assert [la.source for la in layout] == [0, 1, 2, 3, 5]  # the empty layer is left out
    assert layout[3].zero_ffn and layout[3].n_ff == 1


def test_first_layer_without_attention_and_empty_last_layer(tmp_path):
    layers = [LayerSpec(attention=None, ffn=_ffn(48)), *HETERO[:2],
              LayerSpec(attention=_att(6, 2), ffn=None), LayerSpec()]
    model = _model(layers, seed=5)
    _check(model, tmp_path / "first.gguf")
    layout = gguf_layout(ArchSpec.from_hf_config(model.config))
    # The empty last layer stays last, as a zero FFN without attention.
    assert layout[0].dummy_attention and len(layout) == 5
    assert layout[-1].source == 4 and layout[-1].n_head == 0 and layout[-1].zero_ffn


@pytest.mark.parametrize(("dtype", "bound"), [("f16", 0.005), ("q8_0", 0.06)])
def test_lossy_types_run_close(tmp_path, dtype, bound):
    """f16 and q8_0 are lossy (q8_0 also quantizes activations in the engine): the
    relative RMS error of the logits is measured at 0.12% (f16) and 3.5% (q8_0) here."""
    model = _model(HETERO, seed=7)
    path = tmp_path / f"{dtype}.gguf"
    report = write_gguf(model, TEACHER, path, dtype)
    with torch.no_grad():
        expected = model(torch.tensor([IDS])).logits[0].numpy()
    with llamacpp.EngineSession(path, n_ctx=64, kv_type="f32", all_logits=True,
                                flash_attn=False) as engine:
        got = engine.logits(IDS)
    relative_rms = float(((got - expected) ** 2).mean() ** 0.5 / (expected**2).mean() ** 0.5)
    assert 1e-5 < relative_rms < bound
    if dtype == "q8_0":
        assert any("f16" in note for note in report.notes)  # width-40 rows fall back
        write_gguf(model, TEACHER, tmp_path / "f32.gguf", "f32")
        assert path.stat().st_size < 0.6 * (tmp_path / "f32.gguf").stat().st_size


def test_tokenizer_and_chat_template_round_trip(tmp_path):
    """The engine tokenizes like the HF tokenizer (gpt2 pre-tokenizer) and keeps the template."""
    from transformers import AutoTokenizer

    source = tmp_path / "tok"
    shutil.copytree(TEACHER, source, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    path = tmp_path / "tok.gguf"
    write_gguf(_model(HOMOGENEOUS), source, path, "f32")
    lib = llamacpp.llama_cpp_module()
    text = "def add(a, b):\n    return a + b  # 42 items\n"
    expected = AutoTokenizer.from_pretrained(source)(text)["input_ids"]
    with llamacpp.EngineSession(path, n_ctx=64) as engine:
        vocab = lib.llama_model_get_vocab(engine._model)
        buffer = (lib.llama_token * 256)()
        n = lib.llama_tokenize(vocab, text.encode(), len(text.encode()), buffer, 256, False, True)
        template = lib.llama_model_chat_template(engine._model, None)
    assert list(buffer[:n]) == expected
    assert template.decode() == config["chat_template"]


def test_refuses_what_it_cannot_write(tmp_path):
    from autocompress.modeling.tiny import tiny_model

    model = tiny_model("qwen3", vocab_size=VOCAB)
    with pytest.raises(AutoCompressError, match="qk_norm"):
        write_gguf(model, TEACHER, tmp_path / "q3.gguf", "f32")
    assert not (tmp_path / "q3.gguf").exists()
    with pytest.raises(AutoCompressError, match="dtype"):
        write_gguf(_model(HOMOGENEOUS), TEACHER, tmp_path / "x.gguf", "q5_k")


def test_export_command_writes_a_gguf_the_engine_loads(tmp_path):
    from typer.testing import CliRunner

    from autocompress.cli import app

    model_dir = tmp_path / "student"
    _model(HETERO, seed=9).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TEACHER / name, model_dir / name)
    args = ["export", "--model", str(model_dir), "--format", "gguf", "--dtype", "q8_0",
            "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "deci" in result.output and "n_ff=1" in result.output
    with llamacpp.EngineSession(tmp_path / "out" / "model.gguf", n_ctx=32) as engine:
        assert engine.memory.model > 0 and engine.memory.kv > 0
    again = CliRunner().invoke(app, args)
    assert isinstance(again.exception, AutoCompressError)
    assert "--overwrite" in str(again.exception)


def test_missing_engine_is_one_line_with_the_fix(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as when not installed
    with pytest.raises(AutoCompressError) as caught:
        llamacpp.llama_cpp_module()
    assert "not installed" in caught.value.message and "make venv" in caught.value.hint
    assert not llamacpp.engine_available()
