"""Report, plots and README table from a compare.json.

The compare.json here is a SYNTHETIC FIXTURE built by ``_synthetic()`` below to
exercise the report code; its numbers are made up and claim nothing.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from autocompress.errors import AutoCompressError
from bench import report


def _arch(hidden: int, heads: list[int], kv: list[int], ffn: list[int]) -> dict:
    layers = []
    for h, k, f in zip(heads, kv, ffn, strict=True):
        layers.append({"attention": {"num_heads": h, "num_kv_heads": k} if h else None,
                       "ffn": {"intermediate_size": f} if f else None})
    return {"hidden_size": hidden, "layers": layers}


def _per_item(mc: float, n: int = 100) -> dict:
    """Two tasks of ``n`` items; the first ``mc · n`` items right (so wins are nested)."""
    right = round(mc * n)
    return {task: {f"{task}-{i}": float(i < right) for i in range(n)} for task in ("t1", "t2")}


def _method(arch: dict, params: int, mc: float, loss_pruned: float, loss_kd: float,
            tpot: float, ok: bool, seed: int = 0) -> dict:
    measured = {"ttft_ms": 20.0, "tpot_ms": tpot, "e2e_ms": 20 + 31 * tpot,
                "throughput_tok_s": 1000 / tpot, "memory_gb": 0.03}
    predicted = {k: v * 1.1 for k, v in measured.items()}
    return {"seed": seed, "arch": arch, "params": params, "predicted": predicted,
            "measured": measured, "noise": {k: 0.1 for k in measured}, "verify_ok": ok,
            "violations": [] if ok else ["tpot_ms"],
            "scores": {"mc_mean": mc, "mc_mean_stderr": 0.01, "heldout_loss_pruned": loss_pruned,
                       "heldout_loss_distilled": loss_kd},
            "per_item": _per_item(mc)}


def _synthetic(minitron_wins: bool, seeds: int = 2) -> dict:
    """A made-up two-run comparison over ``seeds`` seeds (fixture, not a result)."""
    teacher = _arch(64, [4, 4, 4], [2, 2, 2], [128, 128, 128])
    runs = []
    for preset, frac in (("interactive-cpu", 0.6), ("interactive-cpu", 0.4)):
        a_mc, m_mc = (0.30, 0.40) if minitron_wins else (0.45, 0.40)
        runs.append({
            "preset": preset, "budget_fraction": frac, "main_metric": "tpot_ms",
            "limits": {"max_tpot_ms": 10 * frac},
            "teacher_verify": {"measured": {"ttft_ms": 30.0, "tpot_ms": 9.0, "memory_gb": 0.05,
                                            "throughput_tok_s": 111.0},
                               "predicted": {"ttft_ms": 28.0, "tpot_ms": 10.0,
                                             "memory_gb": 0.05, "throughput_tok_s": 100.0},
                               "noise": {"tpot_ms": 0.2}, "ok": False},
            "methods": {
                "autocompress": {"seeds": [
                    _method(_arch(48, [4, 0, 2], [2, 0, 1], [96, 64, 0]), 1000, a_mc, 5.0,
                            4.5, 3.5, True, seed) for seed in range(seeds)], "failed": {}},
                "minitron": {"seeds": [
                    _method(_arch(48, [2, 2, 2], [1, 1, 1], [64, 64, 64]), 1100, m_mc, 5.2,
                            4.6, 3.9, False, seed) for seed in range(seeds)], "failed": {}},
            }})
    return {"version": 3, "synthetic": True, "created": "fixture", "target": "cpu-local/x",
            "baseline": "minitron",
            "settings": {"distill_tokens": 1000, "eval_limit": 10, "seeds": list(range(seeds))},
            "teacher": {"dir": "t", "params": 5000, "arch": teacher,
                        "scores": {"mc_mean": 0.5, "mc_mean_stderr": 0.01,
                                   "heldout_loss_fixed": 4.0}},
            "runs": runs, "not_run": [{"preset": "datacenter-cpu", "budget_fraction": 0.4,
                                       "reason": "no time"}], "wall_s": 1.0}


def test_table_has_teacher_and_every_method_row():
    data = _synthetic(minitron_wins=False)
    table = report.readme_table(data)
    body = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(body) == 1 + 2 * len(data["runs"])
    assert body[0].split("|")[4].strip() == "teacher"
    assert "0/2 pass (FAIL tpot_ms)" in table and "2/2 pass" in table
    assert "5.000 → 4.500" in table  # loss before → after distillation, from the JSON
    assert "SYNTHETIC" in table and "(baseline)" in table
    # +5 points on nested items: every paired difference is >= 0, so is the interval.
    delta = [r for r in report.table_rows(data) if r["method"] == "AutoCompress"][0]["delta"]
    mean, low, high = (float(x) for x in delta.replace("[", "").replace("]", "")
                       .replace(",", "").split())
    assert mean == pytest.approx(5.0) and 0 <= low < mean < high


@pytest.mark.parametrize("minitron_wins", [True, False])
def test_verdict_follows_the_numbers(minitron_wins):
    verdicts = report.verdicts(_synthetic(minitron_wins))
    assert len(verdicts) == 2
    for v in verdicts:
        assert v["meets_bar"] is (not minitron_wins)
        assert (v["mc_delta"] < 0) is minitron_wins
        assert v["both_verified"] is False  # the fixture's Minitron fails verification
        overall = v["paired"]["mc"]["overall"]
        assert overall["n_items"] == 200 and overall["seeds_a"] == 2
        assert (overall["high"] < 0) is minitron_wins and (overall["low"] > 0) is not minitron_wins
    text = "\n".join(report.analysis_text(_synthetic(minitron_wins)))
    assert ("AutoCompress behind" in text) is minitron_wins
    assert ("does NOT meet" in text) is minitron_wins
    assert ("does **not** in" in text) is minitron_wins


def test_methods_are_compared_on_the_seeds_both_ran_in_pairs():
    """AutoCompress ran seeds 0 and 1, Minitron 0, 1 and 2, where seed 2 lifted it (a faster
    session): the difference is taken over seeds 0 and 1 only, seed for seed, and says so."""
    data = _synthetic(minitron_wins=False, seeds=3)
    run = data["runs"][0]
    run["methods"]["autocompress"]["seeds"].pop()
    run["methods"]["minitron"]["seeds"][2]["per_item"] = _per_item(0.60)
    v = next(v for v in report.verdicts(data) if v["budget_fraction"] == 0.6)
    assert v["paired"]["seeds"] == [0, 1] and not v["paired"]["all_seeds"]
    assert v["paired"]["mc"]["overall"]["mean"] == pytest.approx(0.05)
    assert v["meets_bar"]  # +5 points on the seeds both ran, not 0.45 - 0.467
    assert v["mc_delta"] == pytest.approx(0.05) and v["baseline_seeds"] == 2
    assert "(seeds 0, 1)" in report.readme_table(data)
    assert "seed pairs 0, 1" in "\n".join(report.analysis_text(data))


def test_the_verdict_says_how_much_of_the_teachers_lead_the_bar_asks_for():
    """Teacher 0.50, Minitron 0.40, AutoCompress 0.45 (held-out 4.0 / 4.6 / 4.5 nats)."""
    v = report.verdicts(_synthetic(minitron_wins=False))[0]
    assert v["teacher_headroom"] == pytest.approx(0.10)
    assert v["bar_share"] == pytest.approx(0.2) and v["gap_closed"] == pytest.approx(0.5)
    assert v["loss_headroom"] == pytest.approx(0.6) and v["loss_gap_closed"] == pytest.approx(1 / 6)
    text = "\n".join(report.analysis_text(_synthetic(minitron_wins=False)))
    assert "bar asks for 20% of that gap; AutoCompress closes 50%" in text
    data = _synthetic(minitron_wins=False)
    data["teacher"]["scores"]["mc_mean"] = 0.41  # the teacher barely ahead of the baseline
    assert "the bar asks for more than the teacher's own lead" in "\n".join(
        report.analysis_text(data))


def test_write_report_makes_markdown_and_plots(tmp_path):
    path = report.write_report(_synthetic(minitron_wins=True), tmp_path)
    text = path.read_text()
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["accuracy_vs_cost.png", "arch_interactive-cpu_40.png",
                    "arch_interactive-cpu_60.png", "predicted_vs_measured.png"]
    for name in pngs:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
        assert f"({name})" in text
    assert "SYNTHETIC" in text and "datacenter-cpu" in text  # not-run entries are listed
    # predicted vs measured: one row per model and metric (teacher + 2 methods x 2 seeds) x 2 runs
    assert text.count("| tpot_ms |") == 10


def _round(params: int, tpot: float, stage: str = "pick") -> dict:
    return {"params": params, "stage": stage, "predicted": {"tpot_ms": 3.0},
            "measured": {"tpot_ms": tpot}}


def test_each_pick_is_set_beside_its_last_timing_in_the_search(tmp_path):
    data = _synthetic(minitron_wins=False, seeds=1)
    pick = data["runs"][0]["methods"]["autocompress"]["seeds"][0]  # verify read 3.5 ms
    # an aim timing of another architecture, then two timings of the pick: the last stands
    pick["measured_rounds"] = [_round(999, 9.9, "aim"), _round(1000, 3.2), _round(1000, 3.85)]
    rows = report.pick_timing_rows(data)
    assert len(rows) == 3  # header, rule and the one seed that has rounds
    assert rows[2] == ("| interactive-cpu | 60% | AutoCompress s0 | tpot_ms | 3 | 3.85 | 3.5 "
                       "| +10.0% |")
    assert "as the search timed it" in report.write_report(data, tmp_path).read_text()
    del pick["measured_rounds"]
    assert report.pick_timing_rows(data) == []
    assert "as the search timed it" not in report.write_report(data, tmp_path).read_text()


def test_arch_matrix_marks_removed_blocks_as_zero():
    m = report.arch_matrix(_arch(48, [4, 0, 2], [2, 0, 1], [96, 64, 0]))
    assert m == {"query heads": [4, 0, 2], "KV groups": [2, 0, 1], "FFN width": [96, 64, 0]}


README = "# Project\n\nintro\n\n<!-- results:start -->\nold table\n<!-- results:end -->\n\nrest\n"


def test_replace_between_markers_keeps_the_rest():
    new = report.replace_between_markers(README, "| new |\n")
    assert new.startswith("# Project\n\nintro\n\n<!-- results:start -->\n| new |\n")
    assert new.endswith("<!-- results:end -->\n\nrest\n")
    assert "old table" not in new
    # idempotent: replacing again gives the same text
    assert report.replace_between_markers(new, "| new |\n") == new
    assert report.replace_between_markers("no markers here", "x") is None
    assert report.replace_between_markers(
        "<!-- results:end --> then <!-- results:start -->", "x") is None


def test_a_named_block_leaves_the_other_tables_alone():
    text = README + "<!-- results-smollm2:start -->\nsmol table\n<!-- results-smollm2:end -->\n"
    new = report.replace_between_markers(text, "| smol |\n", block="results-smollm2")
    assert "old table" in new and "smol table" not in new
    assert new.endswith("<!-- results-smollm2:start -->\n| smol |\n<!-- results-smollm2:end -->\n")
    assert report.replace_between_markers(README, "x", block="results-smollm2") is None
    assert report.between_markers(new, "results-smollm2") == "| smol |\n"
    assert report.between_markers(new) == "old table\n"
    assert report.between_markers(README, "results-smollm2") is None


def _cli_app() -> typer.Typer:
    from autocompress.commands import bench

    app = typer.Typer()
    bench.register(app)
    return app


def test_readme_table_command_updates_between_markers(tmp_path):
    data_path = tmp_path / "compare.json"
    data_path.write_text(json.dumps(_synthetic(minitron_wins=False)))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    result = CliRunner().invoke(_cli_app(), ["bench", "readme-table", "--json", str(data_path),
                                             "--readme", str(readme)])
    assert result.exit_code == 0, result.output
    text = readme.read_text()
    assert "old table" not in text and "| teacher |" in text
    assert "tpot_ms ≤ 4" in text  # the 40% run's limit, from the JSON
    assert "AutoCompress" in text and text.endswith("<!-- results:end -->\n\nrest\n")
    assert not list(tmp_path.glob(".README.md.*"))  # no temp file left behind
    # A second teacher's or target's table lives in its own block, untouched by the first.
    readme.write_text(README + "<!-- results-smollm2:start -->\nx\n<!-- results-smollm2:end -->\n")
    result = CliRunner().invoke(_cli_app(), ["bench", "readme-table", "--json", str(data_path),
                                             "--readme", str(readme), "--block", "results-smollm2"])
    assert result.exit_code == 0, result.output
    text = readme.read_text()
    assert "old table" in text and text.count("| teacher |") == 1
    assert text.index("| teacher |") > text.index("<!-- results-smollm2:start -->")


def test_readme_table_command_prints_without_markers(tmp_path):
    data_path = tmp_path / "compare.json"
    data_path.write_text(json.dumps(_synthetic(minitron_wins=False)))
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    result = CliRunner().invoke(_cli_app(), ["bench", "readme-table", "--json", str(data_path),
                                             "--readme", str(readme)])
    assert result.exit_code == 0, result.output
    assert "Minitron" in result.output
    assert readme.read_text() == "# no markers\n"


def test_partial_run_renders_without_scores_or_measurements(tmp_path):
    """A run stopped after pruning: the table and report say what is missing."""
    data = _synthetic(minitron_wins=False, seeds=1)
    for method in data["runs"][1]["methods"].values():
        m = method["seeds"][0]
        for key in ("measured", "noise", "verify_ok", "violations", "per_item"):
            m.pop(key)
        m["scores"] = {"heldout_loss_pruned": m["scores"]["heldout_loss_pruned"]}
    assert report.readme_table(data).count("not run") == 2
    v = report.verdicts(data)[1]
    assert v["mc_delta"] is None and v["loss_delta_pruned"] == pytest.approx(5.0 - 5.2)
    text = report.write_report(data, tmp_path).read_text()
    assert "benchmark scores missing" in text


def test_a_method_without_an_architecture_is_reported_not_dropped(tmp_path):
    data = _synthetic(minitron_wins=False)
    run = data["runs"][0]
    run["methods"]["greedy"] = {"seeds": [], "failed": {
        "0": "no architecture meets the limits as measured: x"}}
    table = report.readme_table(data)
    assert "| greedy (no DNAS) | 0/1 | — |" in table and "no architecture" in table
    assert "greedy (no DNAS) (seed 0) found no architecture" in "\n".join(
        report.analysis_text(data))
    assert report.write_report(data, tmp_path).exists()  # plots skip the missing method


def test_a_version_2_file_reads_as_one_seed_without_intervals(tmp_path):
    data = _synthetic(minitron_wins=False, seeds=1)
    for run in data["runs"]:
        run["methods"] = {k: m["seeds"][0] for k, m in run["methods"].items()}
        for m in run["methods"].values():
            del m["per_item"]
    del data["runs"][1]["methods"]["minitron"]
    data["runs"][1]["failed_methods"] = {"minitron": "no architecture: x"}
    rows = report.table_rows(data)
    assert [r["seeds"] for r in rows[1:]] == ["1/1", "1/1", "1/1", "0/1"]
    assert rows[1]["delta"] == "—"
    v = report.verdicts(data)
    assert len(v) == 1 and v[0]["paired"] is None and v[0]["mc_delta"] == pytest.approx(0.05)
    assert "as independent means" in "\n".join(report.analysis_text(data))


def test_a_reduced_comparison_is_labelled():
    reduced = _synthetic(minitron_wins=True, seeds=3)
    reduced["reduced"] = True
    text = "\n".join(report.comparison_section("Reduced run", reduced))
    assert "## Reduced run" in text and "REDUCED comparison" in text
    assert text.count("| AutoCompress |") == 2 and "seeds 0, 1, 2" in text


def test_files_that_together_hold_the_whole_grid_are_not_labelled_reduced():
    """Each file ran part of the grid (reduced); merged, the label goes only when every cell
    has all four methods at three seeds and every preset two budgets; the table then says
    what the grid cost."""
    def part(methods: tuple[str, ...]) -> dict:
        data = _synthetic(minitron_wins=False, seeds=3)
        for run in data["runs"]:
            entry = run["methods"]["autocompress"]
            run["methods"] = {m: json.loads(json.dumps(entry)) for m in methods}
        return {**data, "reduced": True, "wall_s": 1800.0, "machine": {"cores": 2}}

    halves = [part(("autocompress", "minitron")), part(("greedy", "random"))]
    merged = report.merge_compares(halves)
    assert not merged["reduced"] and report.covers_full_grid(merged["runs"])
    table = report.readme_table(merged)
    assert "REDUCED" not in table and "Wall time: 2 runs, 1.0 h summed on 2 cores" in table
    assert report.merge_compares([halves[0], part(("greedy",))])["reduced"]  # no random
    one_seed_short = part(("greedy", "random"))
    one_seed_short["runs"][0]["methods"]["random"]["seeds"].pop()
    assert report.merge_compares([halves[0], one_seed_short])["reduced"]
    one_budget = [{**d, "runs": d["runs"][:1]} for d in halves]
    assert report.merge_compares(one_budget)["reduced"]


def test_the_grid_cost_is_split_into_search_distillation_and_evaluation():
    """The parts add up to the compute the report states; the baseline's search records one
    total, the others' split out their short list's distillation and timing."""
    data = _synthetic(minitron_wins=False, seeds=1)
    data["teacher"]["scores"]["seconds"] = 360.0
    for run in data["runs"]:
        for name, m in run["methods"].items():
            e = m["seeds"][0]
            e["distill"], e["scores"]["seconds"] = {"seconds": 900.0}, 180.0
            e["search_seconds"] = (1800.0 if name == "minitron" else
                                   {"total": 1440.0, "final_pick": {"short_distill": 720.0,
                                                                    "timing_on_target": 360.0}})
    parts = report.compute_parts(data)
    assert parts == {"search": 6480.0, "short_distill": 1440.0, "timing": 720.0,
                     "baseline_search": 3600.0, "distill": 3600.0, "evaluation": 1080.0}
    assert report.compute_seconds(data) == 6480.0 + 3600.0 + 1080.0
    text = report._grid_wall_text({**data, "invocations": 2, "wall_s": 7200.0})
    assert text.endswith("3.1 h: search 1.8 h (Minitron's 1.0 h; short distillations 0.4 h "
                         "and timing on the target 0.2 h, where the other searches record "
                         "them), distillation 1.0 h, evaluation 0.3 h")
    for run in data["runs"]:  # an older file: one total per search, nothing split out
        run["methods"]["autocompress"]["seeds"][0]["search_seconds"] = 1440.0
    assert "search 1.8 h (Minitron's 1.0 h), distillation" in report._grid_wall_text(
        {**data, "invocations": 2})


def test_final_picks_say_whether_the_ranking_after_pruning_agreed():
    data = _synthetic(minitron_wins=True, seeds=1)
    entry = data["runs"][1]["methods"]["autocompress"]["seeds"][0]
    # Made up: the deeper the candidate, the better right after pruning and the worse after.
    entry["selection"] = [{"layers": n, "params": 1000 * n, "pruned_kl": 1.0 / n,
                           "kl": 0.1 * n, "chosen": n == 2} for n in (2, 3, 4, 5)]
    lines = report.selection_lines(data)
    assert len(lines) == 1 and "interactive-cpu @ 40%, AutoCompress s0" in lines[0]
    assert "4 candidates short-distilled" in lines[0] and "chosen 2 layers" in lines[0]
    assert "the best right after pruning, 5 layers, had 0.500" in lines[0]
    assert "Spearman ρ -1.00" in lines[0]
    assert report._rank_correlation([1, 2, 3], [3, 4, 5]) == 1.0


def test_final_picks_say_which_side_of_the_short_list_won():
    data = _synthetic(minitron_wins=True, seeds=3)
    entries = data["runs"][1]["methods"]["autocompress"]["seeds"]
    for seed, entry in enumerate(entries):  # seed 1's winner is repaired from the teacher
        entry["selection"] = [
            {"layers": 2, "params": 2000, "kl": 0.2, "origin": "repair", "chosen": seed != 1},
            {"layers": 3, "params": 3000, "kl": 0.3, "origin": "teacher: repair",
             "chosen": seed == 1}]
    entries[2]["selection"][1]["origin"] = "1 layers emptied"  # one side only: no claim
    lines = report.selection_lines(data)
    assert "from the search's side" in lines[0] and "from the teacher's side" in lines[1]
    assert "side" not in lines[2]
    assert lines[3] == ("- interactive-cpu @ 40%, AutoCompress: the search's side won 1 of 2 "
                        "seeds.")


def test_a_limit_says_its_share_of_the_teacher_as_this_run_measured_it():
    run = _synthetic(minitron_wins=False)["runs"][1]  # 4 ms; the teacher read 9 ms here
    assert report._limit_text(run) == "tpot_ms ≤ 4 (44% of the teacher's 9)"
    del run["teacher_verify"]
    assert report._limit_text(run) == "tpot_ms ≤ 4"


def test_cells_of_several_files_share_one_table_and_a_clash_is_refused(tmp_path):
    """One file per preset (each from its own `bench compare`): `--json` repeated puts their
    cells in one table; the same cell twice, or another target, is a one-line error."""
    first = _synthetic(minitron_wins=False)
    second = _synthetic(minitron_wins=True)
    for run in second["runs"]:
        run["preset"] = "local-coding-cpu"
    first["settings"]["presets"] = ["interactive-cpu"]
    second["settings"].update(seeds=[0], presets=["local-coding-cpu"])
    for data, tokens in ((first, 1_000_000), (second, 200_000)):
        for run in data["runs"]:
            run["distill_tokens"] = tokens
    paths = []
    for name, data in (("a.json", first), ("b.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(data))
    args = ["bench", "readme-table", "--json", str(paths[0]), "--json", str(paths[1]),
            "--readme", str(tmp_path / "none.md")]
    result = CliRunner().invoke(_cli_app(), args)
    assert result.exit_code == 0, result.output
    assert "interactive-cpu" in result.output and "local-coding-cpu" in result.output
    # each cell's own distillation budget, not the first file's settings
    assert ("distillation 1,000,000 tokens per model in interactive-cpu @ 60%, "
            "interactive-cpu @ 40%; 200,000 tokens per model in local-coding-cpu @ 60%, "
            "local-coding-cpu @ 40%") in result.output
    merged = report.merge_compares([first, second])
    assert [r["settings"]["seeds"] for r in merged["runs"]] == [[0, 1]] * 2 + [[0]] * 2
    assert merged["settings"]["presets"] == ["interactive-cpu", "local-coding-cpu"]
    with pytest.raises(AutoCompressError, match="more than one file"):
        report.merge_compares([first, first])
    with pytest.raises(AutoCompressError, match="differ in target"):
        report.merge_compares([first, {**second, "target": "cpu-local/y"}])
    # One teacher (its content hash) in two artifact stores is one teacher; two are not.
    def stored(data, where, sha):
        return {**data, "teacher": {**data["teacher"], "dir": where, "sha": sha}}

    report.merge_compares([stored(first, "file:///a/t", "s1"), stored(second, "file:///b/t", "s1")])
    with pytest.raises(AutoCompressError, match="differ in teacher"):
        report.merge_compares([stored(first, "file:///a/t", "s1"),
                               stored(second, "file:///a/t", "s2")])


def test_a_later_seed_from_another_file_joins_its_method(tmp_path):
    """Seed 1 run later (its own `bench compare --seeds 1`) joins seed 0 of the same method
    and cell: one row over both seeds, each seed naming its file; a seed in both files is
    refused."""
    def one_seed(seed: int, mc_autocompress: float) -> dict:
        data = _synthetic(minitron_wins=False, seeds=1)
        data["settings"]["seeds"] = [seed]
        for run in data["runs"]:
            for m in run["methods"].values():
                m["seeds"][0]["seed"] = seed
            entry = run["methods"]["autocompress"]["seeds"][0]
            entry["scores"]["mc_mean"] = mc_autocompress
            entry["per_item"] = _per_item(mc_autocompress)
        return data

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(one_seed(0, 0.45)))
    b.write_text(json.dumps(one_seed(1, 0.55)))
    merged = report.merge_compares([report.load_compare(a),
                                    report.load_compare(f"{b}:autocompress,minitron")])
    for run in merged["runs"]:
        seeds = run["methods"]["autocompress"]["seeds"]
        assert [e["seed"] for e in seeds] == [0, 1]
        assert seeds[0]["source"] is None and seeds[1]["source"]["file"] == "b.json"
    assert merged["settings"]["seeds"] == [0, 1]
    assert "wall time of its 2 invocations, summed, 2 s" in report._provenance(merged)
    row = [r for r in report.table_rows(merged) if r["method"] == "AutoCompress"][0]
    assert row["seeds"] == "2/2" and row["mc_mean"].startswith("0.500 ± 0.071")
    assert float(row["delta"].split()[0]) == pytest.approx(10.0)  # (0.45 + 0.55) / 2 - 0.40
    with pytest.raises(AutoCompressError, match="autocompress is in more than one file with seed"):
        report.merge_compares([report.load_compare(b), report.load_compare(f"{b}:autocompress")])


def _two_files(tmp_path, first: dict, second: dict, method: str, score: float):
    """a.json and b.json, ``method``'s every item in the second scoring ``score``."""
    for run in second["runs"]:
        for seed in run["methods"][method]["seeds"]:
            seed["per_item"] = _per_item(score)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    return a, b


