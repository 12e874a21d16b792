"""bench/retime.py: an earlier comparison's models re-timed here, under limits set here.

The real verify on the real hf-eager target, with random-weight models of the bundled
teacher's shape; the comparison JSON around them is a small fixture (made-up scores).
"""

from __future__ import annotations

import json

import pytest

from autocompress.errors import AutoCompressError
from bench import report


@pytest.fixture(scope="module")
def retime():
    from autocompress.commands.bench import _bench_module

    return _bench_module("retime")


def _arch(layers: int) -> dict:
    from transformers import AutoConfig

    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import arch_spec_of

    spec = arch_spec_of(AutoConfig.from_pretrained(resolve_model_dir("default")))
    return spec.model_copy(update={"layers": spec.layers[:layers]}).model_dump(mode="json")


def _comparison(methods: dict[str, int], limits: dict, fraction: float = 0.5) -> dict:
    per_item = {"t": {str(i): float(i % 2) for i in range(20)}}
    seeds = {m: {"seeds": [{"seed": 0, "arch": _arch(n), "params": n, "measured": {"tpot_ms": 9.9},
                            "noise": {"tpot_ms": 0.1}, "verify_ok": True, "violations": [],
                            "prediction_error": {}, "measurement": {},
                            "scores": {"mc_mean": 0.5}, "per_item": per_item}],
                 "failed": {}} for m, n in methods.items()}
    return {"version": 3, "target": "cpu-local/hf-eager/fp32", "baseline": "minitron",
            "settings": {"teacher": "default"}, "machine": {"cpu": "elsewhere"},
            "runs": [{"preset": "interactive-cpu", "budget_fraction": fraction,
                      "main_metric": "tpot_ms", "limits": limits, "methods": seeds}]}


def test_models_are_re_timed_here_under_the_limits_of_a_run_here(retime, tmp_path):
    earlier, here = tmp_path / "earlier.json", tmp_path / "here.json"
    earlier.write_text(json.dumps(_comparison({"autocompress": 2, "greedy": 1},
                                              {"max_tpot_ms": 3.69})))
    here.write_text(json.dumps(_comparison({"minitron": 1}, {"max_tpot_ms": 1000.0})))
    out = tmp_path / "retimed.json"
    data = retime.main(["--json", str(earlier), "--methods", "autocompress",
                        "--limits-from", str(here), "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == data
    run = data["runs"][0]
    assert list(run["methods"]) == ["autocompress"]  # only the asked method
    assert run["limits"] == {"max_tpot_ms": 1000.0}
    assert run["limits_elsewhere"]["max_tpot_ms"] == 3.69
    (entry,) = run["methods"]["autocompress"]["seeds"]
    # Timed here: a real measurement, not the fixture's 9.9 ms, which is kept beside it.
    assert entry["measured"]["tpot_ms"] != 9.9 and entry["measured"]["tpot_ms"] > 0
    assert entry["measured_elsewhere"]["measured"] == {"tpot_ms": 9.9}
    assert entry["predicted"]["tpot_ms"] > 0  # this machine's cost model's, beside the timing
    assert entry["verify_ok"] and entry["measurement"]["repeats"] == 1
    assert data["machine_elsewhere"] == {"cpu": "elsewhere"}
    assert data["machine"]["cpu_flags"] is not None
    # Same limits now: the two files' methods pair in one cell.
    merged = report.merge_compares([report.load_compare(f"{out}:autocompress"),
                                    report.load_compare(f"{here}:minitron")])
    assert set(merged["runs"][0]["methods"]) == {"autocompress", "minitron"}
    # Without the retime the limits differ, and the pairing is refused.
    with pytest.raises(AutoCompressError, match="different limits"):
        report.merge_compares([report.load_compare(f"{earlier}:autocompress"),
                               report.load_compare(f"{here}:minitron")])


def test_the_re_timed_copy_never_overwrites_an_input(retime, tmp_path):
    earlier = tmp_path / "earlier.json"
    text = json.dumps(_comparison({"autocompress": 2}, {"max_tpot_ms": 3.69}))
    earlier.write_text(text)
    with pytest.raises(AutoCompressError, match="is one of the inputs"):
        retime.main(["--json", str(earlier), "--out", str(earlier)])
    assert earlier.read_text() == text
    with pytest.raises(AutoCompressError, match="does not exist"):
        retime.main(["--json", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o.json")])
    assert not (tmp_path / "o.json").exists()


def test_a_limit_missed_here_is_a_failed_verify(retime):
    data = _comparison({"autocompress": 2}, {"max_tpot_ms": 3.69})
    seen = []

    def timer(arch, preset, limits):
        seen.append((len(arch["layers"]), preset, limits))
        return {"measured": {"tpot_ms": 5.0}, "noise": {"tpot_ms": 0.1}, "verify_ok": False,
                "violations": ["tpot_ms"], "prediction_error": {}, "measurement": {}}

    data["runs"][0]["teacher_verify"] = {"measured": {"tpot_ms": 7.2}}
    here = {"limits": {"max_tpot_ms": 4.0}, "teacher_verify": {"measured": {"tpot_ms": 5.5}},
            "teacher_predicted": {"tpot_ms": 5.4}, "cost_model": "here"}
    out = retime.retimed(data, None, {("interactive-cpu", 0.5): here}, timer)
    assert seen == [(2, "interactive-cpu", {"max_tpot_ms": 4.0})]
    run = out["runs"][0]
    assert run["methods"]["autocompress"]["seeds"][0]["violations"] == ["tpot_ms"]
    # The cell's teacher is this machine's too, the other's kept beside it.
    assert run["teacher_verify"]["measured"]["tpot_ms"] == 5.5 and run["cost_model"] == "here"
    assert run["teacher_verify_elsewhere"]["measured"]["tpot_ms"] == 7.2
    assert data["runs"][0]["limits"] == {"max_tpot_ms": 3.69}  # the input is not changed
    with pytest.raises(AutoCompressError, match="no limits for interactive-cpu @ 0.5"):
        retime.retimed(data, None, {("interactive-cpu", 0.4): here}, timer)
