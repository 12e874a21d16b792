"""The many-target flows end to end (#17): ``compress-joint`` and ``pareto`` on a tiny teacher.

Real stages under Prefect's test server, on a tiny Llama saved with its tokenizer: profile
(this machine's, with its few seconds of microbenchmarks), a cost model fitted on
5 measured probes, the gate (its thresholds off: 2 probes measure nothing), importance,
the searches (3 DNAS steps, a final pick of 2 candidates), prune, distil, the held-out
evaluation and a measured ``verify`` per target or budget. Sizes are tiny so the test is
about what the flows publish, not about the figures.
"""

from __future__ import annotations

import json
import os
import tempfile

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-home-"))

import pytest  # noqa: E402
import torch  # noqa: E402

from autocompress.artifacts import fetch  # noqa: E402
from autocompress.modeling.tiny import tiny_model  # noqa: E402

TARGETS = ["cpu-local/hf-eager/fp32", "cpu-local/hf-eager/bf16"]
OPTIONS = {
    "costmodel": {"n_probes": 5, "repeats": 1},
    "validation": {"n": 2, "repeats": 1, "max_mape": None, "min_kendall_tau": None},
    "importance": {"seq_len": 32, "batch_size": 2, "num_batches": 2, "removal_batches": 0},
    "search": {"dnas": {"steps": 3, "batch_size": 2, "seq_len": 32, "teacher_cache": 1},
               "score_batches": 1, "measured_rounds": 0,
               "selection": {"top_k": 2},
               "minitron": {"distill_tokens": 2 * 2 * 32, "distill_seq_len": 32,
                            "distill_batch_size": 2, "score_batches": 1}},
    "distill": {"tokens": 2 * 2 * 64, "batch_size": 2, "seq_len": 64, "eval_batches": 1},
    "verify": {"repeats": 2},
}


@pytest.fixture
def flow_env(tmp_path, monkeypatch, prefect_server, tiny_corpus, tiny_tokenizer):
    """A fresh home and a tiny teacher."""
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    for var in ("AUTOCOMPRESS_STORE", "AUTOCOMPRESS_RESULTS", "AUTOCOMPRESS_FAULTS",
                "AUTOCOMPRESS_MLFLOW_ARTIFACTS", "AUTOCOMPRESS_TIMING_LOCK"):
        monkeypatch.delenv(var, raising=False)
    teacher = tmp_path / "teacher"
    tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=64, num_layers=4,
               num_heads=4, gqa_ratio=2, intermediate_size=128, seed=1).save_pretrained(teacher)
    tiny_tokenizer.save_pretrained(teacher)
    torch.set_num_threads(1)
    return {"teacher": str(teacher), "corpus_dir": str(tiny_corpus), "workload": "interactive-cpu",
            "options": OPTIONS, "seed": 0, "eval_tasks": "heldout", "eval_limit": 2,
            "track": False}


def _json(ref) -> dict:
    return json.loads(fetch(ref).read_text())


def _search(ref) -> dict:
    return json.loads((fetch(ref) / "arch.search.json").read_text())


