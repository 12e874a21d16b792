"""Stages of the many-target flows (``flows/targets.py``): a Pareto family from one search,
one architecture for several targets, and an architecture's predicted cost on a target.

Each wraps one library call (``search.family.run_family``, ``search.multitarget.
run_joint_search``, ``CostModel.predict``); the family writes one ``arch.json`` per budget
under ``<label>/``, and ``family_member`` publishes one of them as an ``archspec`` like the
search stage's, so prune/distill/verify take it unchanged.
"""

from __future__ import annotations

import shutil

from autocompress.arch_search.run import minitron_to_file
from autocompress.artifacts import ArtifactRef
from autocompress.limits import Limits
from tasks.search import _arch_metrics, _context
from tasks.stage import StageContext, stage


@stage("family", retries=1)
def family_search(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                  importance: ArtifactRef, costmodel: ArtifactRef, validation: ArtifactRef,
                  target: str, workload: str, limits: list[Limits], labels: list[str],
                  options: dict | None = None) -> ArtifactRef:
    """``search.family.run_family``: one DNAS, one set of scores, one repair per budget."""
    from autocompress.arch_search.family import run_family
    from autocompress.atomic import write_json_atomic

    search_ctx, config = _context(ctx, teacher, corpus, importance, costmodel, target,
                                  workload, options)
    members = run_family(search_ctx, limits, config)
    out = ctx.scratch() / "family"
    metrics = {"family.shared_seconds": float(members[0].seconds["shared"])}
    for label, member in zip(labels, members, strict=True):
        (out / label).mkdir(parents=True)
        member.spec.to_json(out / label / "arch.json")
        write_json_atomic(out / label / "arch.search.json", member.report(search_ctx))
        metrics[f"family.{label}.seconds"] = float(member.seconds["own"])
        metrics[f"family.{label}.params"] = float(member.spec.num_params())
    return ctx.publish(out, "archfamily", metrics=metrics, meta={"labels": labels})


@stage("family_member")
def family_member(ctx: StageContext, family: ArtifactRef, label: str) -> ArtifactRef:
    """One member of a family as an ``archspec`` artifact (the search stage's layout)."""
    import json

    source = ctx.fetch(family) / label
    out = ctx.scratch() / "arch"
    shutil.copytree(source, out)
    report = json.loads((out / "arch.search.json").read_text())
    return ctx.publish(out, "archspec", metrics=_arch_metrics(report),
                       meta={"method": "autocompress-family", "label": label})


@stage("joint_search", retries=1)
def joint_search(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                 importance: ArtifactRef, costmodels: list[ArtifactRef],
                 validations: list[ArtifactRef], targets: list[str], workload: str,
                 limits: list[Limits], options: dict | None = None) -> ArtifactRef:
    """``search.multitarget.run_joint_search``: one architecture within every target's
    limits, timed on every target this machine can time."""
    from autocompress.arch_search.measured import measure_spec
    from autocompress.arch_search.multitarget import run_joint_search, target_limits
    from autocompress.atomic import write_json_atomic
    from autocompress.costmodel import CostModel

    search_ctx, config = _context(ctx, teacher, corpus, importance, costmodels[0], targets[0],
                                  workload, options)
    joint = [target_limits(search_ctx, name, CostModel.load(ctx.fetch(ref)),
                           search_ctx.workload, own, None)
             for name, ref, own in zip(targets, costmodels, limits, strict=True)]

    def measure(target, spec):
        return measure_spec(spec, search_ctx.model.config, target.cost_model, target.workload,
                            config.measured_repeats, config.timing_drift)

    outcome = run_joint_search(search_ctx, joint, config,
                               measure if config.measured_rounds else None)
    out = ctx.scratch() / "arch"
    out.mkdir()
    report = outcome.report(search_ctx)
    outcome.spec.to_json(out / "arch.json")
    write_json_atomic(out / "arch.search.json", report)
    metrics = {"params": float(report["params"]), "meets_limits": float(report["meets_limits"])}
    return ctx.publish(out, "archspec", metrics=metrics, meta={"method": "joint-search",
                                                               "targets": targets})


@stage("predict")
def predict_arch(ctx: StageContext, arch: ArtifactRef, costmodel: ArtifactRef, workload: str,
                 limits: Limits) -> ArtifactRef:
    """The cost model's prediction of ``arch`` on its target, checked against ``limits``
    (the matrix's cells on targets this machine cannot measure)."""
    from autocompress.arch import ArchSpec
    from autocompress.costmodel import CostModel, get_workload

    model = CostModel.load(ctx.fetch(costmodel))
    spec = ArchSpec.from_json(ctx.fetch(arch) / "arch.json")
    prediction = model.predict(spec, get_workload(workload))
    predicted = prediction.metrics()
    checks = limits.check(predicted)
    data = {"target": model.target.name, "predicted": predicted, "measured": False,
            "limits": limits.model_dump(exclude_none=True), "fits": prediction.fits,
            "ok": all(c.ok for c in checks) and prediction.fits,
            "checks": [c.model_dump() for c in checks]}
    metrics = {f"predicted_{k}": float(v) for k, v in predicted.items()
               if isinstance(v, int | float)}
    metrics["ok"] = float(data["ok"])
    return ctx.publish_json("prediction.json", data, kind="prediction", metrics=metrics)


@stage("params_matched", retries=1)
def params_matched_arch(ctx: StageContext, teacher: ArtifactRef, corpus: ArtifactRef,
                        importance: ArtifactRef, costmodel: ArtifactRef, arch: ArtifactRef,
                        target: str, workload: str, options: dict | None = None
                        ) -> ArtifactRef:
    """The homogeneous architecture with ``arch``'s parameter count (at most; Model
    Optimizer's ``params`` constraint, ``minitron_for_params``): what a parameter budget
    alone would have picked, for the matrix to measure against the target's limit."""
    search_ctx, config = _context(ctx, teacher, corpus, importance, costmodel, target,
                                  workload, options)
    params = int(arch.metrics["params"])
    out_dir = ctx.scratch() / "arch"
    out_dir.mkdir()
    report = minitron_to_file(search_ctx, out_dir / "arch.json", params=params, config=config,
                              progress=True)
    return ctx.publish(out_dir, "archspec", metrics=_arch_metrics(report),
                       meta={"method": "minitron-params", "params_of": params})
