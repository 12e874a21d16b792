"""Registration stage: the final model into the MLflow model registry, with lineage."""

from __future__ import annotations

from pydantic import BaseModel

from autocompress.artifacts import ArtifactRef
from autocompress.tracking import Lineage, get_tracker
from tasks.stage import StageContext, stage


class Registered(BaseModel):
    """Where a model was registered."""

    name: str
    version: int
    tracking_uri: str
    model: ArtifactRef


# Not cached: every flow run that gets here registers a new version (its lineage
# names its own flow run). Retried, because a registry server can be briefly away.
@stage("register", cache=False, retries=3, retry_delay_seconds=5.0)
def register_model(ctx: StageContext, name: str, model: ArtifactRef, lineage: Lineage,
                   description: str | None = None) -> Registered:
    """Register ``model`` as a new version of ``name`` with ``lineage`` as tags."""
    tracker = ctx.tracker or get_tracker(ctx.run.experiment, ctx.run.tracking_uri)
    version = tracker.register_model(name, model, lineage, run_id=ctx.run.parent_run_id,
                                     description=description)
    ctx.log_params({"registered_name": name, "registered_version": version})
    return Registered(name=name, version=version, tracking_uri=tracker.uri, model=model)
