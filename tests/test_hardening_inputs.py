"""Untrusted model configs, GGUF files and cost models: one line and exit 2 (#54).

Before, each of these crashed deep inside transformers, the GGUF reader or the
cost model (ZeroDivisionError, TypeError, KeyError, IndexError, an 8 GB list)
with exit 1, the code ``verify`` uses for "limit missed".
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import cli

from autocompress.errors import AutoCompressError


def one_error(err: str) -> str:
    """The ``error:`` line, after checking that one ``hint:`` line follows it and that
    nothing else but notes came before (no traceback)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) >= 2, err
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), err
    assert all(line.startswith("note: ") for line in lines[:-2]), err
    return lines[-2]


LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
         "vocab_size": 100}

# (field, bad value, what the error says); NaN is written as the bare token JSON
# readers such as Python's accept.
BAD_FIELDS = [
    ("num_hidden_layers", 1e9, "num_hidden_layers must be a whole number"),
    ("num_attention_heads", 0, "num_attention_heads must be a whole number, at least 1"),
    ("hidden_size", float("nan"), "hidden_size must be a whole number"),
    ("hidden_size", "abc", "hidden_size must be a whole number"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_FIELDS)
def test_a_malformed_model_config_is_refused_before_anything_is_built(
        tmp_path, capsys, monkeypatch, field, value, message):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA, field: value}))
    # `arch show` loads the config through transformers; `costmodel predict` reads it itself.
    for command in (["arch", "show", model],
                    ["costmodel", "predict", "--model", model / "config.json",
                     "--target", "cpu-local/hf-eager/fp32", "--workload", "interactive-cpu"]):
        code, err = cli(capsys, monkeypatch, *command)
        assert code == 2, (command, err)
        assert message in one_error(err) and "config.json" in err


def test_a_nemotron_config_with_an_absurd_ffn_mult_is_refused(tmp_path, capsys, monkeypatch):
    config = {"model_type": "nemotron-nas", "hidden_size": 64, "num_attention_heads": 4,
              "vocab_size": 100, "block_configs": [
                  {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1e308}}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, err = cli(capsys, monkeypatch, "costmodel", "predict", "--model", path,
                    "--target", "cpu-local/hf-eager/fp32", "--workload", "interactive-cpu")
    assert code == 2 and "layer 0: ffn_mult must be a number above 0" in one_error(err)


# ---------------------------------------------------------------- GGUF


def _gguf(path, spec: str | None = None, file_type: int | None = 0, spec_as_int=False):
    """A small GGUF written with the reference writer, with our metadata as asked."""
    import gguf

    from autocompress.gguf_export import SPEC_KEY

    writer = gguf.GGUFWriter(str(path), "llama")
    if spec_as_int:
        writer.add_uint32(SPEC_KEY, 7)
    elif spec is not None:
        writer.add_string(SPEC_KEY, spec)
    if file_type is not None:
        writer.add_uint32("general.file_type", file_type)
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


SPEC = json.dumps({"hidden_size": 8, "head_dim": 4, "vocab_size": 16, "layers": [
    {"attention": {"num_heads": 2, "num_kv_heads": 1}, "ffn": {"intermediate_size": 16}}]})


def _malformed_ggufs(tmp_path) -> dict:
    good = _gguf(tmp_path / "good.gguf", SPEC).read_bytes()
    files = {
        "empty": b"",
        "not a GGUF": bytes(range(256)) * 4,
        "truncated": good[: len(good) // 3],
        "unknown version": b"GGUF" + b"\xff" * 60,
        "huge tensor count": good[:8] + (2**62).to_bytes(8, "little") + good[16:],
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"{name.replace(' ', '-')}.gguf"
        paths[name].write_bytes(data)
    paths["spec not JSON"] = _gguf(tmp_path / "a.gguf", "{not json")
    paths["spec not a spec"] = _gguf(tmp_path / "b.gguf", '{"hidden_size": 0, "layers": []}')
    paths["spec of the wrong type"] = _gguf(tmp_path / "c.gguf", spec_as_int=True)
    paths["no file type"] = _gguf(tmp_path / "d.gguf", SPEC, file_type=None)
    paths["no spec"] = _gguf(tmp_path / "e.gguf", None)
    return paths


def test_every_malformed_gguf_is_a_usage_error(tmp_path):
    from autocompress.gguf_export import read_gguf_spec

    assert read_gguf_spec(_gguf(tmp_path / "ok.gguf", SPEC))[0].hidden_size == 8
    for name, path in _malformed_ggufs(tmp_path).items():
        with pytest.raises(AutoCompressError, match=str(path)):
            read_gguf_spec(path)
        assert name  # each case named in the id above


def test_verify_on_a_malformed_gguf_exits_2_not_1(tmp_path, capsys, monkeypatch):
    pytest.importorskip("llama_cpp")
    path = _malformed_ggufs(tmp_path)["truncated"]
    code, err = cli(capsys, monkeypatch, "verify", "--model", path, "--target",
                    "cpu-local/llama.cpp/f32", "--max-tpot-ms", "5")
    assert code == 2 and "cannot read GGUF" in one_error(err)


# ---------------------------------------------------------------- cost models


@pytest.mark.parametrize("content", ["[]", '{"model": {"x": 1}}', "nul"])
def test_a_cost_model_file_that_is_not_one_is_refused_naming_it(
        tmp_path, capsys, monkeypatch, autocompress_home, content):
    from autocompress.costmodel.model import default_path
    from autocompress.costmodel.target import Target

    given = tmp_path / "model.json"
    given.write_text(content)
    code, err = cli(capsys, monkeypatch, "costmodel", "predict", "--model", "default",
                    "--target", "cpu-local/hf-eager/fp32", "--workload", "interactive-cpu",
                    "--cost-model", given)
    assert code == 2 and f"cannot read cost model {given}" in one_error(err)
    # The fitted model of a target, read by every predict for it: the same refusal.
    fitted = default_path(Target.parse("cpu-local/hf-eager/fp32"))
    fitted.parent.mkdir(parents=True, exist_ok=True)
    fitted.write_text(content)
    code, err = cli(capsys, monkeypatch, "costmodel", "predict", "--model", "default",
                    "--target", "cpu-local/hf-eager/fp32", "--workload", "interactive-cpu")
    assert code == 2 and f"cannot read cost model {fitted}" in one_error(err)
