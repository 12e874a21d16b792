"""lab/recovery_predictors.py: what ranks short-listed candidates before training."""

from __future__ import annotations

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def rp():
    from lab import recovery_predictors

    return recovery_predictors


def _comparison(path, searches, teacher_params=7_082_240):
    """A comparison JSON with one seed per short list (``searches``: lists of rows)."""
    seeds = [{"seed": i, "teacher_params": teacher_params, "selection": rows}
             for i, rows in enumerate(searches)]
    path.write_text(json.dumps({"runs": [{"preset": "interactive-cpu", "budget_fraction": 0.5,
                                          "methods": {"autocompress": {"seeds": seeds}}}]}))
    return path


def _rows(rng, a=0.3, b=-0.5, offset=0.0):
    """Candidates whose short-distillation KL is exactly a·pruned_kl + b·log(params) + offset."""
    rows = []
    for _ in range(6):
        pruned, params = float(rng.uniform(2, 6)), int(rng.uniform(4e6, 6e6))
        rows.append({"pruned_kl": pruned, "params": params, "blocks": int(rng.integers(4, 9)),
                     "kl": a * pruned + b * np.log(params) + offset})
    return rows


def test_fit_recovers_the_exchange_rate_and_the_fitted_predictor_ranks_exactly(rp, tmp_path):
    rng = np.random.default_rng(0)
    searches = [_rows(rng, offset=o) for o in (0.0, 1.0, -2.0, 0.5)]
    entries = rp.short_lists([_comparison(tmp_path / "c.json", searches)])
    assert len(entries) == 4
    a, b = rp.fit(entries)
    assert a == pytest.approx(0.3, abs=1e-9) and b == pytest.approx(-0.5, abs=1e-9)
    for search in rp.leave_one_out(entries):
        assert search["fitted_params"]["hit"]
        assert search["fitted_params"]["regret"] == pytest.approx(0.0)
        assert search["fitted_params"]["spearman"] == pytest.approx(1.0)
        assert "fitted_attention" not in search  # these rows do not record attention blocks


def test_a_predictor_that_misranks_shows_regret(rp, tmp_path):
    # KL after training falls with parameters kept and ignores the KL right after pruning.
    rows = [{"pruned_kl": float(i), "params": 1000 * (i + 1), "blocks": 3, "kl": 10.0 - i}
            for i in range(5)]
    entry = rp.short_lists([_comparison(tmp_path / "c.json", [rows])])[0]
    search = rp.per_search(entry, {})
    assert search["pruned_kl"]["spearman"] == pytest.approx(-1.0)
    assert not search["pruned_kl"]["hit"] and search["pruned_kl"]["regret"] == pytest.approx(4.0)
    assert search["params"]["hit"] and search["params"]["spearman"] == pytest.approx(1.0)
    assert np.isnan(search["blocks"]["spearman"])  # all tied: no ranking
    assert "fitted_params" not in search and "attention_blocks" not in search


def test_short_lists_skip_undistilled_rows_and_count_a_copied_list_once(rp, tmp_path):
    rng = np.random.default_rng(1)
    rows = _rows(rng)
    undistilled = [dict(r, kl=None) for r in _rows(rng)]
    first = _comparison(tmp_path / "a.json", [rows, undistilled])
    copy = _comparison(tmp_path / "b.json", [rows], teacher_params=134_515_008)
    (tmp_path / "broken.json").write_text("{")
    entries = rp.short_lists([first, copy, tmp_path / "broken.json"])
    assert len(entries) == 1 and entries[0]["teacher"] == "bundled 7M"


def test_spearman_averages_ties():
    from bench.stats import average_ranks, spearman

    x, y = np.array([1.0, 2.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0])
    ranks = average_ranks(x)
    assert list(ranks) == [0.0, 1.5, 1.5, 3.0]
    assert spearman(x, y) == pytest.approx(np.corrcoef(ranks, [0, 1, 2, 3])[0, 1])


