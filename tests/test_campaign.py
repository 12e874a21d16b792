"""The decisive campaign's runner (issue 62): the plan's units, resume and restart, status.

The unit's commands themselves (bench.compare, autocompress eval) are tested where they
live; here a runner writes the files those commands would, so the orchestration (which step
runs, what is resumed, what is kept) is checked without hours of compute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autocompress.limits import HOST_REFUSAL
from bench import campaign


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def compare_json(out: Path, method: str, *, limit=2.75, teacher=5.4, model="/m") -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": [{
        "limits": {"max_tpot_ms": limit}, "teacher_verify": {"measured": {"tpot_ms": teacher}},
        "methods": {method: {"seeds": [{"files": {"model": f"file://{model}/{method}"},
                                         "arch": {"layers": method}}], "failed": {}}}}]}))


class FakeEngine:
    """Writes what each command of a unit writes, and records the commands."""

    def __init__(self, fail_on: str | None = None, refuse_carried: bool = False):
        self.calls: list[list[str]] = []
        self.fail_on, self.refuse_carried = fail_on, refuse_carried

    def __call__(self, argv: list[str], log: Path) -> int:
        self.calls.append(argv)
        out = Path(argv[argv.index("--json") + 1]) if "--json" in argv else None
        if self.fail_on and self.fail_on in " ".join(argv):
            return 1
        if "bench.compare" in argv:
            if self.refuse_carried and "--limits-from" in argv and "50-s0-a" in " ".join(argv):
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(f"error: {HOST_REFUSAL} by 14%\n")
                out.parent.mkdir(parents=True, exist_ok=True)  # compare writes its JSON still
                out.write_text(json.dumps({"runs": [{"methods": {"x": {"seeds": [],
                                                                      "failed": {"0": "..."}}}}]}))
                return 2
            compare_json(out, argv[argv.index("--methods") + 1])
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"model": argv[argv.index("--model") + 1]}))
        return 0


def test_the_committed_plan_has_the_units_issue_62_asks_for():
    units = campaign.plan_units()
    ids = [u.id for u in units]
    assert ids[:6] == ["50-s0-a", "50-s0-b", "50-s1-a", "50-s1-b", "50-s2-a", "50-s2-b"]
    by_id = {u.id: u for u in units}
    for seed in (0, 1, 2):
        a, b = by_id[f"50-s{seed}-a"], by_id[f"50-s{seed}-b"]
        assert (a.seed, b.seed, a.budget, b.budget) == (seed, seed, 0.5, 0.5)
        assert set(a.methods) == {"greedy", "minitron-scored"}
        assert set(b.methods) == {"autocompress", "greedy"} and b.limits_from == a.id
    assert by_id["recovery-s0"].tokens == 1_000_000
    # the 70% replication comes only after the six 50% units and the recovery check
    assert all(u.budget == 0.7 for u in units[7:])


def test_a_plan_whose_unit_refers_to_a_later_one_is_refused(tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text('```json campaign-units\n[{"id": "b", "seed": 0, "methods": ["greedy"], '
                    '"limits_from": "a"}, {"id": "a", "seed": 0, "methods": ["greedy"]}]\n```\n')
    with pytest.raises(SystemExit, match="not an earlier unit"):
        campaign.plan_units(plan)


def test_a_unit_runs_the_plans_commands_and_carries_its_first_limits(tmp_path, home):
    units = campaign.plan_units()
    engine = FakeEngine()
    record = campaign.run_unit(units[0], units, results=tmp_path, runner=engine)
    assert record["finished"] and record["host"]["hostname"]
    teacher_eval, greedy, greedy_eval, scored, scored_eval = engine.calls
    assert teacher_eval[-4:] == ["-c", "seed=0", "--json", str(tmp_path / "50-s0-a" /
                                                                "eval_teacher.json")]
    assert "num_items=300" in teacher_eval and "local,humaneval_bpb" in teacher_eval
    assert "--limits-from" not in greedy and greedy[greedy.index("--budgets") + 1] == "0.5"
    assert greedy[greedy.index("--distill-tokens") + 1] == "200000"
    # the unit's second method runs under the limits its first one set
    assert scored[scored.index("--limits-from") + 1].endswith("50-s0-a/compare_greedy.json")
    assert greedy_eval[greedy_eval.index("--model") + 1] == "/m/greedy"
    assert scored_eval[scored_eval.index("--model") + 1] == "/m/minitron-scored"
    # unit b carries unit a's limits into its first method
    engine_b = FakeEngine()
    campaign.run_unit(units[1], units, results=tmp_path, runner=engine_b)
    first_b = engine_b.calls[1]
    assert first_b[first_b.index("--limits-from") + 1].endswith("50-s0-a/compare_greedy.json")


def test_an_interrupted_unit_resumes_where_it_stopped_while_its_work_directory_lives(
        tmp_path, home):
    units = campaign.plan_units()
    with pytest.raises(SystemExit, match="minitron-scored compare failed"):
        campaign.run_unit(units[0], units, results=tmp_path,
                          runner=FakeEngine(fail_on="minitron-scored"))
    again = FakeEngine()
    record = campaign.run_unit(units[0], units, results=tmp_path, runner=again)
    assert [c[c.index("--methods") + 1] if "bench.compare" in c else "eval"
            for c in again.calls] == ["minitron-scored", "eval"]
    assert record["resumed"] and "greedy compare" in record["steps"]


def test_a_unit_whose_work_directory_is_gone_starts_again_and_keeps_what_it_had(
        tmp_path, home):
    units = campaign.plan_units()
    with pytest.raises(SystemExit):
        campaign.run_unit(units[0], units, results=tmp_path,
                          runner=FakeEngine(fail_on="minitron-scored"), restarted=tmp_path / "kept")
    campaign.workdir_token(units[0]).unlink()  # a new session: the stage cache is gone
    again = FakeEngine()
    campaign.run_unit(units[0], units, results=tmp_path, runner=again,
                      restarted=tmp_path / "kept")
    assert len(again.calls) == 5  # every step again, on this host
    [kept] = (tmp_path / "kept").iterdir()
    assert (kept / "compare_greedy.json").exists() and (kept / "unit.json").exists()


def test_a_unit_that_would_not_finish_in_the_session_stops_before_its_next_step(
        tmp_path, home):
    """The finished unit took 4470 s; a host that ran the teacher's eval 3x slower would
    need 3 x 4070 s for the rest, so with 2 h left the unit stops there, not hours later."""
    units = campaign.plan_units()
    campaign.run_unit(units[0], units, results=tmp_path, runner=FakeEngine())
    record = campaign.read_record(tmp_path / "50-s0-a")
    took = {"teacher eval": 400, "greedy compare": 1800, "greedy eval": 300,
            "minitron-scored compare": 1700, "minitron-scored eval": 270}
    for name, seconds in took.items():
        record["steps"][name]["seconds"] = seconds
    campaign.write_record(tmp_path / "50-s0-a", record)
    past = campaign.past_seconds(units, tmp_path)
    assert past == took
    slow = {"steps": {"teacher eval": {"seconds": 1200}}}
    pace, need = campaign.time_left_estimate(slow, list(took)[1:], past)
    assert pace == 3.0 and need == 3.0 * 4070
    # autocompress never ran in a finished unit: it counts as the slowest compare
    assert campaign.time_left_estimate({"steps": {}}, ["autocompress compare"], past)[1] == 1800

    now = [0.0]
    engine = FakeEngine()
    with pytest.raises(SystemExit, match=r"stopped before teacher eval.*about 1\.2 h"):
        campaign.run_unit(units[2], units, results=tmp_path, runner=engine,
                          deadline=1000.0, clock=lambda: now[0])
    assert engine.calls == []  # nothing started that could not finish
    stopped = campaign.read_record(tmp_path / "50-s1-a")["stopped"]
    assert stopped["before"] == "teacher eval" and stopped["estimate_s"] == 4470
    record = campaign.run_unit(units[2], units, results=tmp_path, runner=engine,
                               deadline=5000.0, clock=lambda: now[0])
    assert record["finished"] and len(engine.calls) == 5
    for bad in ("0", "-1", "abc"):  # a usage error (exit 2), before anything runs
        with pytest.raises(SystemExit) as exited:
            campaign.main(["run", "--hours", bad])
        assert exited.value.code == 2


def test_a_b_unit_refused_for_host_drift_sets_its_own_limits(tmp_path, home):
    units = campaign.plan_units()
    campaign.run_unit(units[0], units, results=tmp_path, runner=FakeEngine())
    engine = FakeEngine(refuse_carried=True)
    record = campaign.run_unit(units[1], units, results=tmp_path, runner=engine)
    assert "10%" in record["own_limits_because"]
    # the refused run's JSON is kept aside, not taken for a finished step
    assert list((tmp_path / "50-s0-b").glob("compare_autocompress.failed-*.json"))
    compares = [c for c in engine.calls if "bench.compare" in c]
    assert "50-s0-a" in " ".join(compares[0])  # tried the carried limits first
    assert "--limits-from" not in compares[1]  # then set its own
    assert compares[2][compares[2].index("--limits-from") + 1].endswith(
        "50-s0-b/compare_autocompress.json")


def test_status_shows_each_units_methods_hours_host_and_teacher_reading(tmp_path, home):
    units = campaign.plan_units()
    campaign.run_unit(units[0], units, results=tmp_path, runner=FakeEngine())
    rows = campaign.status_rows(units, tmp_path)
    assert rows[0]["state"] == "done" and rows[0]["done"] == ["greedy", "minitron-scored"]
    assert rows[0]["limit_share_of_timed"] == pytest.approx(2.75 / 5.4)
    assert rows[1]["state"] == "not started"
    table = campaign.status_table(rows)
    assert "| 50-s0-a | 2/2 (greedy, minitron-scored) | done |" in table
    assert "2.750 (51%)" in table
    assert campaign.main(["status"]) == 0


def test_results_are_committed_and_models_under_work_are_not():
    here = campaign.RESULTS / "50-s0-a"
    assert campaign._published(here / "compare_greedy.json")
    assert not campaign._published(here / "work" / "distilled_greedy" / "config.json")


def test_a_units_commands_import_the_frozen_commits_code(tmp_path, home):
    import subprocess
    import sys

    commit = campaign.frozen_commit()
    tree = campaign.frozen_tree(commit)
    try:
        assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True,
                              text=True).stdout.strip() == commit
        log = tmp_path / "unit.log"
        code = campaign.run_logged([sys.executable, "-c", "import autocompress, bench; "
                                    "print(autocompress.__file__, bench.__file__)"], log, tree)
        assert code == 0
        assert log.read_text().count(str(tree)) >= 3  # the header and both packages
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)],
                       cwd=campaign.ROOT, capture_output=True)
