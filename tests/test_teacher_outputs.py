"""The teacher-output cache: the top-k KL, reuse across students, and the bf16 choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_distill_run import SEQ, VOCAB, config, tiny_data, tiny_llama

from autocompress.distill import distill, kd_loss
from autocompress.teacher_outputs import cached_kd_loss


def _top(teacher_logits, k, temperature=1.0):
    logp = torch.log_softmax(teacher_logits / temperature, -1)
    values, indices = logp.topk(k, -1)
    tail = torch.log((1 - values.exp().sum(-1)).clamp(min=0))
    return values, indices, tail


def test_cached_kl_is_exact_with_the_whole_vocabulary_and_a_lower_bound_below():
    gen = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 40, generator=gen), 3 * torch.randn(2, 5, 40, generator=gen)
    for temp in (1.0, 2.0):
        full = float(kd_loss(s, t, temp))
        assert float(cached_kd_loss(s, *_top(t, 40, temp), temp)) == pytest.approx(full,
                                                                                   rel=1e-5)
        partial = [float(cached_kd_loss(s, *_top(t, k, temp), temp)) for k in (1, 8, 32)]
        # Collapsing outcomes never increases a KL; more outcomes get closer to it.
        assert 0 <= partial[0] <= partial[1] <= partial[2] <= full + 1e-6
    assert float(cached_kd_loss(t, *_top(t, 8))) == pytest.approx(0.0, abs=1e-5)


def _forward_counter(model):
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_students_share_the_teacher_outputs(tmp_path):
    teacher = tiny_llama(4, 64, 0)
    data = tiny_data()
    data.heldout = None  # no held-out scoring: every teacher call is for training
    cfg = config(tokens=8 * SEQ * 10, teacher_topk=16)
    calls = _forward_counter(teacher)
    first = distill(teacher, tiny_llama(2, 32, 1), data, cfg, tmp_path / "a",
                    outputs_dir=tmp_path / "cache")
    built = len(calls)
    assert first.teacher_outputs["steps_built"] == 16 and built == 16  # two shards of 8
    # A second student on the same teacher and data: the teacher is not run again.
    second = distill(teacher, tiny_llama(2, 32, 1), data, cfg, tmp_path / "b",
                     outputs_dir=tmp_path / "cache")
    assert len(calls) == built and second.teacher_outputs["steps_built"] == 0
    assert [h["loss"] for h in second.history] == [h["loss"] for h in first.history]
    # Another teacher, or other data, is another cache.
    other = distill(tiny_llama(4, 64, 5), tiny_llama(2, 32, 1), data, cfg, tmp_path / "c",
                    outputs_dir=tmp_path / "cache")
    assert other.teacher_outputs["steps_built"] == 16
    assert len(list((tmp_path / "cache").iterdir())) == 2
    # A damaged shard is recomputed, never read.
    shard = Path(first.teacher_outputs["dir"]) / "shard-00001.safetensors"
    shard.write_bytes(b"garbage")
    again = distill(teacher, tiny_llama(2, 32, 1), data, cfg, tmp_path / "d",
                    outputs_dir=tmp_path / "cache")
    assert again.teacher_outputs["steps_built"] == 8
    assert [h["loss"] for h in again.history] == [h["loss"] for h in first.history]


def test_cached_run_follows_the_live_teacher(tmp_path):
    """With k = vocabulary the cached loss is the live loss (up to fp16 storage)."""
    teacher, data = tiny_llama(4, 64, 0), tiny_data()
    live = distill(teacher, tiny_llama(2, 32, 1), data, config(teacher_topk=0), tmp_path / "a")
    cached = distill(teacher, tiny_llama(2, 32, 1), data, config(teacher_topk=VOCAB),
                     tmp_path / "b", outputs_dir=tmp_path / "cache")
    assert live.teacher_outputs == {} and cached.teacher_outputs["topk"] == VOCAB
    for a, b in zip(live.history, cached.history, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-3, abs=2e-3)


def test_bf16_is_chosen_by_timing_both(tmp_path):
    result = distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 1), tiny_data(),
                     config(tokens=8 * SEQ * 2, bf16=True), tmp_path / "a",
                     outputs_dir=tmp_path / "cache")
    probe = result.bf16_probe
    assert probe["fp32_s"] > 0 and probe["bf16_s"] > 0
    assert result.bf16 == (probe["bf16_s"] < 0.95 * probe["fp32_s"])
    # Measured once per machine and model size: a second run (or a resume) keeps the choice
    # even if the machine's load would now time it the other way.
    again = distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 1), tiny_data(),
                    config(tokens=8 * SEQ * 2, bf16=True), tmp_path / "c",
                    outputs_dir=tmp_path / "cache")
    assert again.bf16 == result.bf16 and again.bf16_probe["decided"] == "earlier on this machine"
    off = distill(tiny_llama(4, 64, 0), tiny_llama(2, 32, 1), tiny_data(),
                  config(tokens=8 * SEQ * 2, bf16=False), tmp_path / "b",
                  outputs_dir=tmp_path / "cache")
    assert off.bf16 is False and off.bf16_probe == {}
