"""The importance / prune / arch / export CLI end to end on a tiny Llama with a real corpus."""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from typer.testing import CliRunner

from autocompress.arch import ArchSpec
from autocompress.cli import app
from autocompress.errors import AutoCompressError
from autocompress.importance import Importance
from autocompress.modeling import arch_spec_of, load_causal_lm
from autocompress.modeling.tiny import tiny_model

torch.set_num_threads(1)
runner = CliRunner()


def _stdlib_chunks(count: int = 200, size: int = 1500) -> list[dict]:
    root = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for path in sorted(root.glob("*.py"))[:40]:
        text = path.read_text(encoding="utf-8", errors="ignore")
        for start in range(0, min(len(text), 8 * size), size):
            rows.append({"path": f"{path.name}:{start}", "text": text[start : start + size]})
    return rows[:count]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A corpus dir and a tiny Llama teacher dir with its tokenizer."""
    from autocompress.data.corpus import build_corpus
    from autocompress.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("prune_cli")
    rows = _stdlib_chunks()
    source = root / "docs.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    build_corpus(root / "corpus", source=str(source))
    tokenizer = train_tokenizer([r["text"] for r in rows], vocab_size=300)
    teacher = tiny_model("llama", vocab_size=len(tokenizer), gqa_ratio=2, num_layers=3)
    teacher.save_pretrained(root / "teacher")
    tokenizer.save_pretrained(root / "teacher")
    return root


def _invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result


def test_arch_show_table_and_json(workspace):
    table = _invoke("arch", "show", "--model", workspace / "teacher").output
    assert "LlamaForCausalLM" in table and "KV heads total 6" in table
    printed = _invoke("arch", "show", "--model", workspace / "teacher", "--format", "json")
    spec = ArchSpec.from_json(printed.output)
    assert spec.num_layers == 3 and spec.layers[0].attention.num_kv_heads == 2


def test_importance_prune_export_chain(workspace):
    imp_file = workspace / "imp.safetensors"
    _invoke(
        "importance",
        "--model",
        workspace / "teacher",
        "--data",
        workspace / "corpus",
        "--out",
        imp_file,
        "--config",
        "seq_len=32",
        "--config",
        "batch_size=2",
        "--config",
        "num_batches=3",
        "--config",
        "removal_batches=1",
    )
    imp = Importance.load(imp_file)
    assert imp.num_tokens == 3 * 2 * 32 and imp.base_loss > 0

    arch = workspace / "arch.json"
    arch.write_text(
        json.dumps(
            {
                "hidden_size": 48,
                "layers": [
                    {
                        "attention": {"num_heads": 4, "num_kv_heads": 2},
                        "ffn": {"intermediate_size": 64},
                    },
                    {"attention": {"num_heads": 4, "num_kv_heads": 1}, "ffn": None},
                    {"attention": None, "ffn": {"intermediate_size": 32}},
                ],
            }
        )
    )
    out = workspace / "student"
    _invoke(
        "prune",
        "--model",
        workspace / "teacher",
        "--arch",
        arch,
        "--importance",
        imp_file,
        "--out",
        out,
    )
    model, tokenizer = load_causal_lm(out)
    assert tokenizer is not None and type(model).__name__ == "HeteroForCausalLM"
    record = json.loads((out / "surgery.json").read_text())
    spec = arch_spec_of(model)
    assert (
        record["student_params"] == spec.num_params() == sum(p.numel() for p in model.parameters())
    )
    assert spec.layers[1].ffn is None and spec.hidden_size == 48

    shown = _invoke("arch", "show", "--model", out).output
    assert "HeteroForCausalLM" in shown and "no-op" in shown

    # Hidden pruned to 48 (heads x head_dim stays 64): TensorRT-LLM would mis-read it.
    with pytest.raises(AutoCompressError, match=r"trtllm: head_dim .*\[head-dim\]"):
        _invoke("export", "--model", out, "--out", workspace / "nas", "--engine", "trtllm")
    assert not (workspace / "nas").exists()
    shown = _invoke("export", "--model", out, "--out", workspace / "nas").output
    assert "loads exactly in: vllm, hf" in shown and "not for trtllm" in shown
    assert (
        json.loads((workspace / "nas" / "config.json").read_text())["model_type"] == "nemotron-nas"
    )


def test_prune_computes_importance_or_uses_random_channels(workspace):
    arch = workspace / "small.json"
    ArchSpec.uniform(
        num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=48
    ).to_json(arch)
    _invoke(
        "prune",
        "--model",
        workspace / "teacher",
        "--arch",
        arch,
        "--data",
        workspace / "corpus",
        "--out",
        workspace / "computed",
    )
    _invoke(
        "prune",
        "--model",
        workspace / "teacher",
        "--arch",
        arch,
        "--config",
        "random_channels=true",
        "--out",
        workspace / "random",
    )
    computed = json.loads((workspace / "computed" / "surgery.json").read_text())
    random = json.loads((workspace / "random" / "surgery.json").read_text())
    assert computed["importance"] == "computed" and random["importance"].startswith("random")
    assert len(computed["layer_map"]) == 2 and computed["layer_map"][0] == 0
    assert computed["layer_map"][-1] == 2  # first and last layers are protected


def test_unsupported_model_exits_2_with_supported_list(tmp_path, monkeypatch, capsys):
    from autocompress import cli

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(
        tmp_path
    )
    monkeypatch.setattr(sys, "argv", ["autocompress", "arch", "show", "--model", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel" in err and "Qwen3ForCausalLM" in err
