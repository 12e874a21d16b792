"""Many targets and many budgets: the joint search, the Pareto family, their CLI errors (#17).

A tiny 6-layer Llama under two cost models of opposite structure: one where every block
costs a fixed call overhead (as on this CPU: depth is what costs), one where bytes cost
(width is what costs). Their own architectures differ; the joint one meets both.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import cli

from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import SearchContext
from autocompress.arch_search.dnas import DNASConfig
from autocompress.arch_search.family import run_family
from autocompress.arch_search.multitarget import (
    JointCosts,
    joint_budgets,
    meets_all,
    run_joint_search,
    target_limits,
)
from autocompress.arch_search.options import SpaceConfig
from autocompress.arch_search.run import run_search
from autocompress.arch_search.selection import SelectionConfig
from autocompress.arch_search.space import Choice
from autocompress.costmodel import CostModel, Target, Workload
from autocompress.costmodel.laws import ActivationLaw, LinearLaw
from autocompress.errors import AutoCompressError
from autocompress.limits import Limits
from autocompress.modeling.tiny import tiny_model

WORKLOAD = Workload(name="test", isl=16, osl=4, batch=1)
CONFIG = SearchConfig(
    space=SpaceConfig(granularity=16, ffn_fractions=[1.0, 0.5, 0.25], head_fractions=[1.0, 0.5]),
    dnas=DNASConfig(steps=8, batch_size=2, seq_len=32, teacher_cache=2),
    measured_rounds=0,
    selection=SelectionConfig(top_k=1, depth_variants=False),  # no short distillations here
)
# The search's final pick (a short list, each given the baseline's short distillation):
# three candidates, two optimizer steps each.
PICK = CONFIG.model_copy(update={
    "selection": SelectionConfig(top_k=3),
    "minitron": CONFIG.minitron.model_copy(update={
        "distill_tokens": 2 * 2 * 32, "distill_seq_len": 32, "distill_batch_size": 2,
        "score_batches": 1})})


def _model(target: str, calls: float, per_byte: float) -> CostModel:
    law = LinearLaw(
        prefill={"attn.call": calls, "ffn.call": calls, "const.call": 0.5,
                 "attn.flops": 1e-9, "ffn.flops": 1e-9},
        decode={"attn.call": calls, "ffn.call": calls, "const.call": 0.5,
                "attn.weight_bytes": per_byte, "ffn.weight_bytes": per_byte})
    return CostModel(target=Target.parse(target), timing=law, activation=ActivationLaw.default())


OVERHEAD = _model("h100-sxm/hf-eager/bf16", calls=1.0, per_byte=1e-7)
BYTES = _model("rtx-5070/vllm/bf16", calls=0.01, per_byte=2e-4)


@pytest.fixture(scope="module")
def ctx(tiny_corpus, tiny_tokenizer):
    model = tiny_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=64, num_layers=6,
                       num_heads=4, gqa_ratio=2, intermediate_size=64, head_dim=16, seed=5)
    config = CONFIG.model_copy(update={"calibration": CONFIG.calibration.model_copy(
        update={"seq_len": 32, "batch_size": 2, "num_batches": 2})})
    return SearchContext.build((model, tiny_tokenizer), None, WORKLOAD, config,
                               corpus_dir=tiny_corpus, cost_model=OVERHEAD, progress=False)


def _targets(ctx, fraction=0.6):
    return [target_limits(ctx, model.target.name, model, WORKLOAD, None, fraction)
            for model in (OVERHEAD, BYTES)]


def test_joint_costs_are_each_targets_own_tables(ctx):
    targets = _targets(ctx)
    joint = JointCosts(targets)
    full = ctx.space.full_choice()
    costs = joint.discrete(list(full.attention), list(full.ffn), full.hidden)
    for t in targets:
        own = t.costs.discrete(list(full.attention), list(full.ffn), full.hidden)
        assert costs[f"tpot_ms@{t.name}"] == pytest.approx(own["tpot_ms"])
    assert set(joint_budgets(targets)) == {f"tpot_ms@{t.name}" for t in targets}


def test_joint_search_meets_every_target_and_each_own_pick_differs(ctx):
    targets = _targets(ctx)
    outcome = run_joint_search(ctx, targets, CONFIG)
    assert all(r["meets_limits"] for r in outcome.per_target.values())
    assert set(outcome.lambdas) == set(joint_budgets(targets))  # one multiplier per target
    own = {}
    for t in targets:  # each target's own search, under its own limits only
        single = ctx.__class__(**{**ctx.__dict__, "cost_model": t.cost_model, "costs": t.costs})
        own[t.name] = run_search(single, t.limits, CONFIG, progress=False).spec
    assert own[OVERHEAD.target.name] != own[BYTES.target.name]
    # Neither target's own architecture meets the other's limit here; the joint one meets both.
    crossed = meets_all(own[OVERHEAD.target.name], targets)
    assert not crossed[BYTES.target.name]["meets_limits"] or \
        not meets_all(own[BYTES.target.name], targets)[OVERHEAD.target.name]["meets_limits"]


def _choice(entry: dict) -> Choice:
    c = entry["choice"]
    return Choice(c["hidden"], tuple(c["attention"]), tuple(c["ffn"]))


def _check_short_list(ctx, short: list[dict], spec) -> list[Choice]:
    """A real short list: distinct, repair's answer first, every candidate trained and
    scored, the lowest KL chosen and returned as ``spec``."""
    own = [f for f in short if not f["origin"].startswith("pick under")]  # not carried
    assert 2 <= len(own) <= PICK.selection.top_k and short[0]["origin"] == "repair"
    choices = [_choice(f) for f in short]
    assert len(set(choices)) == len(short)
    assert all(f["kl"] > 0 and f["pruned_kl"] > 0 for f in short)
    assert any(f["kl"] != f["pruned_kl"] for f in short)  # the short distillation ran
    chosen = [f for f in short if f["chosen"]]
    assert len(chosen) == 1 and chosen[0]["kl"] == min(f["kl"] for f in short)
    assert ctx.space.spec_of(choices[short.index(chosen[0])]) == spec
    return choices


def test_joint_final_pick_is_the_lowest_kl_of_a_short_list_meeting_every_target(
        ctx, autocompress_home):
    targets = _targets(ctx)
    outcome = run_joint_search(ctx, targets, PICK)
    report = outcome.report(ctx)
    for choice in _check_short_list(ctx, report["selection"], outcome.spec):
        # every candidate, not only the winner, meets each target's limits under its own model
        verdicts = meets_all(ctx.space.spec_of(choice), targets)
        assert all(v["meets_limits"] for v in verdicts.values())
    assert report["meets_limits"] and report["seconds"]["selection"] > 0
    assert report["evaluations"]["dnas_steps"] == PICK.dnas.steps


def test_joint_measured_loop_calibrates_the_aim_on_the_untrained_answer_first(ctx):
    """Two targets this machine times, one 8% slower than its cost model: the untrained answer
    is timed and re-aimed until it meets both, then the (expensive) pick is made once."""
    from autocompress.arch_search.discretize import measured_scores, repair
    from autocompress.arch_search.measured import TIMING_METRICS
    from autocompress.arch_search.multitarget import joint_measured_loop

    models = [_model("cpu-local/hf-eager/fp32", calls=1.0, per_byte=1e-7),
              _model("cpu-local/hf-eager/bf16", calls=0.01, per_byte=2e-4)]
    targets = [target_limits(ctx, m.target.name, m, WORKLOAD, None, 0.6) for m in models]
    assert all(t.cost_model.target.measurable for t in targets)
    joint, budgets = JointCosts(targets), joint_budgets(targets)
    anchor = ctx.space.full_choice()
    scores = measured_scores(ctx.masked, anchor, ctx.score_batches(CONFIG), radius=None)
    slow, exact = (t.name for t in targets)
    picks = []

    def answer(bounds):
        return ctx.space.spec_of(repair(ctx.space, joint, bounds, anchor, scores).choice)

    def pick(bounds):
        picks.append(bounds)
        return answer(bounds)

    def measure(target, spec):
        factor = 1.08 if target.name == slow else 1.0
        predicted = target.cost_model.predict(spec, target.workload).metrics()
        return {m: factor * predicted[m] for m in TIMING_METRICS}, {}

    spec, rounds = joint_measured_loop(pick, targets, budgets, dict(budgets), 3, measure,
                                       aim=answer)
    assert [r["stage"] for r in rounds] == ["aim", "aim", "pick"]
    assert not rounds[0]["targets"][slow]["met"] and rounds[0]["targets"][exact]["met"]
    assert rounds[1]["met"] and rounds[2]["met"] and len(picks) == 1  # one expensive pick
    assert rounds[2]["targets"][slow]["aim"] == rounds[1]["targets"][slow]["aim"] \
        != rounds[0]["targets"][slow]["aim"]
    assert all(v["meets_limits"] for v in meets_all(spec, targets).values())


def test_joint_search_refuses_memory_limits_and_repeated_targets(ctx):
    memory = target_limits(ctx, "a", OVERHEAD, WORKLOAD, Limits(max_memory_gb=1.0), None)
    other = _targets(ctx)[1]
    with pytest.raises(AutoCompressError, match="memory limit with several targets"):
        run_joint_search(ctx, [memory, other], CONFIG)
    with pytest.raises(AutoCompressError, match="given twice"):
        run_joint_search(ctx, [other, other], CONFIG)


def test_family_runs_one_dnas_and_meets_each_budget(ctx, monkeypatch):
    from autocompress.arch_search import family

    runs = []
    original = family.DNAS.run

    def counted(self, *args, **kwargs):
        runs.append(dict(self.budgets))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(family.DNAS, "run", counted)
    teacher = ctx.teacher_costs()["tpot_ms"]
    limits = [Limits(max_tpot_ms=teacher * f) for f in (0.8, 0.6, 0.4)]
    members = run_family(ctx, limits, CONFIG)
    assert len(runs) == 1 and runs[0] == {"tpot_ms": teacher * 0.6}  # one DNAS, middle budget
    assert all(m.dnas is members[0].dnas for m in members)
    predicted = [m.prediction.metrics()["tpot_ms"] for m in members]
    assert all(p <= lim.max_tpot_ms for p, lim in zip(predicted, limits, strict=True))
    params = [m.spec.num_params() for m in members]
    assert params[0] >= params[1] >= params[2] and params[0] > params[2]


def test_family_final_pick_trains_a_candidate_shared_by_two_budgets_once(
        ctx, autocompress_home, monkeypatch):
    from autocompress.arch_search import context

    trained = []
    original = context.short_distill_scores

    def counted(teacher, importance, specs, *args, **kwargs):
        trained.extend(json.dumps(spec.to_dict(), sort_keys=True) for spec in specs)
        return original(teacher, importance, specs, *args, **kwargs)

    monkeypatch.setattr(context, "short_distill_scores", counted)
    teacher = ctx.teacher_costs()["tpot_ms"]
    limits = [Limits(max_tpot_ms=teacher * f) for f in (0.6, 0.59)]  # close: shared candidates
    # DNAS's side only: the teacher side's repairs differ between these two budgets here.
    dnas_side = PICK.model_copy(update={"selection": SelectionConfig(top_k=3,
                                                                     teacher_anchor=False)})
    members = run_family(ctx, limits, dnas_side)
    listed = []
    for member, own in zip(members, limits, strict=True):
        assert member.prediction.metrics()["tpot_ms"] <= own.max_tpot_ms
        listed += _check_short_list(ctx, member.selection, member.spec)
    assert len(set(listed)) < len(listed)  # a candidate on both budgets' short lists ...
    assert len(trained) == len(set(trained)) == len(set(listed))  # ... trained once
    # The teacher's outputs on the training batches: one cache for every candidate.
    assert len(list((autocompress_home / "teacher-outputs").iterdir())) == 1


def test_family_is_a_front_a_looser_budget_is_offered_the_tighter_picks(
        ctx, autocompress_home, monkeypatch):
    from autocompress.arch_search import context

    def smaller_is_better(teacher, importance, specs, *args, **kwargs):
        # A score under which the tightest budget's pick beats every looser budget's own
        # short list: each looser member must then end with it.
        return [{"pruned_kl": spec.num_params() / 1e5, "kl": spec.num_params() / 1e6}
                for spec in specs]

    monkeypatch.setattr(context, "short_distill_scores", smaller_is_better)
    teacher = ctx.teacher_costs()["tpot_ms"]
    limits = [Limits(max_tpot_ms=teacher * f) for f in (0.8, 0.4, 0.6)]
    members = run_family(ctx, limits, PICK)
    tightest = members[1]
    for member in members:
        chosen = [f for f in member.selection if f["chosen"]]
        assert len(chosen) == 1 and member.spec == tightest.spec
        assert member.prediction.metrics()["tpot_ms"] <= member.limits.max_tpot_ms
        if member is not tightest:  # carried, labelled with the budget it came from
            assert chosen[0]["origin"].startswith(
                f"pick under tpot_ms ≤ {tightest.budgets['tpot_ms']:.4g}")
            assert len(member.selection) > len({f["origin"] for f in member.selection
                                                if f["origin"].startswith("pick under")})


@pytest.mark.parametrize("args, message", [
    (["--budgets", "0.3,x"], "not a comma-separated list"),
    (["--budgets", "0.5"], "two or more distinct fractions"),
    (["--budgets", "0.3,1.5"], "two or more distinct fractions"),
    (["--budgets", "0.3,0.5", "--budget-fraction", "0.5"], "not both"),
    (["--budgets", "0.3,0.5", "--target", "cpu-local/hf-eager/fp32",
      "--target", "cpu-local/llama.cpp/q8_0"], "budgets takes one --target"),
    # The family's own option: --budget-fraction with a comma list.
    (["--budget-fraction", "0.3,x"], "not a comma-separated list"),
    (["--budget-fraction", "0.5,0.5"], "two or more distinct fractions"),
    (["--target", "cpu-local/hf-eager/fp32", "--target", "cpu-local/hf-eager/fp32"],
     "given twice"),
    # (with a limit: a run without one stops first, before the local CPU is profiled)
    (["--target", "cpu-local/hf-eager/fp32", "--target", "nowhere/x", "--budget-fraction",
      "0.5"], "unknown hardware"),
    (["--target", "cpu-local/hf-eager/fp32", "--target", "cpu-local/llama.cpp/q8_0",
      "--baseline"], "single-target run"),
    (["--target", "cpu-local/hf-eager/fp32", "--target", "cpu-local/llama.cpp/q8_0"],
     "no limit to compress for"),
])
def test_run_rejects_bad_target_and_budget_combinations(capsys, monkeypatch, args, message):
    code, err = cli(capsys, monkeypatch, "run", *args)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert err.count("error:") == 1


def _bench():
    import bench.targets

    return bench.targets


def _row(losses_by_seed: list[list[float]], kind: str = "own", mc: float = 0.5) -> dict:
    """A matrix row with per-window held-out losses (one list per seed) and MC items."""
    return {"kind": kind, "params": 1e6, "arch_spec": {"hidden_size": 64, "layers": []},
            "evaluation_report": {str(s): {"heldout_loss": sum(w) / len(w), "mc_mean": mc}
                                  for s, w in enumerate(losses_by_seed)},
            "per_item": {str(s): {"heldout_loss": {str(i): x for i, x in enumerate(w)},
                                  "next_line": {str(i): mc for i in range(len(w))}}
                         for s, w in enumerate(losses_by_seed)}}


def _windows(offset: float, seed: int, n: int = 60) -> list[float]:
    """Held-out windows of different difficulty, shared by every row, plus ``offset`` and
    a row's own noise (drawn from the offset, so rows differ)."""
    base = 4.0 + np.random.default_rng(seed).normal(0, 0.5, n)  # each window's difficulty
    noise = np.random.default_rng([seed, int(abs(offset) * 1e4)]).normal(0, 0.01, n)
    return list(base + offset + noise)


