"""Verification stage (box 10 of ``flows/compress.py``): measure on the target, check limits.

A violated limit does not fail the stage: the report says so (``ok`` = 0) and
the flow decides (it does not register a model that misses its limits).
"""

from __future__ import annotations

from autocompress.artifacts import ArtifactRef
from autocompress.limits import Limits
from tasks.stage import StageContext, stage


@stage("verify")
def verify_model(ctx: StageContext, model: ArtifactRef, costmodel: ArtifactRef, target: str,
                 workload: str, limits: Limits, machine: str,
                 options: dict | None = None) -> ArtifactRef:
    """``autocompress.verify.verify`` with the flow's cost model for the predictions.

    ``machine`` keys the cache: a measurement is valid on the machine that took it.
    """
    from autocompress.costmodel import CostModel
    from autocompress.stage_config import stage_settings
    from autocompress.verify import verify

    opts = stage_settings("verify", options).model_dump()
    ctx.log_params({"verify": opts, "machine": machine})
    report = verify(ctx.fetch(model), target, workload, limits,
                    cost_model=CostModel.load(ctx.fetch(costmodel)), **opts)
    metrics = {k: float(v) for k, v in report.measured.items()}
    metrics.update({f"predicted_{k}": float(v) for k, v in (report.predicted or {}).items()})
    metrics["ok"] = float(report.ok)
    if "params" in model.metrics:
        metrics["params"] = float(model.metrics["params"])
    return ctx.publish_json("verification.json", report.model_dump(mode="json"),
                            kind="verification", metrics=metrics)
