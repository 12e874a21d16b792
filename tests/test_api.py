"""The Python API: the README's example runs as written, on a tiny teacher."""

from __future__ import annotations

from pathlib import Path

import pytest

import autocompress
from autocompress.modeling.tiny import tiny_model
from autocompress.profiles import TINY as TINY_PROFILE
from bench.report import between_markers

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The Python block between the README's api-example markers."""
    block = between_markers(README.read_text(), "api-example")
    assert block is not None, "README lacks the api-example block"
    return block.split("```python")[1].split("```")[0]


# Seconds per step: the flow's tiny profile (a few probes, search steps and distillation
# tokens, an open gate: the gate itself is tested elsewhere, and no wait for a quiet
# machine: tests/test_busy_machine.py tests it), as the API's settings.
TINY = {**TINY_PROFILE.options, "eval_limit": TINY_PROFILE.eval_limit,
        "eval": TINY_PROFILE.eval_config}


@pytest.mark.slow
def test_the_readme_example_compresses_a_tiny_teacher(tmp_path, monkeypatch, tiny_corpus,
                                                       tiny_tokenizer, capsys):
    teacher = tmp_path / "teacher"
    # Twelve layers: the embedding, the head and the first and last layers are what no pick
    # removes, and with eight a fit taken beside the rest of `make test` put the smallest
    # reachable TPOT at 62.5% of the teacher's, over the example's 60% (twelve cost no
    # measurable time: 24-25 s against 21-25 s).
    tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=64, num_layers=12,
               num_heads=4, gqa_ratio=2, intermediate_size=128, seed=1).save_pretrained(teacher)
    tiny_tokenizer.save_pretrained(teacher)
    home = tmp_path / "home"
    home.mkdir()
    (home / "corpus").symlink_to(tiny_corpus)  # the default corpus, without building it
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(home))
    monkeypatch.chdir(tmp_path)

    code = readme_example()
    # What the test changes: the teacher, and tiny settings for every step.
    assert code.count('"default"') == 1 and code.count('out="compressed")') == 1
    code = code.replace('"default"', repr(str(teacher)))
    code = code.replace('out="compressed")', 'out="compressed", config=TINY)')
    namespace: dict = {"TINY": autocompress.CompressConfig.model_validate(TINY)}
    exec(compile(code, str(README), "exec"), namespace)

    result = namespace["result"]
    assert result.out_dir == Path("compressed") and (tmp_path / "compressed/config.json").exists()
    found = result.search
    assert found.method == "autocompress" and found.params < found.teacher_params
    # The limit is 60% of the teacher's predicted TPOT, and the pick meets it as predicted.
    assert found.limits.max_tpot_ms == found.teacher_predicted["tpot_ms"] * 0.6
    assert found.predicted["tpot_ms"] <= found.limits.max_tpot_ms
    assert result.distill.tokens_seen >= TINY["distill"]["tokens"]
    assert result.evaluation["tasks"] and result.evaluation["heldout_loss"] > 0
    assert result.verification.measured["tpot_ms"] > 0 and result.verified is not None
    assert "verified: " in capsys.readouterr().out


def test_autocompress_search_is_the_api_function(tmp_path):
    import inspect

    import pytest

    import autocompress
    import autocompress.arch_search.run  # loading the search package must not replace it
    from autocompress.api import search
    from autocompress.errors import AutoCompressError

    assert autocompress.search is search and inspect.isfunction(autocompress.search)
    with pytest.raises(AutoCompressError, match="no-such-teacher"):
        autocompress.search(tmp_path / "no-such-teacher", limits=autocompress.Limits(
            max_tpot_ms=1.0))


def test_the_api_accepts_every_method_the_cli_runs():
    from typing import get_args

    from autocompress.api import Method
    from autocompress.defaults import METHODS

    assert set(get_args(Method)) == set(METHODS)
