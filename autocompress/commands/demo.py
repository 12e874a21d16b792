"""`autocompress demo`: the README's main job — a full compression run on the default.

It is `autocompress run` with settings sized for 2 CPU cores (about 14 minutes
from a fresh clone): the bundled teacher, the local CPU as target, the
`interactive-cpu` preset with a TPOT limit at 60% of the teacher's, the cost
model fitted on that preset only, and the Minitron baseline beside it.
"""

from __future__ import annotations

import json

import typer


def demo(
    workload: str = typer.Option("interactive-cpu", help="Workload preset."),
    budget_fraction: float = typer.Option(
        0.6, help="Limit on the preset's main metric, as a fraction of the teacher's."),
    baseline: bool = typer.Option(True, help="Also run the matched Minitron baseline."),
    eval_limit: int = typer.Option(150, help="Items per benchmark (keeps the demo short)."),
) -> None:
    """Compress the default teacher for this CPU through the whole Prefect flow.

    Embedded MLflow (sqlite under $AUTOCOMPRESS_HOME) and a local Prefect run;
    re-running reuses every finished stage.
    """
    from autocompress.commands.pipeline import run
    from autocompress.limits import Limits

    # Every parameter of `run` is given: called as a function, an omitted typer option
    # would arrive as its OptionInfo, not its default.
    run(teacher="default", target=["cpu-local/hf-eager/fp32"], workload=workload,
        limits=Limits(), budget_fraction=budget_fraction, budgets=None, baseline=baseline,
        method="autocompress", seed=None,
        eval_tasks=None, eval_limit=eval_limit, register_as="autocompress-demo",
        no_register=False, store=None, experiment="autocompress-demo", no_track=False,
        refresh_cache=False,
        # Fit the cost model on the demo's workload only (a third of the probing).
        # Paired timing spreads by a few per cent, so 2 repetitions suffice to fit and
        # gate, and 5 to verify (the defaults suit a full run).
        options=json.dumps({"costmodel": {"workloads": [workload], "repeats": 2},
                            "validation": {"repeats": 2}, "verify": {"repeats": 5}}))


def register(app: typer.Typer) -> None:
    """Add `demo` to the main app."""
    app.command("demo")(demo)
