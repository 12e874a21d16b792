"""`autocompress teacher train` through the real ``train_teacher`` Prefect flow (tiny)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from autocompress.cli import app

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": 64, "vocab_size": 300, "seq_len": 64, "batch_size": 4,
        "eval_batches": 1}


@pytest.mark.slow
def test_teacher_train_cli_runs_the_flow(tiny_corpus, tmp_path, monkeypatch, prefect_server):
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("AUTOCOMPRESS_STORE", raising=False)
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus, ignore=shutil.ignore_patterns("tokens"))
    out = tmp_path / "teacher"
    result = CliRunner().invoke(app, [
        "teacher", "train", "--out", str(out), "--config", json.dumps(TINY),
        "--config", "tokens=2000", "--config", "threads=1", "--data", str(corpus),
        "--config", "{eval_tasks: indent, eval_limit: 2, register_as: null}"])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "training.json").read_text())
    assert record["tokens_seen"] == (2000 // (64 * 4)) * 64 * 4 and record["params"] > 0
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert f"teacher written to {out}" in result.output