def test_one_cells_methods_from_two_files_join_under_the_same_limits(tmp_path):
    """`--json a.json:autocompress --json b.json`: AutoCompress of one run against the
    baseline of another (e.g. a re-run baseline), paired per item; a method in both files, or
    the same cell under different limits, is refused with one line."""
    first = _synthetic(minitron_wins=False)
    second = _synthetic(minitron_wins=True)  # its baseline scores 0.40, its search 0.30
    a, b = _two_files(tmp_path, first, second, "minitron", 0.35)
    picked = report.load_compare(f"{a}:autocompress")
    assert all(set(r["methods"]) == {"autocompress"} for r in picked["runs"])
    assert picked["runs"][0]["methods"]["autocompress"]["source"]["file"] == "a.json"
    merged = report.merge_compares([picked, report.load_compare(f"{b}:minitron")])
    assert [set(r["methods"]) for r in merged["runs"]] == [{"autocompress", "minitron"}] * 2
    delta = [r for r in report.table_rows(merged) if r["method"] == "AutoCompress"][0]["delta"]
    assert float(delta.split()[0]) == pytest.approx(10.0)  # 0.45 against the other's 0.35
    with pytest.raises(AutoCompressError, match="minitron is in more than one file"):
        report.merge_compares([first, report.load_compare(f"{b}:minitron")])
    with pytest.raises(AutoCompressError, match="has no method greedy"):
        report.load_compare(f"{a}:greedy")
    for run in second["runs"]:
        run["limits"] = {"max_tpot_ms": 1.0}
    with pytest.raises(AutoCompressError, match="different limits"):
        report.merge_compares([picked, report.only_methods(second, ["minitron"], "b.json")])
    args = ["bench", "readme-table", "--json", f"{a}:autocompress", "--json", f"{b}:minitron",
            "--readme", str(tmp_path / "none.md")]
    b.write_text(json.dumps(_synthetic(minitron_wins=True)))
    result = CliRunner().invoke(_cli_app(), args)
    assert result.exit_code == 0, result.output
    assert "AutoCompress" in result.output and "Minitron" in result.output
    assert "AutoCompress from `a.json` (fixture); Minitron from `b.json`" in result.output