def _matrix(own_a: float, b_in_a: bool, a_in_b: bool = True) -> dict:
    """Measured columns a and b, predicted column g; rows a, b, g (their own)."""
    def column(label, measured=True):
        return {"label": label, "measured": measured}

    def cell(row, col, ok):
        return {"arch": row, "target": col, "ok": ok, "measured": col != "g"}

    rows = {"a": _row([_windows(own_a, s) for s in (0, 1)]),
            "b": _row([_windows(0.0, s) for s in (0, 1)]),
            "g": _row([_windows(0.5, s) for s in (0, 1)])}
    cells = [cell("a", "a", True), cell("b", "a", b_in_a), cell("g", "a", False),
             cell("a", "b", a_in_b), cell("b", "b", True), cell("g", "b", False),
             cell("a", "g", False), cell("b", "g", False), cell("g", "g", True)]
    return {"columns": [column("a"), column("b"), column("g", False)], "rows": rows,
            "cells": cells}


def test_one_rule_decides_each_column_whichever_row_wins():
    """The own row against the most accurate other row within the limit, paired per window
    and seed: holds (interval below 0), reversed (above), tie (straddles), and the two
    cases without a comparison; predicted columns never count."""
    bench = _bench()
    by_column = {e["column"]: e for e in bench.thesis(_matrix(-0.05, b_in_a=True))}
    assert by_column["a"]["verdict"] == "holds" and by_column["a"]["best_other"] == "b"
    assert by_column["a"]["loss"]["high"] < 0
    assert by_column["b"]["verdict"] == "reversed"  # a is within b's limit and better there
    assert by_column["g"]["verdict"] == "only row within the limit"
    counts = bench.thesis_count(list(by_column.values()))
    assert counts["measured_columns"] == 2 and counts["holds"] == 1 and counts["reversed"] == 1
    assert counts["only row within the limit"] == 0  # g is predicted: listed, not counted

    by_column = {e["column"]: e for e in bench.thesis(_matrix(0.0005, b_in_a=True))}
    assert by_column["a"]["verdict"] == by_column["b"]["verdict"] == "tie"
    by_column = {e["column"]: e for e in bench.thesis(_matrix(-0.05, b_in_a=False,
                                                             a_in_b=False))}
    assert by_column["a"]["verdict"] == "only row within the limit"
    data = _matrix(-0.05, b_in_a=True)
    data["cells"][0]["ok"] = False  # a's own row misses a's limit
    assert bench.thesis(data)[0]["verdict"] == "own misses its limit"
    assert "beyond noise on **1 of 2 measured columns**" in bench.thesis_sentence(
        bench.thesis(_matrix(-0.05, b_in_a=True)))


