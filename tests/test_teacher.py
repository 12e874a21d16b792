"""Teacher training on a tiny budget: it learns, publishes a complete dir, and resumes."""

from __future__ import annotations

import json

from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from autocompress.teacher import TeacherConfig, train_teacher, write_model_card


def _tiny_cfg(tokens: int) -> TeacherConfig:
    return TeacherConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=128, vocab_size=512, seq_len=64, batch_size=4,
                         tokens=tokens, warmup_steps=2, threads=1, eval_batches=2, lr=3e-3)


def test_teacher_trains_publishes_and_resumes(tiny_corpus, tmp_path):
    out, work = tmp_path / "teacher", tmp_path / "work"
    card = train_teacher(out, _tiny_cfg(64 * 4 * 30), work, corpus_dir=tiny_corpus)
    losses = card["loss_curve"]
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5  # it learned something
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    assert model.config.num_hidden_layers == 2 and tok.eos_token == "<|endoftext|>"
    assert json.loads((out / "training.json").read_text())["tokens_seen"] == 64 * 4 * 30
    # A longer budget continues from the saved checkpoint instead of starting over.
    longer = train_teacher(out, _tiny_cfg(64 * 4 * 40), work, corpus_dir=tiny_corpus)
    assert longer["tokens_seen"] == 64 * 4 * 40
    assert card["resumed_from_step"] == 0 and longer["resumed_from_step"] == 30
    readme = write_model_card(out)
    assert "held-out loss" in readme.read_text()
