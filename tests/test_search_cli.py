"""`autocompress search` and `autocompress baseline minitron` on a tiny saved teacher."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from autocompress.arch import ArchSpec
from autocompress.cli import app
from autocompress.costmodel import CostModel, Target, get_workload
from autocompress.modeling.tiny import tiny_model

torch.set_num_threads(1)
runner = CliRunner()
TARGET = "h100-sxm/hf-eager/bf16"  # analytic: needs no hardware profile


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("search_cli")
    model = tiny_model("qwen3", tied=True, vocab_size=len(tiny_tokenizer), hidden_size=64,
                       num_layers=3, num_heads=4, gqa_ratio=2, intermediate_size=96, head_dim=16)
    model.save_pretrained(root / "teacher")
    tiny_tokenizer.save_pretrained(root / "teacher")
    return root / "teacher"


def _invoke(args):
    result = runner.invoke(app, args, catch_exceptions=False)
    return result


FAST = ["--config", "dnas.steps=4", "--config", "dnas.batch_size=2", "--config", "dnas.seq_len=16",
        "--config", "space.granularity=8"]


def test_search_cli_writes_an_arch_meeting_the_limit(teacher_dir, tiny_corpus, tmp_path):
    out = tmp_path / "arch.json"
    settings = tmp_path / "search.yaml"  # a settings file, with entries after it
    settings.write_text("score: probability\nselection: {top_k: 3}\n")
    result = _invoke(["search", "--model", str(teacher_dir), "--target", TARGET,
                      "--workload", "interactive", "--budget-fraction", "0.9",
                      "--data", str(tiny_corpus), "--out", str(out), "--config", str(settings),
                      *FAST, "--config", "minitron.distill_tokens=256"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "arch.search.json").read_text())
    short = report["selection"]  # the final pick: short-distilled, lowest KL wins
    assert 1 < len(short) <= 3 and [f["chosen"] for f in short].count(True) == 1
    chosen = next(f for f in short if f["chosen"])
    assert chosen["kl"] == min(f["kl"] for f in short) and chosen["params"] == report["params"]
    spec = ArchSpec.from_json(out).complete_from(ArchSpec.from_json(json.dumps(report["arch"])))
    model = CostModel.for_target(Target.parse(TARGET))
    predicted = model.predict(spec, get_workload("interactive"))
    assert predicted.tpot_ms <= 0.9 * report["teacher_predicted"]["tpot_ms"] * (1 + 1e-12)
    assert report["meets_limits"] and "tpot_ms" in report["margins"]
    assert (tmp_path / "arch.trajectory.png").exists()


def test_unreachable_limit_is_a_one_line_error(teacher_dir, tiny_corpus, tmp_path):
    result = runner.invoke(app, ["search", "--model", str(teacher_dir), "--target", TARGET,
                                 "--workload", "interactive", "--limit", "tpot=0.000001",
                                 "--data", str(tiny_corpus), "--out", str(tmp_path / "a.json"),
                                 *FAST])
    assert result.exit_code != 0
    err = result.exception
    assert "smallest reachable" in str(err)
    assert not (tmp_path / "a.json").exists()


def test_baseline_cli_params_and_matched(teacher_dir, tiny_corpus, tmp_path):
    out = tmp_path / "params.json"
    result = _invoke(["baseline", "minitron", "--model", str(teacher_dir), "--params", "60k",
                      "--data", str(tiny_corpus), "--out", str(out), "--config",
                      "space.granularity=8", "--config", "minitron.top_k=2", "--config",
                      "minitron.distill_tokens=512"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "params.search.json").read_text())
    assert report["params"] <= 60_000 and report["mode"] == "params"
    assert len(report["scored"]) == 2 and all(c["score"] > 0 for c in report["scored"])
    out = tmp_path / "matched.json"
    result = _invoke(["baseline", "minitron", "--model", str(teacher_dir),
                      "--match-target", TARGET, "--workload", "interactive",
                      "--budget-fraction", "0.9", "--data", str(tiny_corpus), "--out", str(out),
                      "--config", '{"space": {"granularity": 8},'
                      ' "minitron": {"distill_tokens": 0}}'])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "matched.search.json").read_text())
    assert report["meets_limits"] and report["mode"] == "matched"
    layers = ArchSpec.from_json(out).layers
    assert len(set(layers)) == 1


@pytest.mark.parametrize("command", [["search"], ["baseline", "minitron"]])
def test_help_renders(command):
    result = runner.invoke(app, [*command, "--help"], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "--budget-fraction" in result.output