def test_a_column_is_a_target_a_workload_about_a_metric_and_a_budget():
    from autocompress.costmodel import get_workload
    from autocompress.errors import AutoCompressError
    from flows.targets import Column

    column = Column.parse("cpu-local/llama.cpp/q4_0@datacenter-cpu:memory_gb=0.6")
    assert (column.target, column.workload, column.budget_fraction) == (
        "cpu-local/llama.cpp/q4_0", "datacenter-cpu:memory_gb", 0.6)
    assert column.metric == "memory_gb" and column.measured
    assert column.label == "llama.cpp-q4_0.datacenter-cpu-memory_gb"
    assert Column.parse("rtx-5070/vllm/bf16").workload == "interactive-cpu"
    assert not Column.parse("rtx-5070/vllm/bf16@interactive").measured
    workload = get_workload("local-coding-cpu:ttft_ms")
    assert workload.main_metric == "ttft_ms" and workload.isl == 512
    assert get_workload("local-coding-cpu").main_metric == "tpot_ms"  # the preset unchanged
    with pytest.raises(AutoCompressError, match="unknown main metric 'latency'"):
        get_workload("interactive-cpu:latency")
    with pytest.raises(AutoCompressError, match="unknown workload preset 'nope'"):
        Column.parse("cpu-local/hf-eager/fp32@nope:ttft_ms")
    for fraction, why in (("abc", "valid number"), ("-1", "greater than 0")):
        with pytest.raises(AutoCompressError, match=f"invalid column .*budget_fraction.*{why}"):
            Column.parse(f"cpu-local/hf-eager/fp32@interactive-cpu={fraction}")


