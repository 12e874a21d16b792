"""lab/pruned_kl_by_split.py and lab/block_local_probe.py: a recorded short list's KL right
after pruning on each corpus split, and after block-local distillation."""

from __future__ import annotations

import json

import pytest

from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import SearchContext
from autocompress.arch_search.dnas import DNASConfig
from autocompress.arch_search.minitron import MinitronConfig
from autocompress.arch_search.options import SpaceConfig
from autocompress.arch_search.selection import short_distill_scores
from autocompress.modeling.tiny import tiny_model

SPACE = SpaceConfig(granularity=16, ffn_fractions=[1.0, 0.5], head_fractions=[1.0, 0.5])


@pytest.fixture(scope="module")
def pk():
    from lab import pruned_kl_by_split

    return pruned_kl_by_split


@pytest.fixture(scope="module")
def setup(tiny_corpus, tiny_tokenizer, tmp_path_factory):
    """A saved tiny teacher, its importance, and a search report with two candidates."""
    root = tmp_path_factory.mktemp("pk")
    model = tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=64, num_layers=4,
                       num_heads=4, gqa_ratio=2, intermediate_size=64, head_dim=16, seed=3)
    model.save_pretrained(root / "teacher")
    tiny_tokenizer.save_pretrained(root / "teacher")
    config = SearchConfig(space=SPACE, dnas=DNASConfig(batch_size=4, seq_len=32),
                          minitron=MinitronConfig(distill_tokens=0, score_batches=2))
    config = config.model_copy(update={"calibration": config.calibration.model_copy(
        update={"seq_len": 32, "batch_size": 2, "num_batches": 2})})
    ctx = SearchContext.build((model, tiny_tokenizer), None, None, config,
                              corpus_dir=tiny_corpus, progress=False)
    ctx.importance.save(root / "importance.safetensors")
    full = ctx.space.full_choice()
    pruned = full.replace_block("ffn", 1, 1).replace_block("attention", 2, 1)
    specs = [ctx.space.spec_of(c) for c in (full, pruned)]
    # What the short list records: KL right after pruning on the search's score batches.
    scored = short_distill_scores(ctx.model, ctx.importance, specs, None,
                                  ctx.score_batches(config, 2), 0, 32, 4, 1e-3, 0)
    rows = [{"origin": origin, "params": 1, "pruned_kl": s["pruned_kl"], "kl": s["kl"],
             "choice": c.to_dict()}
            for origin, c, s in zip(("teacher: repair", "repair"), (full, pruned), scored,
                                    strict=True)]
    report = root / "arch.search.json"
    report.write_text(json.dumps({"space": {"config": SPACE.model_dump()}, "selection": rows}))
    args = ["--report", str(report), "--teacher", str(root / "teacher"),
            "--importance", str(root / "importance.safetensors"), "--corpus", str(tiny_corpus),
            "--windows", "8", "--seq-len", "32"]
    return root, args, rows


def test_the_calibration_column_reproduces_the_short_lists_pruned_kl(pk, setup):
    root, args, rows = setup
    out = root / "out.json"
    assert pk.main([*args, "--out", str(out)]) == 0
    measured = json.loads(out.read_text())["rows"]
    assert [r["origin"] for r in measured] == ["teacher: repair", "repair"]
    teacher, pruned = (r["pruned_kl"] for r in measured)
    assert all(abs(v) < 1e-4 for v in teacher.values())  # the teacher itself: no loss
    assert pruned["calibration"] == pytest.approx(rows[1]["pruned_kl"], abs=1e-4)
    assert pruned["heldout"] > 0.0 and pruned["train"] > 0.0
    assert pruned["heldout"] != pruned["calibration"]  # other text, another value
    assert json.loads(out.read_text())["machine"]["cpu"]  # machines differ between sessions


def test_a_finished_row_is_not_measured_again(pk, setup, monkeypatch):
    root, args, _ = setup
    out = root / "resume.json"
    assert pk.main([*args, "--out", str(out)]) == 0
    before = json.loads(out.read_text())

    def no_prune(*_a, **_k):
        raise AssertionError("a finished row was pruned again")

    monkeypatch.setattr("autocompress.prune.prune", no_prune)
    assert pk.main([*args, "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == before
    # Another window count is another measurement: it starts over (and prunes).
    with pytest.raises(AssertionError, match="pruned again"):
        pk.main([*args[:-4], "--windows", "4", "--seq-len", "32", "--out", str(out)])


def test_a_report_without_choices_is_refused(pk, setup, tmp_path, capsys):
    root, args, _ = setup
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"selection": [{"origin": "repair", "pruned_kl": 1.0}]}))
    with pytest.raises(SystemExit) as exit_info:
        pk.main(["--report", str(bare), *args[2:], "--out", str(tmp_path / "o.json")])
    assert exit_info.value.code == 2 and "no short list with choices" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


@pytest.fixture(scope="module")
def blp():
    from lab import block_local_probe

    return block_local_probe


def test_block_local_training_lowers_the_kl_of_partial_blocks_only(blp, setup):
    root, args, rows = setup
    common = [*args, "--train-batches", "2", "--threads", "1"]
    untrained, trained = root / "bld0.json", root / "bld.json"
    assert blp.main([*common, "--steps", "0", "--out", str(untrained)]) == 0
    assert blp.main([*common, "--steps", "20", "--lr", "1e-3", "--out", str(trained)]) == 0
    before, after = (json.loads(p.read_text())["rows"] for p in (untrained, trained))
    # The teacher itself has no partial block; the candidate one narrower FFN and attention.
    assert [r["partial_blocks"] for r in after] == [0, 2]
    assert after[0]["block_local_kl"] == pytest.approx(0.0, abs=1e-4)
    for row, report_row in zip(before, rows, strict=True):  # no step: the pruned KL itself
        assert row["block_local_kl"] == row["pruned_kl"]
        assert row["pruned_kl"] == pytest.approx(report_row["pruned_kl"], abs=1e-4)
    # Trained toward the teacher's block outputs, and the KL measured with the trained weights.
    assert after[1]["block_mse_after"] < after[1]["block_mse_before"]
    assert before[1]["block_mse_after"] == before[1]["block_mse_before"]
    assert after[1]["block_local_kl"] != after[1]["pruned_kl"]
    gains = json.loads(trained.read_text())["summary"]
    assert gains["teacher_side_gain"] == pytest.approx(0.0, abs=1e-4)  # nothing to train
    assert gains["search_side_gain"] == pytest.approx(
        after[1]["pruned_kl"] - after[1]["block_local_kl"], abs=1e-3)
