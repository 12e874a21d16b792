"""Every stage on a tiny random model shaped like SmolLM2: GQA 3, tied, a BOS-adding BPE.

SmolLM2-135M has 9 query heads over 3 KV heads, tied embeddings, RoPE θ 1e5 and a
byte-level BPE; a Llama-family tokenizer may also prepend BOS. The stages must not
assume the default teacher's GQA 4, vocabulary or tokenizer: importance, search,
prune, distill (with cached teacher outputs), eval, export and verify all run
here through the CLI, as a user would call them with ``--model DIR``.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from typer.testing import CliRunner

from autocompress.cli import app
from autocompress.modeling import load_causal_lm


def bos_tokenizer(tok) -> PreTrainedTokenizerFast:
    """The same BPE with a post-processor that prepends BOS (as Llama's does)."""
    backend = tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tok.bos_token,
                                   eos_token=tok.eos_token, pad_token=tok.pad_token)


@pytest.fixture(scope="module")
def teacher_dir(tiny_tokenizer, tmp_path_factory):
    tok = bos_tokenizer(tiny_tokenizer)
    assert tok("x = 1")["input_ids"][0] == tok.bos_token_id
    config = LlamaConfig(vocab_size=len(tok), hidden_size=72, intermediate_size=96,
                         num_hidden_layers=4, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=8, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("smol") / "teacher"
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _cli(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def test_every_stage_runs_on_a_smollm2_shaped_model(teacher_dir, tiny_corpus, tmp_path,
                                                    monkeypatch):
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    torch.set_num_threads(1)
    imp, arch = tmp_path / "imp.safetensors", tmp_path / "arch.json"
    _cli("importance", "--model", teacher_dir, "--out", imp, "--data", tiny_corpus,
         "--config", "{seq_len: 32, batch_size: 2, num_batches: 2, removal_batches: 1}")
    _cli("search", "--model", teacher_dir, "--target", "h100-sxm/vllm/bf16", "--workload",
         "interactive", "--budget-fraction", 0.98, "--importance", imp, "--data", tiny_corpus,
         "--config", "{dnas: {steps: 6, batch_size: 2, seq_len: 32}, selection: {top_k: 1}}",
         "--out", arch)
    layers = json.loads(arch.read_text())["layers"]
    for layer in layers:  # every kept attention still groups query heads over KV heads
        if layer.get("attention"):
            att = layer["attention"]
            assert att["num_heads"] % att["num_kv_heads"] == 0
    student, distilled = tmp_path / "student", tmp_path / "distilled"
    _cli("prune", "--model", teacher_dir, "--arch", arch, "--importance", imp, "--out",
         student)
    out = _cli("distill", "--teacher", teacher_dir, "--model", student, "--data", tiny_corpus,
               "--tokens", 4 * 32 * 3, "--config", "{seq_len: 32, batch_size: 4, eval_batches: 1}",
               "--config", "teacher_topk=16", "--out", distilled).output
    assert "teacher outputs (top-16)" in out
    model, tok = load_causal_lm(distilled)
    assert tok("x")["input_ids"][0] == tok.bos_token_id  # the tokenizer travelled intact
    scores = tmp_path / "eval.json"
    _cli("eval", "--model", distilled, "--tasks", "indent,heldout", "--config",
         "{limit: 4, num_items: 8, seq_len: 64}", "--data", tiny_corpus, "--json", scores)
    result = json.loads(scores.read_text())
    assert 0 <= result["tasks"]["indent"]["score"] <= 1 and result["bits_per_byte"] > 0
    # GQA 3 with one global head count exports; a student whose layers differ in query
    # heads is refused in one line (nemotron-nas has one global count).
    _cli("export", "--model", teacher_dir, "--engine", "vllm", "--out",
         tmp_path / "served")
    blocks = json.loads((tmp_path / "served" / "config.json").read_text())["block_configs"]
    assert [b["attention"]["n_heads_in_group"] for b in blocks] == [3] * 4
    _cli("verify", "--model", distilled, "--target", "cpu-local/hf-eager/fp32", "--config",
         "{isl: 8, osl: 4, batch: 1, repeats: 2, warmup: 1}", "--limit", "memory=1",
         "--json", tmp_path / "verify.json")
    assert json.loads((tmp_path / "verify.json").read_text())["ok"]