def test_the_matrix_measures_bf16_only_where_the_cpu_runs_it_natively(tmp_path):
    bench = _bench()
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\n")
    flags = bench.cpu_flags(cpuinfo)
    assert flags == {"fpu", "sse2", "avx2", "fma"} and not bench.native_bf16(flags)
    assert bench.BF16 not in bench.default_columns(flags)
    assert "avx512_bf16, amx_bf16" in bench.absent_targets(flags)[bench.BF16.split("@")[0]]
    cpuinfo.write_text("flags\t\t: avx2 avx512f avx512_bf16\n")
    flags = bench.cpu_flags(cpuinfo)
    assert bench.native_bf16(flags) == ["avx512_bf16"]
    assert bench.BF16 in bench.default_columns(flags)
    assert bench.BF16.split("@")[0] not in bench.absent_targets(flags)
    assert bench.cpu_flags(tmp_path / "absent") == set()


def test_the_matrix_has_vllm_columns_only_where_vllm_is_installed():
    """Where vLLM's environment is missing its columns are left out with the set-up's own
    reason; where it is installed they serve in bf16 only on a CPU that runs bf16 natively."""
    bench = _bench()
    avx2, bf16 = {"avx2", "fma"}, {"avx2", "avx512f", "avx512_bf16"}
    assert not any("/vllm/" in c and c.startswith("cpu-local") for c in
                   bench.default_columns(avx2))
    installed = bench.default_columns(avx2, vllm=True)
    ours = [c for c in installed if c.startswith("cpu-local/vllm/")]
    assert ours == ["cpu-local/vllm/fp32@interactive-cpu=0.7",
                    "cpu-local/vllm/fp32@datacenter-cpu=0.7"]
    assert all(c.startswith("cpu-local/vllm/bf16@") for c in bench.vllm_columns(bf16, True))
    assert installed[-len(bench.PREDICTED):] == bench.PREDICTED  # predicted columns stay last
    absent = bench.absent_targets(avx2, "vLLM is not installed (no environment at x)")
    assert absent["cpu-local/vllm"].startswith("vLLM is not installed")
    assert "cpu-local/vllm" not in bench.absent_targets(avx2)
    from flows.targets import Column

    for column in installed:
        Column.parse(column)  # every default column is one the flows take