def test_main_writes_the_json_and_refuses_files_without_short_lists(rp, tmp_path, capsys):
    rng = np.random.default_rng(2)
    path = _comparison(tmp_path / "c.json", [_rows(rng, offset=o) for o in (0.0, 1.0, 2.0)])
    out = tmp_path / "out.json"
    assert rp.main(["--json", str(path), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    group = written["groups"]["bundled 7M"]
    assert group["searches"] == 3 and group["predictors"]["fitted_params"]["hits"] == 3
    assert group["fits"]["fitted_params"]["coefficients"]["pruned_kl"] == pytest.approx(0.3)
    assert group["fits"]["fitted_attention"] is None
    empty = _comparison(tmp_path / "empty.json", [])
    with pytest.raises(SystemExit) as exit_info:
        rp.main(["--json", str(empty), "--out", str(tmp_path / "no.json")])
    assert exit_info.value.code == 2 and not (tmp_path / "no.json").exists()
    assert "no short list" in capsys.readouterr().err


def test_side_gap_measures_how_much_worse_the_search_side_ends(rp, tmp_path):
    rng = np.random.default_rng(3)
    searches = []
    for offset in (0.0, 1.0, 3.0):
        rows = _rows(rng, b=0.0, offset=offset)
        for i, row in enumerate(rows):  # the first two from DNAS's answer, 0.4 nats worse
            row["origin"] = "repair" if i < 2 else "teacher: repair"
            row["kl"] += 0.4 if i < 2 else 0.0
        searches.append(rows)
    one_sided = [dict(r, origin="teacher: repair") for r in _rows(rng)]
    entries = rp.short_lists([_comparison(tmp_path / "c.json", searches + [one_sided])])
    gap = rp.side_gap(entries)
    assert gap["searches"] == 3
    assert gap["coefficients"]["search_side"] == pytest.approx(0.4, abs=1e-6)
    assert gap["coefficients"]["pruned_kl"] == pytest.approx(0.3, abs=1e-6)
    assert rp.side_gap(entries[-1:]) is None


def test_a_search_report_gives_attention_blocks_and_replaces_its_poorer_copy(rp, tmp_path):
    """A search report's choices say which attention blocks are kept; the same short list in
    a comparison JSON (without them) counts once, with them."""
    rng = np.random.default_rng(4)
    space = {"attention": ["4q/2kv", "2q/1kv", "no-op"]}
    searches, reports = [], []
    for n, offset in enumerate((0.0, 1.0, 2.0)):
        rows = []
        for i in range(5):  # KL after training falls by 0.2 per attention block removed
            attention = [0, 2 if i >= 1 else 1, 2 if i >= 3 else 0, 1]
            removed = attention.count(2)
            pruned = float(rng.uniform(2, 6))
            rows.append({"origin": "repair", "params": 1000 + i, "blocks": 8 - removed,
                         "pruned_kl": pruned, "kl": 0.3 * pruned - 0.2 * removed + offset,
                         "choice": {"hidden": 0, "attention": attention, "ffn": [0] * 4}})
        searches.append([{k: v for k, v in r.items() if k != "choice"} for r in rows])
        report = tmp_path / f"r{n}.search.json"
        report.write_text(json.dumps({"kind": "search", "teacher_params": 7_082_240,
                                      "space": space, "selection": rows}))
        reports.append(report)
    entries = rp.short_lists([_comparison(tmp_path / "c.json", searches), *reports])
    assert len(entries) == 3 and {e["file"] for e in entries} == {"c.json"}
    assert [r["attention_blocks"] for r in entries[0]["rows"]] == [4, 3, 3, 2, 2]
    coef = rp.fit(entries, ("pruned_kl", "attention_blocks"))
    assert coef == pytest.approx([0.3, 0.2], abs=1e-9)
    for search in rp.leave_one_out(entries):
        assert search["fitted_attention"]["regret"] == pytest.approx(0.0)
