"""A rich table of one evaluation result (the dict returned by ``evaluate``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _pm(value: float | None, stderr: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" + (f" ± {stderr:.{digits}f}" if stderr is not None else "")


def results_table(result: dict[str, Any], title: str | None = None) -> Table:
    """Task, score ± stderr, chance, metric and number of items, then the summaries."""
    table = Table(title=title or f"evaluation of {result.get('model', '?')}")
    table.add_column("task")
    table.add_column("score ± stderr", justify="right")
    table.add_column("chance", justify="right")
    table.add_column("metric")
    table.add_column("n", justify="right")
    for name, entry in result.get("tasks", {}).items():
        chance = entry.get("chance")
        table.add_row(name, _pm(entry["score"], entry.get("stderr")),
                      "—" if chance is None else f"{chance:.3f}", entry.get("metric", ""),
                      str(entry.get("n") or ""))
    if result.get("mc_mean") is not None:
        table.add_section()
        chance = result.get("mc_chance_mean")
        table.add_row("multiple-choice mean", _pm(result["mc_mean"], result.get("mc_mean_stderr")),
                      "—" if chance is None else f"{chance:.3f}", "mean", "")
    if result.get("bits_per_byte") is not None:
        table.add_section()
        details = result.get("details", {})
        table.add_row("held-out bits/byte (lower is better)",
                      _pm(result["bits_per_byte"], result.get("bits_per_byte_stderr")), "—",
                      "bits_per_byte", str(details.get("bits_per_byte", {}).get("chunks", "")))
        table.add_row("held-out next-token accuracy",
                      _pm(result["next_token_acc"], result.get("next_token_acc_stderr")), "—",
                      "argmax acc", str(details.get("next_token", {}).get("tokens", "")))
        table.add_row("held-out loss (nats/token)",
                      _pm(result["heldout_loss"], result.get("heldout_loss_stderr")), "—",
                      "cross-entropy", "")
    return table
