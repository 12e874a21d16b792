"""bench/compare.py: the sweep it asks for, and compare.json from real published artifacts.

The artifacts below are small files published to a real local store, shaped like the
compress flow's outputs; their numbers are made up (a fixture) and claim nothing.
"""

from __future__ import annotations

import json

import pytest

from autocompress.artifacts import Store
from bench import report


@pytest.fixture(scope="module")
def compare():
    from autocompress.commands.bench import _compare_module

    return _compare_module()


def test_sweep_covers_methods_seeds_presets_and_budgets(compare):
    args = compare.build_parser().parse_args([
        "--presets", "interactive-cpu", "datacenter-cpu", "--budgets", "0.6", "0.4",
        "--seeds", "0", "1", "2", "--distill-tokens", "50000",
        "--tight-distill-tokens", "1000000"])
    runs = compare.sweep_runs(args)
    assert len(runs) == 2 * 2 * 3 * len(compare.METHODS)
    assert len({r["label"] for r in runs}) == len(runs)
    assert {r["method"] for r in runs} == {"autocompress", "minitron", "greedy", "random"}
    for r in runs:
        opts = r["options"]
        seed = int(r["label"].rsplit("-s", 1)[1])
        assert opts["search"]["dnas"]["seed"] == opts["distill"]["seed"] == seed
        tight = r["budget_fraction"] == 0.4
        assert opts["distill"]["tokens"] == (1_000_000 if tight else 50_000)
    # Seed 0 of every cell comes first, so an interrupted run has whole cells.
    first = runs[: 2 * 2 * len(compare.METHODS)]
    assert {r["options"]["distill"]["seed"] for r in first} == {0}
    # --options merges over the defaults, key by key.
    args.options = json.dumps({"distill": {"lr": 5e-4}})
    merged = compare.stage_options(args, seed=1, fraction=0.6)
    assert merged["distill"]["lr"] == 5e-4 and merged["distill"]["seed"] == 1
    # Fewer seeds for the ablations: greedy and random run seed 0 only, the others all three.
    args.ablation_seeds = [0]
    runs = compare.sweep_runs(args)
    seeds_of = {m: sorted({r["options"]["distill"]["seed"] for r in runs if r["method"] == m})
                for m in compare.METHODS}
    assert seeds_of == {"autocompress": [0, 1, 2], "minitron": [0, 1, 2],
                        "greedy": [0], "random": [0]}
    assert len(runs) == 2 * 2 * (3 + 3 + 1 + 1)


def test_limits_from_an_earlier_comparison_replace_the_budget_fraction(compare, tmp_path):
    from autocompress.errors import AutoCompressError
    from flows.sweep import SweepPoint

    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [
        {"preset": "interactive-cpu", "budget_fraction": 0.5,
         "limits": {"max_tpot_ms": 3.6886186682551267}},
        {"preset": "interactive-cpu", "budget_fraction": 0.7, "limits": {"max_tpot_ms": 5.1}}]}))
    args = compare.build_parser().parse_args([
        "--presets", "interactive-cpu", "--budgets", "0.5", "--seeds", "0",
        "--methods", "minitron", "--limits-from", str(earlier)])
    (run,) = compare.sweep_runs(args)
    # The earlier file's limit, bit for bit, and no fraction of this machine's cost model.
    assert run["limits"] == {"max_tpot_ms": 3.6886186682551267}
    assert "budget_fraction" not in run
    point = SweepPoint(label=run["label"], overrides={k: v for k, v in run.items()
                                                      if k != "label"})
    assert compare.run_fraction(point, args) == 0.5
    args.budgets = [0.4]  # a cell the earlier file does not have
    with pytest.raises(AutoCompressError, match="no limits for interactive-cpu @ 0.4"):
        compare.sweep_runs(args)
    earlier.write_text("{}")
    args.budgets = [0.5]
    with pytest.raises(AutoCompressError, match="cannot read the limits"):
        compare.sweep_runs(args)


