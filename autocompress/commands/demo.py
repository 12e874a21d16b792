"""`autocompress demo`: the main job — compress, verify, register — in minutes on 2 cores.

It is `autocompress run` on the defaults (the bundled 7M-parameter teacher, this CPU, the
default workload, a TPOT limit at 60% of the teacher's) with every stage sized down so that
a fresh clone finishes in about five minutes on 2 cores: a smaller cost-model fit and gate,
a shorter search with a shorter short list, a smaller distillation budget and fewer
benchmark items. The fair Minitron baseline beside it is `--baseline` (its timed candidates
and short distillations alone took 470 s at full size). At the end the demo says what it
skipped and how to run the full version.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from autocompress.defaults import DEFAULT_METHOD, DEFAULT_TARGET, DEFAULT_TEACHER, DEFAULT_WORKLOAD
from autocompress.profiles import DEMO

# What the demo shrinks, as `--options` of `autocompress run` (autocompress.profiles.DEMO).
DEMO_OPTIONS: dict[str, dict[str, Any]] = DEMO.options
DEMO_EVAL_LIMIT: int = DEMO.eval_limit
REGISTERED_NAME = "autocompress-demo"


def demo_options(workload: str) -> dict[str, dict[str, Any]]:
    """``DEMO_OPTIONS`` with the cost model fitted on the demo's workload only (a third of
    the probing of a fit on every CPU preset)."""
    costmodel = {"workloads": [workload], **DEMO_OPTIONS["costmodel"]}
    return {**DEMO_OPTIONS, "costmodel": costmodel}


def demo(
    workload: str = typer.Option(DEFAULT_WORKLOAD, help="Workload preset."),
    budget_fraction: float = typer.Option(
        0.6, help="Limit on the preset's main metric, as a fraction of the teacher's."),
    baseline: bool = typer.Option(False, help="Also run the matched Minitron baseline "
                                  "(adds several minutes)."),
    eval_limit: int = typer.Option(DEMO_EVAL_LIMIT, help="Items per benchmark."),
) -> None:
    """Compress the default teacher for this CPU through the whole Prefect flow, sized to
    finish in about five minutes on 2 cores.

    Embedded MLflow (sqlite under $AUTOCOMPRESS_HOME) and a local Prefect run;
    re-running reuses every finished stage.
    """
    from autocompress.commands.pipeline import run
    from autocompress.limits import Limits

    # Every parameter of `run` is given: called as a function, an omitted typer option
    # would arrive as its OptionInfo, not its default.
    run(teacher=DEFAULT_TEACHER, target=[DEFAULT_TARGET], workload=workload,
        limits=Limits(), budget_fraction=budget_fraction, budgets=None, baseline=baseline,
        method=DEFAULT_METHOD, seed=None,
        eval_tasks=None, eval_limit=eval_limit, register_as=REGISTERED_NAME,
        no_register=False, store=None, experiment=REGISTERED_NAME, no_track=False,
        refresh_cache=False, options=json.dumps(demo_options(workload)), profile=None)
    print(skipped_note(workload, budget_fraction, baseline, eval_limit))


def skipped_note(workload: str, budget_fraction: float, baseline: bool,
                 eval_limit: int) -> str:
    """What the demo left out, and the command that runs the full version (a few lines:
    the last a log shows)."""
    shrunk = "; ".join(f"{stage} {json.dumps(settings, separators=(',', ':'))}"
                       for stage, settings in DEMO_OPTIONS.items())
    lines = ["", "The demo is sized down to finish in minutes (a full run uses each stage's "
             f"defaults): {shrunk}; evaluation {eval_limit} items per benchmark."]
    if not baseline:
        lines.append("The Minitron baseline was skipped (add --baseline).")
    lines.append(f"Full version: autocompress run --workload {workload} "
                 f"--budget-fraction {budget_fraction} --baseline")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add `demo` to the main app."""
    app.command("demo")(demo)
