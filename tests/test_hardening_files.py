"""Nothing lost, nothing executed: output directories, atomic writes, checkpoints (#13)."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import cli

from autocompress.atomic import check_out_dir, publishing_dir, write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.training import (
    TrainConfig,
    TrainState,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    train,
)


class Payload:
    """What an attacker would pickle: unpickling it creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(path, marker) -> None:
    """Write a pickle whose loading runs code, and prove that it would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": Payload(marker)}, path)
    torch.load(path, weights_only=False)  # the unsafe load the old code did...
    assert marker.exists()  # ...runs the payload
    marker.unlink()


# ---------------------------------------------------------------- output dirs


def test_out_dir_rules(tmp_path, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("user data")
    with pytest.raises(AutoCompressError, match="not empty"):
        check_out_dir(full)
    assert check_out_dir(full, overwrite=True) == full
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    check_out_dir(tmp_path / "new")
    (tmp_path / "file").write_text("x")
    with pytest.raises(AutoCompressError, match="is a file"):
        check_out_dir(tmp_path / "file", overwrite=True)
    monkeypatch.chdir(full)
    for never in (".", "..", str(tmp_path)):
        with pytest.raises(AutoCompressError, match="working directory"):
            check_out_dir(never, overwrite=True)


def test_a_failed_publish_leaves_the_old_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), publishing_dir(out, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("half")
        raise RuntimeError("killed while writing")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp left behind
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    with publishing_dir(out, overwrite=True) as tmp:
        write_json_atomic(tmp / "new.json", {"a": 1})
    assert [p.name for p in out.iterdir()] == ["new.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_prune_refuses_a_non_empty_out_and_loses_nothing(tmp_path, monkeypatch, capsys,
                                                          tiny_tokenizer):
    from autocompress.modeling import arch_spec_of
    from autocompress.modeling.tiny import tiny_model

    teacher = tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=32, num_layers=2,
                         num_heads=4, gqa_ratio=2, intermediate_size=64, head_dim=8)
    teacher.save_pretrained(tmp_path / "teacher")
    tiny_tokenizer.save_pretrained(tmp_path / "teacher")
    spec = arch_spec_of(teacher).to_dict()
    spec["layers"][0]["ffn"]["intermediate_size"] = 32
    (tmp_path / "arch.json").write_text(json.dumps(spec))
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("keep me")
    monkeypatch.chdir(work)
    args = ["prune", "--model", tmp_path / "teacher", "--arch", tmp_path / "arch.json",
            "--config", "random_channels=true"]

    for out in (".", work, ".."):
        code, err = cli(capsys, monkeypatch, *args, "--out", out, "--overwrite")
        assert code == 2 and "error: refusing" in err and "working directory" in err
    assert (work / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]

    student = work / "student"
    student.mkdir()
    (student / "mine.txt").write_text("mine")
    code, err = cli(capsys, monkeypatch, *args, "--out", student)
    assert code == 2 and "not empty" in err and "--overwrite" in err
    assert (student / "mine.txt").exists()
    code, _ = cli(capsys, monkeypatch, *args, "--out", student, "--overwrite")
    assert code == 0 and (student / "surgery.json").exists()
    assert not (student / "mine.txt").exists()  # replaced, as asked
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt", "student"]


def test_teacher_train_refuses_a_non_empty_out_before_training(tmp_path, monkeypatch, capsys):
    out = tmp_path / "teacher"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    code, err = cli(capsys, monkeypatch, "teacher", "train",
                    "--config", "{tokens: 2000, prefect: false}", "--out", out)
    assert code == 2 and "not empty" in err and "--overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


# ---------------------------------------------------------------- checkpoints


def _tiny_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    cfg = TrainConfig(max_steps=6, ckpt_every=2, warmup_steps=1, bf16=False)
    return model, cfg, make_optimizer(model, cfg)


def test_checkpoint_rotation_keeps_the_last_good_one(tmp_path, monkeypatch):
    model, cfg, optimizer = _tiny_training()
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, model, optimizer, TrainState(step=2))
    good = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model[0].weight.add_(1.0)

    def killed(obj, path, *args, **kwargs):
        open(path, "wb").write(b"half a checkpoint")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(ckpt, model, optimizer, TrainState(step=4))
    monkeypatch.undo()
    assert checkpoint_step(ckpt) == 2
    assert [p.name for p in ckpt.iterdir()] == ["step-00000002"]
    fresh, _, fresh_opt = _tiny_training()
    assert load_checkpoint(ckpt, fresh, fresh_opt).step == 2
    for key, value in fresh.state_dict().items():
        torch.testing.assert_close(value, good[key])
    save_checkpoint(ckpt, model, optimizer, TrainState(step=4))
    assert [p.name for p in ckpt.iterdir()] == ["step-00000004"]  # the old one goes after


def test_a_planted_training_checkpoint_is_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "ckpt"
    plant(ckpt / "step-00000004" / "state.pt", marker)
    (ckpt / "step-00000004" / "train_state.json").write_text(TrainState(step=4).model_dump_json())
    model, cfg, _ = _tiny_training()
    with pytest.raises(AutoCompressError, match="more than tensors") as err:
        train(model, lambda m, b: m(b).pow(2).mean(), lambda step: torch.randn(2, 4), cfg,
              ckpt_dir=ckpt)
    assert not marker.exists()
    assert "delete" in err.value.hint
    # the old pickle layout (``last/state.pt``) is not even looked at
    plant(tmp_path / "old" / "last" / "state.pt", marker)
    (tmp_path / "old" / "last" / "train_state.json").write_text(TrainState().model_dump_json())
    assert latest_checkpoint(tmp_path / "old") is None
    assert not marker.exists()


def test_checkpoint_json_sidecar_is_plain(tmp_path):
    model, cfg, optimizer = _tiny_training()
    save_checkpoint(tmp_path, model, optimizer, TrainState(step=3))
    final = latest_checkpoint(tmp_path)
    assert json.loads((final / "train_state.json").read_text())["step"] == 3
    blob = torch.load(final / "state.pt", weights_only=True)  # tensors and plain data only
    assert set(blob) >= {"model", "optimizer", "rng"}