def test_every_targets_result_records_the_machine_it_was_measured_on():
    bench = _bench()
    args = type("Args", (), {"eval_limit": 30})()
    stamp = bench._stamp({"before": [1.0, 1.0, 1.0]}, {"search": {}}, args)
    machine = stamp["machine"]
    assert machine["cpu"] and machine["cpu_capability"] and machine["torch_threads"] >= 1
    assert bench._machine(stamp).startswith(f"on {machine['cpu']} (")
    assert stamp["eval_limit"] == 30 and stamp["load_average"]["before"] == [1.0, 1.0, 1.0]


def test_the_front_uses_held_out_loss_where_the_family_has_no_mc_suite():
    bench = _bench()

    def member(tpot, loss, mc=None):
        return {"measured": {"tpot_ms": tpot}, "scores": {"heldout_loss": loss, "mc_mean": mc}}

    # The third is slower than the second and worse: off the front.
    family = [member(0.30, 4.20), member(0.25, 4.30), member(0.28, 4.35)]
    assert bench.on_front(family) == [True, True, False]
    # With the MC suite on every member, it decides instead (higher is better).
    family = [member(0.30, 4.20, 0.50), member(0.25, 4.30, 0.52), member(0.28, 4.35, 0.53)]
    assert bench.on_front(family) == [False, True, True]