def test_a_variants_run_pairs_with_the_defaults_under_another_name(tmp_path):
    """`--json a.json:autocompress --json b.json:autocompress=variant --baseline autocompress`:
    two runs of one method (an option's variant against the default) in one table, paired
    per item; a NAME taken twice is refused with one line."""
    first, second = _synthetic(minitron_wins=False), _synthetic(minitron_wins=False)
    # the variant scores 0.40, the default 0.45
    a, b = _two_files(tmp_path, first, second, "autocompress", 0.40)
    variant = report.load_compare(f"{b}:autocompress=variant")
    assert all(set(r["methods"]) == {"variant"} for r in variant["runs"])
    assert variant["runs"][0]["methods"]["variant"]["source"]["method"] == "autocompress"
    merged = report.with_baseline(report.merge_compares(
        [report.load_compare(f"{a}:autocompress"), variant]), "autocompress")
    delta = [r for r in report.table_rows(merged) if r["method"] == "variant"][0]["delta"]
    assert float(delta.split()[0]) == pytest.approx(-5.0)
    assert any("variant from `b.json`" in line and "as AutoCompress" in line
               for line in report._method_sources(merged))
    with pytest.raises(AutoCompressError, match="two methods would share the name"):
        report.load_compare(f"{b}:autocompress=x,minitron=x")
    with pytest.raises(AutoCompressError, match="named more than once"):
        report.load_compare(f"{b}:autocompress=x,autocompress=y")


