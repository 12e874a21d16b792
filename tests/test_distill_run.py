"""Distillation runs: losses, interruption + exact resume, the published student."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from autocompress.distill import (
    DistillConfig,
    DistillData,
    DistillStudent,
    WindowBatches,
    default_layer_map,
    default_work_dir,
    distill,
    hidden_cosine_loss,
)
from autocompress.errors import AutoCompressError
from autocompress.losses import kd_loss
from autocompress.training import checkpoint_step

VOCAB, SEQ = 96, 16


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("AUTOCOMPRESS_QUIET", "1")
    torch.set_num_threads(1)


def tiny_llama(layers: int, hidden: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden // 4, max_position_embeddings=64, tie_word_embeddings=True,
        initializer_range=0.2,  # a peaked, non-uniform teacher distribution
    )
    return LlamaForCausalLM(config)


def tiny_data() -> DistillData:
    windows = torch.randint(0, VOCAB, (40, SEQ), generator=torch.Generator().manual_seed(0))
    return DistillData(train=WindowBatches(windows[:32]), heldout=windows[32:])


def config(**overrides) -> DistillConfig:
    base = dict(tokens=8 * SEQ * 10, seq_len=SEQ, batch_size=8, warmup_steps=2, lr=3e-3,
                ckpt_every=3, eval_every=5, eval_batches=1, bf16=False)
    return DistillConfig(**{**base, **overrides})


# ------------------------------------------------------------------ losses


def test_kd_loss_is_forward_kl_scaled_by_t_squared():
    gen = torch.Generator().manual_seed(1)
    s, t = torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen)
    temp = 2.0
    p = F.softmax(t / temp, -1)
    expected = (p * (p.log() - F.log_softmax(s / temp, -1))).sum(-1).mean() * temp**2
    assert torch.allclose(kd_loss(s, t, temp), expected, atol=1e-6)
    assert float(kd_loss(t, t, temp)) == pytest.approx(0.0, abs=1e-6)
    # forward KL is not symmetric
    assert float(kd_loss(s, t)) != pytest.approx(float(kd_loss(t, s)), rel=1e-3)


def test_hidden_cosine_loss_zero_for_parallel_states():
    h = torch.randn(2, 4, 8)
    assert float(hidden_cosine_loss([h], [3 * h])) == pytest.approx(0.0, abs=1e-6)
    assert float(hidden_cosine_loss([h], [-h])) == pytest.approx(2.0, abs=1e-6)


def test_default_layer_map_spreads_a_shallow_student():
    assert default_layer_map(4, 4) == {1: 1, 2: 2, 3: 3, 4: 4}
    mapping = default_layer_map(2, 6)
    assert mapping == {1: 3, 2: 6}
    # a pruned student that kept teacher blocks 0, 2 and 5 matches their outputs
    assert default_layer_map(3, 6, source_layers=[0, 2, 5]) == {1: 1, 2: 3, 3: 6}


def test_narrow_student_gets_a_projection_to_teacher_width():
    student = tiny_llama(2, 32, 1)
    module = DistillStudent(student, {1: 2, 2: 4}, teacher_hidden_size=64)
    logits, hidden = module(torch.randint(0, VOCAB, (2, SEQ)))
    assert logits.shape == (2, SEQ, VOCAB)
    assert [h.shape[-1] for h in hidden] == [64, 64]
    assert module.projection is not None
    assert DistillStudent(student, {}, 64).projection is None  # logits only: none


# ------------------------------------------------------------------ runs


def test_distill_reduces_kl_and_publishes_a_loadable_student(tmp_path):
    teacher, student = tiny_llama(4, 64, 0), tiny_llama(2, 32, 1)
    out = tmp_path / "student"
    result = distill(teacher, student, tiny_data(), config(tokens=8 * SEQ * 15), out)
    assert result.steps == 15 and result.tokens_seen == 15 * 8 * SEQ
    # the caller's teacher is handed back as it was given (trainable, train mode)
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())
    assert result.final_eval["heldout_kd"] < result.initial_eval["heldout_kd"]
    record = json.loads((out / "distill.json").read_text())
    assert [h["loss"] for h in record["history"]] == [h["loss"] for h in result.history]
    loaded = AutoModelForCausalLM.from_pretrained(out)
    batch = torch.randint(0, VOCAB, (1, SEQ))
    with torch.no_grad():
        assert torch.allclose(loaded(batch).logits, student(batch).logits, atol=1e-5)
    # checkpoints are removed after success; nothing half-written remains
    assert not default_work_dir(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student"]


@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_interrupted_run_resumes_exactly(tmp_path, alpha):
    cfg = config(alpha=alpha)
    full = distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 1), tiny_data(), cfg,
                   tmp_path / "full")

    def crash_at_7(step, loss):
        if step == 7:
            raise KeyboardInterrupt("simulated kill")

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 1), tiny_data(), cfg, out,
                on_step=crash_at_7)
    assert not out.exists()  # no final model from an unfinished run
    assert checkpoint_step(default_work_dir(out) / "checkpoints") == 6  # the last before it
    # fresh objects, as a new process would build them (weights come from the checkpoint)
    resumed = distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 7), tiny_data(), cfg, out,
                      resume=True)
    assert len(resumed.history) == len(full.history) == cfg.steps
    for a, b in zip(full.history, resumed.history, strict=True):
        assert a["step"] == b["step"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["lr"] == pytest.approx(b["lr"], abs=1e-12)
    assert resumed.final_eval["heldout_kd"] == pytest.approx(full.final_eval["heldout_kd"],
                                                              abs=1e-6)


def test_existing_checkpoint_needs_resume_and_same_settings(tmp_path):
    out = tmp_path / "s"

    def stop(step, loss):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(), config(), out,
                on_step=stop)
    with pytest.raises(AutoCompressError, match="--resume"):
        distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(), config(), out)
    with pytest.raises(AutoCompressError, match="lr"):
        distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(), config(lr=1e-2), out,
                resume=True)


def test_vocabulary_mismatch_is_a_user_error(tmp_path):
    student = tiny_llama(1, 32, 1)
    student.resize_token_embeddings(VOCAB + 8)
    with pytest.raises(AutoCompressError, match="vocabularies differ"):
        distill(tiny_llama(2, 32, 0), student, tiny_data(), config(), tmp_path / "x")


def test_grad_accumulation_matches_the_full_batch(tmp_path):
    one = distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(),
                  config(tokens=8 * SEQ * 4), tmp_path / "a")
    four = distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(),
                   config(tokens=8 * SEQ * 4, grad_accum=4), tmp_path / "b")
    for a, b in zip(one.history, four.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


def test_each_rank_gets_a_disjoint_share_of_the_global_batch():
    from autocompress.distributed import DistContext, local_micro_batches

    batch = torch.arange(8).unsqueeze(1)
    seen = []
    for rank in range(2):
        micro = local_micro_batches(batch, DistContext(rank=rank, world_size=2), grad_accum=2)
        assert [len(m) for m in micro] == [2, 2]
        seen += [int(x) for m in micro for x in m.flatten()]
    assert sorted(seen) == list(range(8))  # disjoint and complete
    with pytest.raises(AutoCompressError, match="divisible"):
        local_micro_batches(batch, DistContext(rank=0, world_size=3), grad_accum=1)


def test_pruned_hetero_student_from_a_qwen3_teacher(tmp_path):
    """Surgery's output distils: depth- and width-pruned, hidden loss through the projection."""
    from autocompress.arch import ArchSpec
    from autocompress.importance import random_importance
    from autocompress.modeling import load_causal_lm
    from autocompress.modeling.tiny import tiny_model
    from autocompress.prune import prune

    teacher = tiny_model("qwen3", seed=0, num_layers=4, vocab_size=VOCAB, tied=True,
                         initializer_range=0.2)
    spec = ArchSpec.uniform(num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1,
                            intermediate_size=48)
    student = prune(teacher, random_importance(teacher, seed=0), spec, layer_map=[0, 3])
    student.train()
    result = distill(teacher, student, tiny_data(), config(alpha=0.2, tokens=8 * SEQ * 15),
                     tmp_path / "out")
    assert result.layer_map == {1: 1, 2: 4}  # from student.config.source_layers
    assert result.final_eval["heldout_kd"] < result.initial_eval["heldout_kd"]
    losses = [h["loss"] for h in result.history]
    assert sum(losses[-3:]) < sum(losses[:3])
    loaded, _ = load_causal_lm(tmp_path / "out")
    assert type(loaded).__name__ == "HeteroForCausalLM"
    batch = torch.randint(0, VOCAB, (1, SEQ))
    with torch.no_grad():
        assert torch.allclose(loaded(batch).logits, student.eval()(batch).logits, atol=1e-5)


def test_resuming_a_finished_run_returns_its_record(tmp_path):
    out = tmp_path / "s"
    cfg = config(tokens=8 * SEQ * 2)
    first = distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(), cfg, out)
    steps = []
    again = distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(), cfg, out,
                    resume=True, on_step=lambda step, loss: steps.append(step))
    assert steps == [] and again.history == first.history
    # a larger budget is a different run: it replaces the finished one only if asked
    with pytest.raises(AutoCompressError, match="not empty"):
        distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(),
                config(tokens=8 * SEQ * 3), out, resume=True)
    assert (out / "distill.json").exists()  # the refused run lost nothing
    longer = distill(tiny_llama(2, 32, 0), tiny_llama(1, 32, 1), tiny_data(),
                     config(tokens=8 * SEQ * 3), out, resume=True, overwrite=True)
    assert longer.steps == 3


def test_fsdp_units_are_the_decoder_layers_of_the_wrapped_student():
    from autocompress.modeling.blocks import decoder_layers

    student = tiny_llama(3, 32, 1)
    module = DistillStudent(student, {1: 1}, teacher_hidden_size=64)
    assert list(decoder_layers(module)) == list(student.model.layers)
