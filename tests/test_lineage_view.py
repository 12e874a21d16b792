"""The registered model's lineage in words (issue 63): the model version's description in
the MLflow UI and the tree `autocompress lineage` prints say the same, stage by stage
with each stage's key figures and artifact; the tags stay for tools."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autocompress.artifacts import LocalStore
from autocompress.lineage_view import description, key_figures, stage_lines
from autocompress.tracking import Lineage, Tracker, lineage

LIMITS = {"max_tpot_ms": 3.5}
# What the compress flow's stages publish (tasks/*.py), more than a person is shown.
METRICS = {
    "teacher": {"params": 7_053_568.0, "tokens_seen": 2e6, "train_seconds": 900.0},
    "validation": {"mape.tpot_ms": 1.35, "kendall_tau.tpot_ms": 0.91, "spread.tpot_ms": 0.02},
    "arch": {"params": 4_200_000.0, "teacher_params": 7_053_568.0,
             "predicted_tpot_ms": 3.1, "predicted_ttft_ms": 9.0, "meets_limits": 1.0},
    "pruned": {"params": 4_200_000.0, "teacher_params": 7_053_568.0},
    "model": {"final_loss": 2.31, "initial_loss": 4.0, "tokens_seen": 30_000.0,
              "tokens_per_s": 512.0},
    "evaluation": {"mc_mean": 0.41, "mc_mean_stderr": 0.03, "task.a": 0.5},
    "verification": {"tpot_ms": 3.2, "ttft_ms": 8.0, "predicted_tpot_ms": 3.1, "ok": 1.0},
}


def _lineage(tmp_path: Path) -> Lineage:
    store = LocalStore(tmp_path / "store")
    refs = {}
    for stage, metrics in METRICS.items():
        path = tmp_path / "made" / stage
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(stage)
        refs[stage] = store.publish(path, stage, metrics=metrics)
    return Lineage(teacher="default", teacher_sha256=refs["teacher"].sha256,
                   target="cpu-local/hf-eager/fp32", workload="interactive-cpu",
                   limits=LIMITS, artifacts=refs)


def test_each_stage_shows_its_key_figures_and_the_limit_beside_a_limited_metric(tmp_path):
    assert key_figures("verification", METRICS["verification"], LIMITS) == {
        "tpot_ms": 3.2, "ok": 1.0}
    assert key_figures("model", METRICS["model"], LIMITS) == {"final_loss": 2.31,
                                                               "tokens_seen": 30_000.0}
    figures = {line.title: line.figures for line in stage_lines(_lineage(tmp_path))}
    assert figures == {
        "teacher": "default, params 7.05M",
        "cost model validated": "mape.tpot_ms 1.35, kendall_tau.tpot_ms 0.91",
        "search": "params 4.2M, predicted_tpot_ms 3.1 (limit <= 3.5), meets_limits yes",
        "prune": "params 4.2M",
        "distill": "final_loss 2.31, tokens_seen 30k",
        "eval": "mc_mean 0.41",
        "verify": "tpot_ms 3.2 (limit <= 3.5), ok yes",
    }


def test_the_registered_version_reads_as_the_lineage_command_prints_it(tmp_path,
                                                                      monkeypatch):
    """On a real MLflow store (sqlite in a file, the CLI's default; MLflow refuses its
    ./mlruns file store unless told to): the version's description has a numbered line per
    stage with its figures and artifact link; `autocompress lineage` prints the same
    figures, read back from the tags, and the tags are still there for tools."""
    from autocompress.cli import app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    info = _lineage(tmp_path)
    tracker = Tracker("lineage-view", uri=uri)
    version = tracker.register_model("readable", info.artifacts["verification"], info,
                                     run_id=tracker.start_run("parent"))
    text = tracker.client.get_model_version("readable", str(version)).description
    assert text == description(info)
    lines = text.splitlines()
    assert lines[0] == ("Compressed from `default` for `cpu-local/hf-eager/fp32` "
                        "(interactive-cpu) within tpot_ms <= 3.5.")
    verify = info.artifacts["verification"]
    assert lines[8] == (f"7. **verify**: tpot_ms 3.2 (limit <= 3.5), ok yes · "
                        f"[verification]({verify.uri}) `{verify.sha256[:12]}`")

    read_back = lineage("readable", tracker=tracker).lineage
    assert stage_lines(read_back) == stage_lines(info)  # the tags carry the key figures
    tags = tracker.client.get_model_version("readable", str(version)).tags
    assert tags["lineage.teacher"] == "default" and "artifact.verification" in tags

    printed = CliRunner().invoke(app, ["lineage", "--model", f"readable@{version}"],
                                 terminal_width=200)
    assert printed.exit_code == 0, printed.output
    for line in stage_lines(info):
        assert f"{line.title}: {line.figures}" in printed.output
    assert printed.output.count("ok ") >= len(info.artifacts)  # every artifact re-hashed