def test_another_method_can_be_the_baseline(tmp_path, capsys, monkeypatch):
    """`bench report --baseline greedy`: every other method, Minitron included, is paired
    with greedy; a method no cell has is refused with one line and exit code 2."""
    data = _synthetic(minitron_wins=False)
    for run in data["runs"]:
        run["methods"]["greedy"] = {"seeds": [
            _method(_arch(48, [4, 2, 2], [2, 1, 1], [96, 64, 32]), 1000, 0.42, 5.1, 4.55, 3.6,
                    True, seed) for seed in range(2)], "failed": {}}
    rebased = report.with_baseline(data, "greedy")
    assert data["baseline"] == "minitron"  # the caller's data is left as it was
    by_method = {v["method"]: v for v in report.verdicts(rebased) if v["budget_fraction"] == 0.6}
    assert set(by_method) == {"autocompress", "minitron"}
    assert by_method["autocompress"]["mc_delta"] == pytest.approx(0.03)
    assert by_method["minitron"]["mc_delta"] == pytest.approx(-0.02)
    with pytest.raises(AutoCompressError, match="no cell has the method 'dnas'"):
        report.with_baseline(data, "dnas")

    data_path = tmp_path / "compare.json"
    data_path.write_text(json.dumps(data))
    result = CliRunner().invoke(_cli_app(), ["bench", "report", "--json", str(data_path),
                                             "--out", str(tmp_path), "--baseline", "greedy"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report.md").read_text()
    assert "AutoCompress vs greedy (no DNAS)" in text and "(baseline)" in text
    from autocompress.cli import main  # the console script: one line, exit code 2

    monkeypatch.setattr("sys.argv", ["autocompress", "bench", "report", "--json",
                                     str(data_path), "--baseline", "dnas"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "no cell has the method 'dnas'" in err
    assert "Traceback" not in err


def _read_teacher_at(data: dict, tpot: float) -> dict:
    """``data`` as if its runs had read the teacher at ``tpot`` (another host)."""
    for run in data["runs"]:
        run["teacher_verify"]["measured"]["tpot_ms"] = tpot
    return data


def test_a_seed_pair_split_across_hosts_is_flagged_and_each_row_says_its_share(tmp_path):
    """A method run later on a host whose teacher reads 12 ms, paired with a baseline whose
    teacher read 9 ms under the same 4 ms limit: its row gives its own share (33%, not 44%)
    and the table and the verdict say those pairs mix two budgets."""
    first = _synthetic(minitron_wins=False)
    a, b = _two_files(tmp_path, first, _read_teacher_at(_synthetic(minitron_wins=False), 12.0),
                      "autocompress", 0.45)
    merged = report.merge_compares([report.load_compare(f"{a}:minitron"),
                                    report.load_compare(f"{b}:autocompress")])
    rows = {r["method"]: r for r in report.table_rows(merged) if r["budget"] == "40%"}
    assert rows["Minitron"]["limit"] == "tpot_ms ≤ 4 (44% of the teacher's 9)"
    assert rows["AutoCompress"]["limit"] == "tpot_ms ≤ 4 (33% of the teacher's 12)"
    (note,) = [n for n in report.host_drift_notes(merged) if n.startswith("interactive-cpu @ 40%")]
    assert "AutoCompress seed 0 12 against 9; AutoCompress seed 1 12 against 9" in note
    assert "mix two budgets" in note
    assert "_Host drift: interactive-cpu @ 40%" in report.readme_table(merged)
    assert any(line.startswith("- **Host drift**") for line in report.analysis_text(merged))
    # Within HOST_DRIFT (9 against 9.5) it is one host's noise: no note, each its own share.
    b.write_text(json.dumps(_read_teacher_at(_synthetic(minitron_wins=False), 9.5)))
    merged = report.merge_compares([report.load_compare(f"{a}:minitron"),
                                    report.load_compare(f"{b}:autocompress")])
    assert report.host_drift_notes(merged) == []
    assert "Host drift" not in report.readme_table(merged)


def test_seeds_on_different_hosts_with_each_pair_on_one_are_told_apart(tmp_path):
    """Seed 0 of both methods on one host (9 ms), seed 1 of both on another (12 ms): every
    pair is fair, but the rows give the range of shares and the note says so."""
    def one_seed(seed: int, tpot: float) -> dict:
        data = _read_teacher_at(_synthetic(minitron_wins=False, seeds=1), tpot)
        data["settings"]["seeds"] = [seed]
        for run in data["runs"]:
            for m in run["methods"].values():
                m["seeds"][0]["seed"] = seed
        return data

    merged = report.merge_compares([one_seed(0, 9.0), one_seed(1, 12.0)])
    row = [r for r in report.table_rows(merged) if r["budget"] == "40%"][0]
    assert row["limit"] == ("tpot_ms ≤ 4 (33%–44% of the teacher's 9–12, as each seed's host "
                            "read it)")
    notes = report.host_drift_notes(merged)
    assert len(notes) == 2 and all("each seed pair shares one host" in n for n in notes)


def test_a_limit_carried_from_another_host_says_where_it_was_set():
    """`bench compare --limits-from` records where the limits were set; a teacher reading
    there more than HOST_DRIFT from this run's is named beside the limit and in a note."""
    data = _synthetic(minitron_wins=False)
    run = data["runs"][1]  # 4 ms; the teacher read 9 ms here
    run["limits_carried"] = {"from": "/x/earlier.json",
                             "teacher_verify": {"measured": {"tpot_ms": 6.0}}}
    assert report._limit_text(run) == ("tpot_ms ≤ 4 (44% of the teacher's 9); set as 67% of "
                                       "its 6 in earlier.json")
    (note,) = report.host_drift_notes(data)
    assert note.startswith("interactive-cpu @ 40%: the limit, carried from earlier.json")
    run["limits_carried"]["teacher_verify"]["measured"]["tpot_ms"] = 8.5  # within 10%
    assert report._limit_text(run) == "tpot_ms ≤ 4 (44% of the teacher's 9)"
    assert report.host_drift_notes(data) == []
