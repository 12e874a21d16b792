"""Many targets and many budgets: the joint search, the Pareto family, their CLI errors (#17).

A tiny 6-layer Llama under two cost models of opposite structure: one where every block
costs a fixed call overhead (as on this CPU: depth is what costs), one where bytes cost
(width is what costs). Their own architectures differ; the joint one meets both.
"""

from __future__ import annotations

import json

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
    (["--target", "cpu-local/hf-eager/fp32", "--target", "nowhere/x"], "unknown hardware"),
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
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "targets.py"
    spec = importlib.util.spec_from_file_location("bench_targets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_thesis_check_names_the_most_accurate_architecture_within_each_limit():
    bench = _bench()

    def model(loss):
        return {"evaluation_report": {"heldout_loss": loss, "heldout_loss_stderr": 0.001}}

    def cell(arch, target, ok):
        return {"arch": arch, "target": target, "ok": ok, "measured": True}

    data = {"targets": ["a", "b"], "predicted_targets": [],
            "models": {"a": model(4.50), "b": model(4.40)},
            # a's own architecture is the only one within a's limit; b's limit admits both,
            # and a's (worse loss) is not the best there: b's own is.
            "cells": [cell("a", "a", True), cell("b", "a", False), cell("a", "b", True),
                      cell("b", "b", True)]}
    rows = bench.thesis_rows(data)[2:]
    assert rows[0].startswith("| a | a | a (4.5000)") and rows[0].endswith("| holds |")
    assert rows[1].startswith("| b | a, b | b (4.4000)") and rows[1].endswith("| holds |")
    data["models"]["a"] = model(4.30)  # now a's architecture beats b's own within b's limit
    rows = bench.thesis_rows(data)[2:]
    assert "| b | a, b | a (4.3000)" in rows[1] and rows[1].endswith("**fails** |")


def test_the_matrix_measures_bf16_only_where_the_cpu_runs_it_natively(tmp_path):
    bench = _bench()
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\n")
    flags = bench.cpu_flags(cpuinfo)
    assert flags == {"fpu", "sse2", "avx2", "fma"} and not bench.native_bf16(flags)
    assert bench.BF16 not in bench.default_measured(flags)
    assert "avx512_bf16, amx_bf16" in bench.absent_targets(flags)[bench.BF16]
    cpuinfo.write_text("flags\t\t: avx2 avx512f avx512_bf16\n")
    flags = bench.cpu_flags(cpuinfo)
    assert bench.native_bf16(flags) == ["avx512_bf16"]
    assert bench.default_measured(flags)[-1] == bench.BF16
    assert bench.BF16 not in bench.absent_targets(flags)
    assert bench.cpu_flags(tmp_path / "absent") == set()


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
    matrix = {"targets": ["cpu-local/llama.cpp/q8_0"], "predicted_targets": [],
              "workload": "interactive-cpu", "predicted_workload": "interactive",
              "teacher": "default"}
    terms = bench.cost_terms(ref, matrix, {})
    assert terms["metric"] == "tpot_ms" and terms["teacher"] > 0
    assert 0 < terms["one FFN block"] < terms["FFN widths halved"] < 1
    arch = arch_spec_of(load_causal_lm(str(resolve_model_dir("default")),
                                       with_tokenizer=False)[0]).to_dict()
    scores = {"heldout_loss": 4.2, "heldout_loss_stderr": 0.01, "mc_mean": 0.5,
              "mc_mean_stderr": 0.02}
    limits = {"max_tpot_ms": 0.4}
    matrix.update(absent=bench.absent_targets(set()),
                  budget_fraction=0.5, budget_fractions={"cpu-local/llama.cpp/q8_0": 0.5},
                  created="now", wall_s=1.0, eval_limit=30, options={},
                  load_average={"before": [1, 1, 1], "after": [2, 2, 2]},
                  models={"cpu-local/llama.cpp/q8_0": {
                      "params": 3e6, "arch_spec": arch, "evaluation_report": scores,
                      "limits": limits, "cost_terms": terms, "validation_mape": {"tpot": 2.0}}},
                  cells=[{"arch": "cpu-local/llama.cpp/q8_0", "target": "cpu-local/llama.cpp/q8_0",
                          "measured": True, "ok": True, "costs": {"tpot_ms": 0.39},
                          "noise": {"tpot_ms": 0.01}, "predicted": {"tpot_ms": 0.38}}])
    selection = [{"origin": "repair", "layers": 8, "kl": 0.5, "chosen": False},
                 {"origin": "2 layers emptied", "layers": 6, "kl": 0.4, "chosen": True}]
    verification = {"measured": {"tpot_ms": 0.39}, "noise": {}, "predicted": {"tpot_ms": 0.38},
                    "limits": {"max_tpot_ms": 0.4, "max_ttft_ms": None}, "ok": True}
    joint = {"targets": ["cpu-local/llama.cpp/q8_0"], "budget_fraction": 0.5, "params": 2e6,
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
    assert "✓ 0.39 ± 0.01 (pred 0.38)" in text and "| holds |" in text
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