def test_carried_limits_take_the_teacher_reading_that_set_them_and_a_refusal_exits_2(
        compare, tmp_path, monkeypatch):
    """Each run under --limits-from carries the teacher's reading where its limits were set
    (the flow stops after timing the teacher on a host >10% away); --allow-host-drift runs
    anyway. A comparison whose runs were refused writes its JSON and exits with the cause."""
    from autocompress.errors import AutoCompressError
    from autocompress.limits import HOST_REFUSAL
    from flows.sweep import SweepPoint, SweepReport

    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [{
        "preset": "interactive-cpu", "budget_fraction": 0.5, "limits": {"max_tpot_ms": 3.0},
        "teacher_verify": {"measured": {"tpot_ms": 6.0}}}]}))
    argv = ["--presets", "interactive-cpu", "--budgets", "0.5", "--seeds", "0", "--methods",
            "minitron", "--limits-from", str(earlier), "--json", str(tmp_path / "out.json")]
    (run,) = compare.sweep_runs(compare.build_parser().parse_args(argv))
    assert run["limits_origin"] == {"from": "earlier.json", "teacher_measured": {"tpot_ms": 6.0}}
    (run,) = compare.sweep_runs(compare.build_parser().parse_args([*argv,
                                                                   "--allow-host-drift"]))
    assert "limits_origin" not in run and run["limits"] == {"max_tpot_ms": 3.0}

    refusal = f"the limits from earlier.json were set where ... so {HOST_REFUSAL}"
    refused = SweepPoint(label=run["label"], error=refusal,
                         overrides={k: v for k, v in run.items() if k != "label"})
    monkeypatch.setattr(compare, "run_sweep", lambda args: SweepReport(
        points=[refused], score_metric="mc_mean", cost_metrics=["tpot_ms"]))
    with pytest.raises(AutoCompressError, match=HOST_REFUSAL) as err:
        compare.main(argv)
    assert "--allow-host-drift" in err.value.hint
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["runs"][0]["methods"]["minitron"]["failed"] == {"0": refusal}


def _publish_json(store, tmp_path, name, data, kind):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return store.publish(path, kind)


def _publish_dir(store, tmp_path, name, files, kind):
    folder = tmp_path / name
    folder.mkdir()
    for fname, data in files.items():
        (folder / fname).write_text(data if isinstance(data, str) else json.dumps(data))
    return store.publish(folder, kind)


def _point(store, tmp_path, method, seed, mc, teacher_refs):
    from flows.sweep import SweepPoint

    costs = {"ttft_ms": 10.0, "tpot_ms": 3.0, "memory_gb": 0.01}
    tag = f"{method}{seed}"
    search = {"arch": {"hidden_size": 64, "layers": []}, "params": 1000 + seed,
              "teacher_params": 5000, "predicted": costs, "meets_limits": True,
              "margins": {}, "seconds": 1.0, "teacher_predicted": costs,
              "cost_model": "fit", "scored_candidates": 7, "kind": method,
              "selection": [{"origin": "repair", "layers": 3, "params": 1000 + seed,
                             "pruned_kl": 0.9, "kl": 0.5, "chosen": True, "choice": {}}],
              "measured_rounds": [{"stage": "pick", "params": 1000 + seed, "met": True,
                                   "predicted": costs, "measured": {"tpot_ms": 3.1}}]}
    evals = {"heldout_loss": 4.0}
    outputs = {
        "arch": _publish_dir(store, tmp_path, f"arch-{tag}", {"arch.search.json": search},
                             "archspec"),
        "model": _publish_dir(store, tmp_path, f"model-{tag}", {"distill.json": {
            "steps": 2, "tokens_seen": 100, "seconds": 1.0, "initial_eval": {"heldout_loss": 5},
            "final_eval": evals, "teacher_eval": evals}}, "model"),
        "evaluation": _publish_json(store, tmp_path, f"eval-{tag}.json", {
            "mc_mean": mc, "mc_mean_stderr": 0.01, "tasks": {},
            "per_item": {"t": {str(i): float(i < 100 * mc) for i in range(100)}}}, "evaluation"),
        "verification": _publish_json(store, tmp_path, f"verify-{tag}.json", {
            "measured": costs, "noise": {}, "predicted": costs, "ok": True,
            "prediction_error": {}, "violations": [], "measurement": {}}, "verification"),
        "limits": {"max_tpot_ms": 3.5},
        **teacher_refs,
    }
    options = {"distill": {"seed": seed}, "search": {"dnas": {"seed": seed}}}
    return SweepPoint(label=tag, overrides={"workload": "interactive-cpu",
                                            "budget_fraction": 0.4, "method": method,
                                            "options": options}, outputs=outputs,
                      steps=[{"name": "arch", "seconds": 1.0}])


def _sweep_report(tmp_path, teacher_tpot: float | None = None):
    """A sweep of two methods x two seeds and a failed greedy seed, as published artifacts;
    the teacher's verify read ``teacher_tpot`` (None: not measured)."""
    from transformers import LlamaConfig

    from flows.sweep import SweepPoint, SweepReport

    store = Store.from_uri(tmp_path / "store")
    teacher_dir = tmp_path / "teacher"
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                vocab_size=128).save_pretrained(teacher_dir)
    measured = {} if teacher_tpot is None else {"tpot_ms": teacher_tpot}
    teacher_refs = {
        "teacher": store.publish(teacher_dir, "teacher"),
        "teacher_eval": _publish_json(store, tmp_path, "teacher-eval.json", {
            "mc_mean": 0.6, "per_item": {"t": {"0": 1.0}}}, "evaluation"),
        "teacher_verification": _publish_json(store, tmp_path, "teacher-verify.json", {
            "measured": measured, "noise": {}, "predicted": {}, "ok": False,
            "prediction_error": {}}, "verification"),
    }
    points = [_point(store, tmp_path, m, s, mc, teacher_refs)
              for m, mc in (("autocompress", 0.5), ("minitron", 0.4)) for s in (0, 1)]
    failed = SweepPoint(label="greedy0", error="no architecture meets the limits",
                        overrides={"workload": "interactive-cpu", "budget_fraction": 0.4,
                                   "method": "greedy",
                                   "options": {"distill": {"seed": 0}}})
    return SweepReport(points=[*points, failed], score_metric="mc_mean",
                       cost_metrics=["tpot_ms"]), failed