@pytest.mark.serial
@pytest.mark.slow(seconds=40)
def test_joint_and_pareto_flows_publish_a_verified_model_per_target_and_budget(flow_env):
    from flows.targets import budget_label, compress_joint, pareto, target_label

    # One architecture for two targets: every target's limits, one model, verified on each.
    # 0.8, not 0.7: on a loaded machine a 5-probe bf16 fit put the smallest reachable TPOT at
    # 0.73 of the teacher's, and the joint search refused to start (this tests the plumbing).
    report = compress_joint(targets=TARGETS, budget_fraction=0.8, **flow_env)
    out = report.outputs
    search = _search(out["arch"])
    assert search["kind"] == "joint-search" and search["meets_limits"]
    assert set(search["targets"]) == set(TARGETS)
    assert len(search["selection"]) == 2 and sum(c["chosen"] for c in search["selection"]) == 1
    missed = []
    for target in TARGETS:
        key = target_label(target)
        verification = _json(out[f"verification.{key}"])
        limits = out[f"limits.{key}"]  # the fraction of the teacher's cost on that target
        assert verification["target"] == target and verification["measured"]["tpot_ms"] > 0
        assert verification["limits"]["max_tpot_ms"] == limits.max_tpot_ms
        assert search["targets"][target]["limits"] == limits.model_dump(exclude_none=True)
        missed += [] if verification["ok"] else [target]
    assert out[f"limits.{target_label(TARGETS[0])}"] != out[f"limits.{target_label(TARGETS[1])}"]
    assert any("misses its limits" in n for n in report.notes) == bool(missed)
    assert out["evaluation"].metrics["heldout_loss"] > 0

    # A family of two budgets from one search on one target: a model and its verify each.
    # 0.6 sat at the edge of this space: the smallest reachable TPOT was 0.61 of the teacher's
    # on some of the 5-probe fits, and the family refused to start.
    budgets = [0.85, 0.7]
    report = pareto(target=TARGETS[0], budgets=budgets, **flow_env)
    out = report.outputs
    steps = {s.name: s.state for s in report.steps}
    assert steps["costmodel.hf-eager-fp32"] == "Cached"  # the joint run's: shared stages
    chosen_kl = []
    for fraction in budgets:
        label = budget_label(fraction)
        member = _search(out[f"arch.{label}"])
        verification = _json(out[f"verification.{label}"])
        assert member["kind"] == "search" and member["meets_limits"]
        assert member["limits"]["max_tpot_ms"] == pytest.approx(
            fraction * member["teacher_predicted"]["tpot_ms"])
        assert verification["limits"]["max_tpot_ms"] == member["limits"]["max_tpot_ms"]
        assert verification["target"] == TARGETS[0] and verification["measured"]["tpot_ms"] > 0
        assert member["selection"] and out[f"evaluation.{label}"].metrics["heldout_loss"] > 0
        chosen_kl += [f["kl"] for f in member["selection"] if f["chosen"]]
    # A front: the looser budget was offered the tighter one's pick (the final pick's score).
    assert len(chosen_kl) == 2 and chosen_kl[0] <= chosen_kl[1]
    family = fetch(out["family"])
    assert sorted(p.name for p in family.iterdir()) == sorted(map(budget_label, budgets))


@pytest.mark.slow(seconds=50)
def test_the_matrix_distils_every_row_per_seed_and_resumes_after_an_interruption(
        flow_env, monkeypatch):
    """Columns of a target, a workload about another metric and a predicted GPU: each
    column's own row, a params-matched row for the measured one, two seeds of every row
    with per-item scores; a failure among the cells, then a re-run that takes every finished
    stage from the cache."""
    from flows.targets import Column, targets_matrix
    from tasks.stage import reset_faults

    # Not serial: no limit here is timed tightly (no measured loop; the checks do not ask
    # that verify passes), so the other pytest worker's load changes no assertion.
    columns = [Column.parse("cpu-local/hf-eager/fp32@interactive-cpu:ttft_ms=0.9"),
               Column.parse("rtx-5070/vllm/bf16@interactive=0.99")]
    env = {k: v for k, v in flow_env.items() if k != "workload"}
    search = env["options"]["search"]  # the params-matched pick: the largest, no short list
    env["options"] = {**env["options"], "search": {
        **search, "minitron": {**search["minitron"], "top_k": 1}}}
    monkeypatch.setenv("AUTOCOMPRESS_FAULTS", "verify:3")  # every attempt of the first cell
    reset_faults()
    with pytest.raises(Exception, match="injected fault"):
        targets_matrix(columns=columns, seeds=[0, 1], **env)
    monkeypatch.delenv("AUTOCOMPRESS_FAULTS")
    data = targets_matrix(columns=columns, seeds=[0, 1], **env)
    measured, predicted = (c.label for c in columns)
    assert set(data["rows"]) == {measured, f"{measured}.params", predicted}
    assert data["errors"] == {}
    steps = {s["name"]: s["state"] for s in data["steps"]}
    ran = {name for name, state in steps.items() if state != "Cached"}
    # Everything before the cells came from the cache, and the cell that failed ran again
    # (another cell may be a cache hit too: on a small space the params-matched search can
    # find the own row's architecture, and then its cell is the own row's, already run).
    assert ran <= {name for name in steps if name.startswith("cell.")}
    assert f"cell.{measured}.{measured}" in ran
    matched = data["rows"][f"{measured}.params"]
    assert matched["kind"] == "params" and matched["params"] <= data["rows"][measured]["params"]
    for row in data["rows"].values():
        assert set(row["scores"]) == {"0", "1"} and row["models"]["0"] != row["models"]["1"]
    column = next(c for c in data["columns"] if c["label"] == measured)
    assert column["metric"] == "ttft_ms" and column["measured"] and "max_ttft_ms" in column[
        "limits"]
    cells = {(c["arch"], c["target"]): c for c in data["cells"]}
    assert cells[measured, measured]["measured"] and cells[measured, measured]["costs"][
        "ttft_ms"] > 0
    assert not cells[measured, predicted]["measured"]
