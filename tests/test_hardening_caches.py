"""Caches and stores are checked when read, not trusted for their header (#54).

Each test corrupts real bytes on disk the way a bad sector, a stray edit or a
killed run would, then shows that the next reader notices, says so in one line
and rebuilds, so that the result equals the one from intact data.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_distill_run import SEQ, config, tiny_data, tiny_llama

from autocompress.artifacts import LocalStore, sha256_path, verify
from autocompress.data.tokens import PackedTokens, packed_split
from autocompress.distill import WindowBatches, default_work_dir, distill


def flip_byte(path, offset_from_end: int = 9) -> None:
    """Change one byte near the end of ``path`` (inside the data, past any header)."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x5A
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- teacher outputs


def test_a_corrupt_teacher_output_shard_is_rebuilt_not_trained_on(tmp_path, capfd):
    teacher, data = tiny_llama(4, 64, 0), tiny_data()
    data.heldout = None
    cfg = config(tokens=8 * SEQ * 10, teacher_topk=16)  # 10 steps: shards 0 and 1
    cache = tmp_path / "cache"
    first = distill(teacher, tiny_llama(2, 32, 1), data, cfg, tmp_path / "a", outputs_dir=cache)
    (shard,) = (p for p in cache.rglob("shard-00000.safetensors"))
    flip_byte(shard)  # one byte of the stored log-probs (the header is untouched)
    capfd.readouterr()

    second = distill(teacher, tiny_llama(2, 32, 1), data, cfg, tmp_path / "b", outputs_dir=cache)

    note = capfd.readouterr().err
    assert f"teacher-output shard {shard} does not match its content hash" in note
    assert second.teacher_outputs["steps_built"] == 8  # the corrupt shard only
    assert second.teacher_outputs["steps_reused"] == 2
    # Trained on the teacher's true outputs again: the same losses as the first run.
    assert [h["loss"] for h in second.history] == [h["loss"] for h in first.history]


# ---------------------------------------------------------------- tokenized corpus


def test_a_changed_tokenized_cache_is_rebuilt(tmp_path, tiny_corpus, tiny_tokenizer, capfd):
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus, ignore=shutil.ignore_patterns("tokens"))
    before = PackedTokens(tiny_tokenizer, corpus, "train", 64).windows.clone()
    (arrow,) = list((corpus / "tokens").rglob("*.arrow"))
    # Change token ids in place: a valid arrow file that holds other tokens.
    table = np.frombuffer(arrow.read_bytes(), dtype=np.uint8).copy()
    ids = table[len(table) // 2: len(table) // 2 + 2000]
    table[len(table) // 2: len(table) // 2 + 2000] = (ids.astype(np.int32) + 1) % 256
    arrow.write_bytes(table.tobytes())
    capfd.readouterr()

    after = PackedTokens(tiny_tokenizer, corpus, "train", 64).windows

    assert "does not match its content hash" in capfd.readouterr().err
    assert after.equal(before)
    # Intact now: read again without a note.
    packed_split(tiny_tokenizer, corpus, "train", 64)
    assert "content hash" not in capfd.readouterr().err


# ---------------------------------------------------------------- distillation work files


def test_a_stale_reference_eval_of_another_student_is_not_reported(tmp_path):
    teacher, cfg = tiny_llama(4, 64, 0), config(tokens=8 * SEQ * 4, teacher_topk=0)
    out = tmp_path / "student"

    def killed_at_step_1(step, loss):
        raise KeyboardInterrupt("killed before the first checkpoint")

    with pytest.raises(KeyboardInterrupt):  # another student's run, killed early
        distill(teacher, tiny_llama(2, 48, 3), tiny_data(), cfg, out, on_step=killed_at_step_1)
    stale = json.loads((default_work_dir(out) / "reference_eval.json").read_text())

    result = distill(teacher, tiny_llama(2, 32, 1), tiny_data(), cfg, out)
    alone = distill(teacher, tiny_llama(2, 32, 1), tiny_data(), cfg, tmp_path / "alone")

    assert result.initial_eval == alone.initial_eval  # this student's own "before"
    assert result.initial_eval["heldout_loss"] != stale["initial"]["heldout_loss"]
    recorded = json.loads((out / "distill.json").read_text())
    assert recorded["initial_eval"] == alone.initial_eval


def test_a_checkpoint_of_another_run_is_not_resumed(tmp_path):
    from autocompress.errors import AutoCompressError

    teacher, cfg = tiny_llama(4, 64, 0), config(tokens=8 * SEQ * 5, teacher_topk=0)
    out = tmp_path / "student"

    def killed_at_step_4(step, loss):
        if step == 4:
            raise KeyboardInterrupt("killed after the checkpoint of step 3")

    with pytest.raises(KeyboardInterrupt):
        distill(teacher, tiny_llama(2, 32, 1), tiny_data(), cfg, out, on_step=killed_at_step_4)
    other_data = tiny_data()
    other_data.train = WindowBatches(other_data.train.windows.flip(0))  # other token windows
    with pytest.raises(AutoCompressError, match="belongs to another run"):
        distill(teacher, tiny_llama(2, 32, 1), other_data, cfg, out, resume=True)


# ---------------------------------------------------------------- the artifact store


def test_publishing_over_a_corrupt_store_entry_restores_it(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (model / "config.json").write_text('{"layers": 2}')
    store = LocalStore(tmp_path / "store")
    ref = store.publish(model, "model")
    stored = ref.local_path()
    flip_byte(stored / "weights.bin")
    assert verify(ref) == "mismatch"
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its pid now names a process that no longer runs
    stale = stored.with_name(f".{stored.name}.tmp-{finished.pid}-0123abcd")
    shutil.copytree(model, stale)  # what a publish killed mid-copy leaves

    again = store.publish(model, "model")  # what the error's hint says: re-run the stage

    assert again.sha256 == ref.sha256
    assert verify(again) == "ok"
    assert sha256_path(stored) == sha256_path(model)
    assert not stale.exists()  # the killed publish's copy is gone
