"""`autocompress distill` end to end on a tiny real corpus (standard-library code)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from autocompress.cli import app
from autocompress.data.corpus import build_corpus, load_documents
from autocompress.data.tokenizer import train_tokenizer
from autocompress.modeling import load_causal_lm


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A corpus of stdlib code chunks, a BPE tokenizer, a teacher and a narrower student."""
    root = tmp_path_factory.mktemp("distill_cli")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for name in ("json/decoder.py", "json/encoder.py", "textwrap.py", "bisect.py"):
        text = (stdlib / name).read_text()
        # many small documents so that every split (90/4/6 by path hash) gets some
        rows += [{"path": f"{name}:{i}", "text": text[i:i + 600]}
                 for i in range(0, len(text), 600)]
    (root / "src").mkdir()
    (root / "src" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    corpus = root / "corpus"
    build_corpus(corpus, source=str(root / "src"))
    tokenizer = train_tokenizer((d.text for d in load_documents(corpus, "train")), 300)

    def llama(hidden: int, seed: int) -> LlamaForCausalLM:
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=128, tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))

    teacher, student = root / "teacher", root / "student"
    llama(32, 0).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    llama(32, 1).save_pretrained(student)  # no tokenizer: taken from the teacher
    return {"corpus": corpus, "teacher": teacher, "student": student}


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTOCOMPRESS_QUIET", "1")
    torch.set_num_threads(1)


def _args(pair, out: Path, *extra: str) -> list[str]:
    return ["distill", "--teacher", str(pair["teacher"]), "--model", str(pair["student"]),
            "--tokens", str(4 * 32 * 6), "--out", str(out), "--data", str(pair["corpus"]),
            "--config", "{seq_len: 32, batch_size: 4, eval_batches: 1, ckpt_every: 2}",
            "--config", "warmup_steps=1", "--config", "bf16=false", *extra]


def test_cli_distills_and_writes_a_complete_model_dir(pair, tmp_path):
    out = tmp_path / "distilled"
    result = CliRunner().invoke(app, _args(pair, out, "--config", "alpha=0.5",
                                            "--config", "layer_map={1: 1, 2: 2}"))
    assert result.exit_code == 0, result.output
    record = json.loads((out / "distill.json").read_text())
    assert record["steps"] == 6 and len(record["history"]) == 6
    assert record["layer_map"] == {"1": 1, "2": 2}
    assert record["config"]["alpha"] == 0.5
    assert record["final_eval"]["heldout_kd"] < record["initial_eval"]["heldout_kd"]
    model, tokenizer = load_causal_lm(out)
    assert tokenizer is not None and model.config.vocab_size == len(tokenizer)
    assert not Path(str(out) + ".work").exists()


def test_cli_rejects_a_malformed_layer_map(pair, tmp_path):
    result = CliRunner().invoke(app, _args(pair, tmp_path / "x", "--config", "layer_map=1-2"))
    assert result.exit_code != 0
    assert "layer_map" in str(result.exception) or "layer_map" in result.output
