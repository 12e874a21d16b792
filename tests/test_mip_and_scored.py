"""``mip`` (an exact integer program on greedy's block scores) and ``minitron-scored``
(Minitron's homogeneous grid through greedy's selection), on tiny real Llamas.

The program's answers are checked against brute-force enumeration of every legal choice
of a small space, under a timing budget and a memory budget together, on a dynamic-cache
engine (hf-eager: the memory peak sums over layers) and a static one (llama.cpp).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autocompress.arch_search.config import SearchConfig
from autocompress.arch_search.context import SearchContext, teacher_scores
from autocompress.arch_search.discretize import CostTables, Scores, feasible, repair
from autocompress.arch_search.dnas import DNASConfig
from autocompress.arch_search.minitron import MinitronConfig, candidates
from autocompress.arch_search.minitron_scored import is_homogeneous, widest_within
from autocompress.arch_search.mip import mip_finalists, solve
from autocompress.arch_search.options import SpaceConfig
from autocompress.arch_search.run import run_method
from autocompress.arch_search.selection import layers_kept
from autocompress.arch_search.space import Choice
from autocompress.costmodel import CostModel, Target, Workload
from autocompress.costmodel.laws import ActivationLaw, LinearLaw
from autocompress.limits import Limits
from autocompress.modeling.tiny import tiny_model

WORKLOAD = Workload(name="test", isl=16, osl=4, batch=1)


def _config(**space) -> SearchConfig:
    config = SearchConfig(
        space=SpaceConfig(granularity=16, **space),
        dnas=DNASConfig(steps=6, batch_size=2, seq_len=32, teacher_cache=2),
        minitron=MinitronConfig(top_k=3, distill_tokens=0, score_batches=1),
        measured_rounds=0)
    return config.model_copy(update={"calibration": config.calibration.model_copy(
        update={"seq_len": 32, "batch_size": 2, "num_batches": 2})})


def _cost_model(target: str, call: float = 1.0, per_byte: float = 1e-6) -> CostModel:
    """Each block costs a call overhead plus ``per_byte`` per weight byte, as on a CPU."""
    calls = {"attn.call": call, "ffn.call": call, "const.call": 0.5}
    law = LinearLaw(prefill={**calls, "attn.flops": 1e-9, "ffn.flops": 1e-9},
                    decode={**calls, "attn.weight_bytes": per_byte, "ffn.weight_bytes": per_byte})
    return CostModel(target=Target.parse(target), timing=law,
                     activation=ActivationLaw.default())


def _context(tokenizer, corpus, layers: int, target: str, config: SearchConfig,
             cost_model: CostModel | None = None):
    model = tiny_model("llama", vocab_size=len(tokenizer), hidden_size=64, num_layers=layers,
                       num_heads=4, gqa_ratio=2, intermediate_size=64, head_dim=16, seed=5)
    return SearchContext.build((model, tokenizer), None, WORKLOAD, config, corpus_dir=corpus,
                               cost_model=cost_model or _cost_model(target), progress=False)


SMALL = _config(hidden_fractions=[1.0, 0.5], ffn_fractions=[1.0, 0.5], head_fractions=[1.0, 0.5],
                kv_reduction=False)


@pytest.fixture(scope="module", params=["h100-sxm/hf-eager/bf16", "cpu-local/llama.cpp/q4_0"])
def small(request, tiny_corpus, tiny_tokenizer):
    ctx = _context(tiny_tokenizer, tiny_corpus, 4, request.param, SMALL)
    assert ctx.costs.dynamic_cache == ("hf-eager" in request.param)
    return ctx


def _every_legal_choice(space):
    att = [k for k in range(len(space.attention_options))]
    ffn = [k for k in range(len(space.ffn_options))]
    for h in range(len(space.hidden_options)):
        for a in itertools.product(att, repeat=space.num_layers):
            for f in itertools.product(ffn, repeat=space.num_layers):
                choice = Choice(h, a, f)
                if space.is_legal(choice):
                    yield choice


def _random_scores(space, seed: int) -> Scores:
    """Scores of both signs (as measured scores around a pruned anchor can be)."""
    rng = np.random.default_rng(seed)
    att = rng.normal(size=space.allowed_attention.shape)
    ffn = rng.normal(size=space.allowed_ffn.shape)
    return Scores(rng.normal(size=len(space.hidden_options)),
                  np.where(space.allowed_attention.numpy(), att, np.inf),
                  np.where(space.allowed_ffn.numpy(), ffn, np.inf), source="random")


def test_the_program_returns_the_enumerated_optimum_under_every_limit(small):
    space = small.space
    every = list(_every_legal_choice(space))
    assert len(every) > 1000  # the enumeration is the check: it must be a real search
    tables = CostTables(small.costs, ["tpot_ms", "memory_gb"])
    costs = [tables.evaluate(c) for c in every]
    teacher = small.teacher_costs()
    for scores in (teacher_scores(small, SMALL), _random_scores(space, 0),
                   _random_scores(space, 1)):
        for tpot_share, memory_share in ((0.6, 1.0), (0.8, 0.5), (0.45, 0.7)):
            low, high = (min(c["memory_gb"] for c in costs), max(c["memory_gb"] for c in costs))
            budgets = {"tpot_ms": tpot_share * teacher["tpot_ms"],
                       "memory_gb": low + memory_share * (high - low)}
            fits = [(scores.total(c), c) for c, cost in zip(every, costs, strict=True)
                    if feasible(cost, budgets) and np.isfinite(scores.total(c))]
            found = solve(space, small.costs, scores, budgets)
            if not fits:
                assert found == []
                continue
            best = min(v for v, _ in fits)
            assert found[0].objective == pytest.approx(best, abs=1e-9)
            for s in found:  # each hidden size's optimum, each within every budget
                at_h = min(v for v, c in fits if c.hidden == s.choice.hidden)
                assert s.objective == pytest.approx(at_h, abs=1e-9)
                assert feasible(tables.evaluate(s.choice), budgets)
                predicted = small.cost_model.predict(space.spec_of(s.choice), WORKLOAD)
                assert all(predicted.metrics()[m] <= b * (1 + 1e-12)
                           for m, b in budgets.items())
            for kept in range(1, space.num_layers + 1):  # the optimum at every depth
                at_depth = [v for v, c in fits if layers_kept(space, c) == kept]
                held = solve(space, small.costs, scores, budgets, kept=kept)
                assert (held[0].objective if held else None) == (
                    pytest.approx(min(at_depth), abs=1e-9) if at_depth else None)
                assert all(layers_kept(space, s.choice) == kept for s in held)


def test_the_exact_program_is_never_worse_than_greedy_repair_on_the_same_scores(small):
    scores = teacher_scores(small, SMALL)
    teacher = small.teacher_costs()
    for share in (0.4, 0.55, 0.7, 0.85):
        budgets = {"tpot_ms": share * teacher["tpot_ms"]}
        greedy = repair(small.space, small.costs, budgets, small.space.full_choice(), scores)
        found = solve(small.space, small.costs, scores, budgets)
        assert (greedy is None) == (not found)
        if greedy is not None:
            assert found[0].objective <= greedy.score + 1e-9


# ------------------------------------------------------------------ both methods end to end


@pytest.fixture(scope="module")
def six(tiny_corpus, tiny_tokenizer):
    """Six layers where both depth and width cost time: budgets have homogeneous
    answers at several depths."""
    config = _config(ffn_fractions=[1.0, 0.5, 0.25], head_fractions=[1.0, 0.5])
    target = "h100-sxm/hf-eager/bf16"
    cost_model = _cost_model(target, call=0.3, per_byte=1e-5)
    return _context(tiny_tokenizer, tiny_corpus, 6, target, config, cost_model), config


@pytest.mark.parametrize("share", [0.5, 0.6, 0.8])
def test_minitron_scored_only_ever_proposes_homogeneous_candidates(six, share):
    ctx, config = six
    budgets = {"tpot_ms": share * ctx.teacher_costs()["tpot_ms"]}
    grid = candidates(ctx.space, ctx.importance, config.minitron)
    assert all(is_homogeneous(ctx.space, c.choice) for c in grid)
    tables = CostTables(ctx.costs, list(budgets))
    proposed = widest_within(ctx.space, grid, tables, budgets)
    assert proposed and all(feasible(tables.evaluate(c.choice), budgets) for c in proposed)
    assert len({len(c.dropped) for c in proposed}) >= 2  # the same depth freedom
    assert all(not other.covers(c, ctx.space) for c in proposed for other in proposed
               if other is not c)  # none smaller than a budget allows

    report = run_method(ctx, "minitron-scored", Limits(max_tpot_ms=budgets["tpot_ms"]),
                        config).report(ctx)
    rows = report["selection"]
    assert report["kind"] == "minitron-scored" and len(rows) >= 2
    grid_choices = {c.choice for c in grid}
    for row in rows:  # the short list, spread over depth as greedy's is
        choice = Choice(row["choice"]["hidden"], tuple(row["choice"]["attention"]),
                        tuple(row["choice"]["ffn"]))
        assert choice in grid_choices and is_homogeneous(ctx.space, choice)
    assert len({row["layers"] for row in rows}) == min(len(rows), len(
        {layers_kept(ctx.space, c.choice) for c in proposed}))
    chosen = [row for row in rows if row["chosen"]]
    assert len(chosen) == 1 and chosen[0]["kl"] == min(row["kl"] for row in rows)
    assert report["meets_limits"] and report["scored_candidates"] == len(proposed)


def test_mip_runs_greedys_final_pick_and_reports_the_relaxations_gap(six):
    ctx, config = six
    limits = Limits(max_tpot_ms=0.5 * ctx.teacher_costs()["tpot_ms"])
    report = run_method(ctx, "mip", limits, config).report(ctx)
    assert report["kind"] == "mip" and report["meets_limits"]
    assert report["program_objective"] <= report["greedy_repair_score"] + 1e-9
    rows = report["selection"]
    assert rows[0]["origin"] == "mip" and len({r["layers"] for r in rows}) >= 3
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["kl"] == min(r["kl"] for r in rows)
    budgets = {"tpot_ms": limits.max_tpot_ms}
    finalists = mip_finalists(ctx.space, ctx.costs, teacher_scores(ctx, config), budgets, True)
    tables = CostTables(ctx.costs, ["tpot_ms"])
    assert all(feasible(tables.evaluate(f.choice), budgets) for f in finalists)
    assert any(not is_homogeneous(ctx.space, f.choice) for f in finalists)  # per-layer picks