def test_results_record_every_method_and_seed_with_per_item_scores(compare, tmp_path):
    sweep_report, failed = _sweep_report(tmp_path)
    args = compare.build_parser().parse_args(["--presets", "interactive-cpu", "--budgets",
                                              "0.4", "--seeds", "0", "1", "--reduced"])
    data = compare.build_results(sweep_report, args, wall_s=1.0)
    json.dumps(data)  # JSON-ready
    run = data["runs"][0]
    assert data["version"] == 3 and data["reduced"] and data["teacher"]["params"] > 0
    assert data["machine"]["cpu"] and data["machine"]["torch_threads"] >= 1  # machines differ
    assert [e["seed"] for e in run["methods"]["autocompress"]["seeds"]] == [0, 1]
    assert run["methods"]["greedy"] == {"seeds": [], "failed": {"0": failed.error}}
    entry = run["methods"]["minitron"]["seeds"][1]
    assert entry["params"] == 1001 and entry["verify_ok"] and entry["measured"]["tpot_ms"] == 3
    assert len(entry["per_item"]["t"]) == 100 and entry["scored_candidates"] == 7
    assert entry["measured_rounds"][0]["measured"]["tpot_ms"] == 3.1  # the search's timings
    ours = run["methods"]["autocompress"]["seeds"][0]["selection"]
    assert ours == [{"origin": "repair", "layers": 3, "blocks": None, "attention_blocks": None,
                     "hidden_size": None, "params": 1000, "estimate": None, "pruned_kl": 0.9,
                     "kl": 0.5, "chosen": True}]
    v = report.verdicts(data)[0]
    assert v["method"] == "autocompress" and v["mc_delta"] == pytest.approx(0.1)
    assert v["paired"]["mc"]["overall"]["low"] > 0  # nested wins: every item diff >= 0


def test_a_carried_limit_records_where_it_was_set_and_a_host_change_is_named(compare,
                                                                          tmp_path):
    """With --limits-from the results say which file set the limits and what the teacher read
    there; this run's teacher reading 9 ms against 6 there is another budget, and the
    table printed at the end says so."""
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [{
        "preset": "interactive-cpu", "budget_fraction": 0.4, "limits": {"max_tpot_ms": 3.5},
        "teacher_verify": {"measured": {"tpot_ms": 6.0}}}]}))
    sweep_report, _ = _sweep_report(tmp_path, teacher_tpot=9.0)
    args = compare.build_parser().parse_args(["--presets", "interactive-cpu", "--budgets",
                                              "0.4", "--seeds", "0", "1",
                                              "--limits-from", str(earlier)])
    data = compare.build_results(sweep_report, args, wall_s=1.0)
    carried = data["runs"][0]["limits_carried"]
    assert carried == {"from": str(earlier),
                       "teacher_verify": {"measured": {"tpot_ms": 6.0}}}
    (note,) = report.host_drift_notes(data)
    assert "carried from earlier.json" in note and "here it read 9" in note
    assert "set as 58% of its 6 in earlier.json" in report.readme_table(data)
    # Without --limits-from nothing is carried and nothing is flagged.
    args.limits_from = None
    data = compare.build_results(sweep_report, args, wall_s=1.0)
    assert "limits_carried" not in data["runs"][0] and report.host_drift_notes(data) == []


def test_the_importance_criterion_is_part_of_the_importance_stage_key():
    from autocompress.artifacts import ArtifactRef
    from autocompress.importance import CalibrationConfig
    from tasks.code_key import OUR_PACKAGES, code_files
    from tasks.prune import score_importance

    ref = ArtifactRef(uri="file:///x", sha256="a" * 64, kind="model")

    def key(options):
        return score_importance.cache_policy.compute_key(
            None, {"teacher": ref, "corpus": ref, "options": options}, {})

    assert key({"criterion": "taylor"}) != key({"criterion": "activation"})
    assert CalibrationConfig.model_validate({"criterion": "taylor"}).criterion == "taylor"
    # The default lives in importance.py, whose source is in the stage's code key.
    assert any(p.name == "importance.py" for p in code_files("tasks.prune", OUR_PACKAGES))
