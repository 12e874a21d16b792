"""The decisive rule (plan amendment 1): either metric may decide, the other may veto, and
the same test decides both directions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench import campaign, decisive


@pytest.mark.parametrize("mc, gain, expected", [
    ((2.5, 0.4, 4.6), (0.001, -0.01, 0.012), "A beats B"),   # MC clears, bpb silent
    ((0.5, -1.0, 2.0), (0.03, 0.01, 0.05), "A beats B"),     # bpb clears, MC silent
    ((2.5, 0.4, 4.6), (-0.03, -0.05, -0.01), "not distinguishable"),  # bpb contradicts MC
    ((1.5, 0.4, 2.6), (0.0, -0.01, 0.01), "not distinguishable"),     # under the MC bar
    ((2.5, -0.1, 5.0), (0.0, -0.01, 0.01), "not distinguishable"),    # interval crosses 0
])
def test_the_rule_for_claim_1(mc, gain, expected):
    assert decisive.verdict(mc, gain, 2.0, 0.02) == expected


@pytest.mark.parametrize("mc, gain", [((2.5, 0.4, 4.6), (0.001, -0.01, 0.012)),
                                      ((0.5, -1.0, 2.0), (0.03, 0.01, 0.05))])
def test_the_rule_is_symmetric(mc, gain):
    flipped = (decisive.oriented(mc, -1), decisive.oriented(gain, -1))
    assert decisive.verdict(*flipped, 2.0, 0.02) == "B beats A"


def write_eval(path: Path, mc_rate: float, bpb: float, seed: int) -> None:
    rng = random.Random(seed * 1000 + int(mc_rate * 100))
    per_item = {task: {str(i): float(rng.random() < mc_rate) for i in range(300)}
                for task in decisive.MC_TASKS}
    per_item[decisive.BPB_TASK] = {f"HumanEval/{i}": bpb + rng.gauss(0, 0.02)
                                   for i in range(164)}
    per_item[decisive.HELDOUT_TASK] = {str(i): 3.0 + rng.gauss(0, 0.1) for i in range(40)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"per_item": per_item,
                                "tasks": {decisive.BPB_TASK: {"score": bpb}}}))


def test_a_comparison_over_three_seeds_is_decisive_and_turns_with_its_sides(tmp_path):
    units = campaign.plan_units()
    for seed in (0, 1, 2):
        here = tmp_path / f"50-s{seed}-a"
        write_eval(here / "eval_teacher.json", 0.7, 1.0, seed)
        write_eval(here / "eval_greedy.json", 0.6, 1.10, seed)       # 10% of the teacher
        write_eval(here / "eval_minitron-scored.json", 0.6, 1.20, seed)
    claim1 = decisive.COMPARISONS[0]
    row = decisive.compare(claim1, units, 0.5, tmp_path)
    assert row["decisive"] and row["seeds"] == [0, 1, 2]
    assert row["bpb_gain_share"][0] == pytest.approx(0.10, abs=0.01)
    assert row["verdict"] == "A beats B"
    turned = claim1.model_copy(update={"a": claim1.b, "b": claim1.a})
    assert decisive.compare(turned, units, 0.5, tmp_path)["verdict"] == "B beats A"
    # claim 2 has no unit b yet
    assert decisive.compare(decisive.COMPARISONS[2], units, 0.5, tmp_path)["verdict"] == \
        "not run yet"


def test_one_seed_is_reported_as_not_decisive(tmp_path):
    units = campaign.plan_units()
    here = tmp_path / "50-s0-a"
    write_eval(here / "eval_teacher.json", 0.7, 1.0, 0)
    write_eval(here / "eval_greedy.json", 0.6, 1.10, 0)
    write_eval(here / "eval_minitron-scored.json", 0.6, 1.10, 0)
    row = decisive.compare(decisive.COMPARISONS[0], units, 0.5, tmp_path)
    assert not row["decisive"]
    assert "not decisive" in decisive.report_markdown([row], [], 0.5)


def write_compare(path: Path, arch: dict) -> None:
    path.write_text(json.dumps({"runs": [{"methods": {"m": {"seeds": [{"arch": arch}]}}}]}))


def test_both_sides_with_one_architecture_are_named_so_not_called_a_tie(tmp_path):
    units = campaign.plan_units()
    here = tmp_path / "50-s0-b"
    write_eval(here / "eval_teacher.json", 0.7, 1.0, 0)
    for method in ("autocompress", "greedy"):
        write_eval(here / f"eval_{method}.json", 0.6, 1.10, 0)
        write_compare(here / f"compare_{method}.json", {"hidden_size": 576, "layers": [1]})
    claim2 = decisive.COMPARISONS[2]
    row = decisive.compare(claim2, units, 0.5, tmp_path)
    assert row["same_architecture_seeds"] == [0]
    assert "the same architecture on both sides for seed(s) 0" in \
        decisive.report_markdown([row], [], 0.5)
    write_compare(here / "compare_greedy.json", {"hidden_size": 512, "layers": [1]})
    row = decisive.compare(claim2, units, 0.5, tmp_path)
    assert row["same_architecture_seeds"] == []
    assert "same architecture" not in decisive.report_markdown([row], [], 0.5)
