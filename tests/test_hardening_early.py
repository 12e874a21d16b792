"""Limits no architecture can meet are refused before importance is computed (#54).

Before, ``SearchContext.build`` computed importance first (~145 s on SmolLM2) and only then
built the space whose cost tables say what is reachable. The cost of an architecture
depends on how many channels it keeps, never on which, so the check now runs on the
teacher's shape alone: in ``SearchContext.build`` (``autocompress search``, the API's
``search``), in the recipe's limits step (``autocompress.compress``) and in the
``compress`` flow's limits stage (``autocompress run``).

Every test traps importance: ``compute_importance`` raises in each module that calls it,
so a run that reached importance fails with ``ImportanceComputed``, not with the refusal.
The controls show the trap is live: a reachable limit runs into it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import cli

import autocompress
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.modeling.tiny import tiny_model

# An analytic target: no cost-model fit or gate times anything, so each test is seconds.
TARGET, WORKLOAD = "h100-sxm/vllm/bf16", "interactive"
REFUSAL = "no architecture in the search space meets every limit"


def error_line(err: str) -> str:
    """The ``error:`` line that ends stderr, followed by its one ``hint:`` line (the
    loaders' progress bars may come before; a traceback may not)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) >= 2, err
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), err
    return lines[-2]


class ImportanceComputed(Exception):
    """Raised by the trap: the run computed importance."""


@pytest.fixture
def no_importance(monkeypatch):
    """``compute_importance`` raises wherever it is called from."""
    import autocompress.arch_search.context
    import autocompress.importance
    import autocompress.recipe

    def trap(*args, **kwargs):
        raise ImportanceComputed("importance was computed")

    for module in (autocompress.importance, autocompress.recipe,
                   autocompress.arch_search.context):
        monkeypatch.setattr(module, "compute_importance", trap)


@pytest.fixture
def teacher(tmp_path, tiny_tokenizer) -> Path:
    """The API test's tiny teacher, saved with its tokenizer."""
    path = tmp_path / "teacher"
    tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=64, num_layers=8,
               num_heads=4, gqa_ratio=2, intermediate_size=128, seed=1).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch, tiny_corpus) -> Path:
    """A private home whose default corpus is the tiny one (nothing is built)."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "corpus").symlink_to(tiny_corpus)
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(path))
    return path


def test_the_early_refusal_is_the_one_the_search_gives(teacher, tiny_corpus):
    """The check on the shape alone says, word for word, what the search says after
    importance, and lets through what the search lets through."""
    from autocompress.arch_search.config import SearchConfig
    from autocompress.arch_search.context import (
        SearchContext,
        check_limits_early,
        check_reachable,
    )
    from autocompress.importance import CalibrationConfig

    config = SearchConfig(calibration=CalibrationConfig(seq_len=32, batch_size=2,
                                                        num_batches=1, removal_batches=0))
    ctx = SearchContext.build(teacher, TARGET, WORKLOAD, config, corpus_dir=tiny_corpus,
                              progress=False)
    teacher_costs = ctx.cost_model.predict(ctx.space.teacher, ctx.workload).metrics()
    for limits in (Limits(max_tpot_ms=0.001), Limits(max_memory_gb=1e-6, max_tpot_ms=1e3),
                   Limits(min_throughput_tok_s=1e9)):
        with pytest.raises(AutoCompressError) as late:
            check_reachable(ctx, limits)
        with pytest.raises(AutoCompressError) as early:
            check_limits_early(ctx.space.teacher, config.space, ctx.cost_model, ctx.workload,
                               limits)
        assert REFUSAL in str(late.value) and "smallest reachable" in str(late.value)
        assert (str(early.value), early.value.hint) == (str(late.value), late.value.hint)
    reachable = Limits(max_tpot_ms=0.9 * teacher_costs["tpot_ms"])
    assert check_limits_early(ctx.space.teacher, config.space, ctx.cost_model, ctx.workload,
                              reachable) == reachable
    assert check_reachable(ctx, reachable) == {"tpot_ms": reachable.max_tpot_ms}


def test_search_refuses_an_unreachable_limit_before_importance(teacher, home, capsys,
                                                               monkeypatch, no_importance):
    out = teacher.parent / "arch.json"
    code, err = cli(capsys, monkeypatch, "search", "--model", teacher, "--target", TARGET,
                    "--workload", WORKLOAD, "--limit", "tpot=0.001", "--out", out)
    line = error_line(err)
    assert code == 2 and REFUSAL in line and "tpot_ms >= " in line, err
    assert not out.exists()
    with pytest.raises(ImportanceComputed):  # the control: a reachable limit gets there
        autocompress.search(teacher, TARGET, WORKLOAD, budget_fraction=0.9)


def test_compress_refuses_a_memory_limit_below_any_architecture_before_importance(
        teacher, home, tiny_corpus, no_importance):
    out = teacher.parent / "compressed"
    with pytest.raises(AutoCompressError, match=REFUSAL) as err:
        autocompress.compress(teacher, TARGET, WORKLOAD, Limits(max_memory_gb=1e-6), out=out,
                              corpus=tiny_corpus)
    assert "memory_gb <= 1e-06 (unreachable; smallest reachable: memory_gb >= " in str(err.value)
    assert not out.exists()
    with pytest.raises(ImportanceComputed):  # the control: a reachable limit gets there
        autocompress.compress(teacher, TARGET, WORKLOAD, budget_fraction=0.9, out=out,
                              corpus=tiny_corpus)


def test_run_stops_at_the_limits_stage_before_importance(teacher, home, capsys, monkeypatch,
                                                         no_importance, prefect_server):
    """``autocompress run`` (the compress flow): the limits stage refuses, exit 2, and the
    store holds no importance artifact. (Prefect logs the failed flow run with its
    traceback before the CLI's one line, as for any stage that fails.)"""
    monkeypatch.delenv("AUTOCOMPRESS_STORE", raising=False)
    code, err = cli(capsys, monkeypatch, "run", "--model", teacher, "--target", TARGET,
                    "--workload", WORKLOAD, "--limit", "tpot=0.001",
                    "--config", "register_as=null", "--config", "track=false")
    lines = err.strip().splitlines()
    assert code == 2 and lines[-1].startswith("hint: "), err
    assert lines[-2].startswith(f"error: {REFUSAL}") and "tpot_ms >= " in lines[-2], err
    published = [p.name for p in (home / "artifacts").rglob("*")]
    assert any("costmodel" in name for name in published), published  # it got that far
    assert not any("importance" in name for name in published), published