def test_the_report_explains_cost_terms_and_renders_every_table(tmp_path):
    """``bench/targets.py``'s cost terms (from a real cost model artifact) and the report it
    writes from a matrix, a joint run and a family (the plots included)."""
    from autocompress.artifacts import Store
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import arch_spec_of, load_causal_lm

    bench = _bench()
    store = Store.from_uri(tmp_path / "store")
    path = tmp_path / "costmodel.json"
    CostModel.analytic(Target.parse("cpu-local/llama.cpp/q8_0")).save(path)
    ref = store.publish(path, "costmodel").model_dump(mode="json")
    terms = bench.cost_terms(ref, "interactive-cpu", "default")
    assert terms["metric"] == "tpot_ms" and terms["teacher"] > 0
    assert 0 < terms["one FFN block"] < terms["FFN widths halved"] < 1
    assert 0 < terms["one attention block"] < terms["half the attention blocks"] < 1
    arch = arch_spec_of(load_causal_lm(str(resolve_model_dir("default")),
                                       with_tokenizer=False)[0]).to_dict()
    scores = {"heldout_loss": 4.2, "heldout_loss_stderr": 0.01, "mc_mean": 0.5,
              "mc_mean_stderr": 0.02}
    label, vllm = "llama.cpp-q8_0.interactive-cpu", "vllm-bf16.interactive-cpu"
    own, matched = _row([_windows(-0.05, s) for s in (0, 1)]), _row(
        [_windows(0.0, s) for s in (0, 1)], kind="params")
    for row in (own, matched):
        row["arch_spec"] = arch

    def cell(row, cost, ok):
        return {"arch": row, "target": label, "measured": True, "ok": ok,
                "costs": {"tpot_ms": cost}, "noise": {"tpot_ms": 0.01},
                "predicted": {"tpot_ms": 0.38}}

    matrix = {"teacher": "default", "seeds": [0, 1], "errors": {},
              "absent": bench.absent_targets(set()), "created": "now", "wall_s": 1.0,
              "eval_limit": 30, "options": {},
              "load_average": {"before": [1, 1, 1], "after": [2, 2, 2]},
              "columns": [{"label": label, "target": "cpu-local/llama.cpp/q8_0",
                           "workload": "interactive-cpu", "budget_fraction": 0.5,
                           "measured": True, "metric": "tpot_ms",
                           "limits": {"max_tpot_ms": 0.4}, "cost_terms": terms,
                           "validation_mape": {"tpot": 2.0}}],
              "rows": {label: own, f"{label}.params": matched},
              "cells": [cell(label, 0.39, True), cell(f"{label}.params", 0.48, False),
                        {**cell(label, 0.39, True), "target": vllm},
                        {**cell(f"{label}.params", 0.0, False), "target": vllm, "costs": {},
                         "refused": "query heads differ per layer: layers 1"}]}
    matrix["columns"].append({**matrix["columns"][0], "label": vllm,
                              "target": "cpu-local/vllm/bf16"})
    selection = [{"origin": "repair", "layers": 8, "kl": 0.5, "chosen": False},
                 {"origin": "2 layers emptied", "layers": 6, "kl": 0.4, "chosen": True}]
    verification = {"measured": {"tpot_ms": 0.39}, "noise": {}, "predicted": {"tpot_ms": 0.38},
                    "limits": {"max_tpot_ms": 0.4, "max_ttft_ms": None}, "ok": True}
    joint = {"targets": ["cpu-local/llama.cpp/q8_0"], "workload": "interactive-cpu",
             "budget_fraction": 0.5, "params": 2e6,
             "scores": scores, "verifications": {"cpu-local/llama.cpp/q8_0": verification},
             "selection": selection,
             "created": "now", "wall_s": 1.0, "load_average": {"before": [1, 1, 1]}}
    member = {"label": "b0.50", "budget_fraction": 0.5, "params": 2e6, "scores": scores,
              "pareto": True, "selection": selection, **verification}
    family = {"target": "cpu-local/llama.cpp/q8_0", "workload": "interactive-cpu",
              "budgets": [0.5, 0.3], "members": [member, {**member, "budget_fraction": 0.3}],
              "family_wall_s": 10.0, "family_steps": [], "created": "now",
              "load_average": {"before": [1, 1, 1]},
              "search_times": {"budgets": [0.5, 0.3], "family_s": 5.0, "family_shared_s": 3.0,
                               "family_params": [2, 1], "one_by_one_s": 8.0,
                               "one_by_one": [{"seconds": 4.0, "params": 2},
                                              {"seconds": 4.0, "params": 1}]}}
    for name, data in (("targets", matrix), ("targets_joint", joint),
                       ("targets_pareto", family)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    text = bench.write_report(tmp_path).read_text()
    assert "✓ 0.39 ± 0.01 (pred 0.38)" in text and "| only row within the limit |" in text
    assert "| refused |" in text  # never timed, so not within the limit, with its reason:
    assert f"on {vllm}: query heads differ per layer: layers 1" in text
    assert "beyond noise on **0 of 1 measured columns**" in text
    assert "| 1,000,000, 1.20 | misses the limit by 20% |" in text
    assert "| cpu-local/llama.cpp/q8_0 | tpot_ms ≤ 0.4 | 0.39 ± – (0.38) | pass |" in text
    assert "one by one 8 s (4, 4 s)" in text
    assert ("final pick among 2 candidates (6-8 layers), each after the baseline's short "
            "distillation: 2 layers emptied, 6 layers, KL 0.4 (repair's own answer: 8 layers, "
            "KL 0.5)") in text
    assert "- **cpu-local/hf-eager/bf16: not in the matrix** — this CPU has none of" in text
    assert "per budget a repair, the search's final pick and the measured loop" in text
    assert "- 30%: final pick among 2 candidates (6-8 layers)" in text
    assert (tmp_path / "targets_heatmaps.png").stat().st_size > 0
    assert (tmp_path / "targets_pareto.png").stat().st_size > 0
