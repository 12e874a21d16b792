"""A registered model's lineage as a person reads it.

The lineage tags (``lineage.*``, ``artifact.*``) are for tools: correct, but a list of
JSON blobs in the MLflow UI. This module turns the same record into one line per stage
in pipeline order (teacher → cost model → search → prune → distill → eval → verify),
each with its key figures and its artifact: the model version's description in the
MLflow UI (Markdown, ``description``) and the tree ``autocompress lineage`` prints.

Which figures a stage shows is fixed here (``KEY_FIGURES``), and the tags carry exactly
those (``key_figures``), so the tree read back from MLflow says what the description
written at registration says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from autocompress.limits import LIMIT_METRICS

if TYPE_CHECKING:  # tracking imports this module
    from autocompress.artifacts import ArtifactRef
    from autocompress.tracking import Lineage

LIMITED = "{limited}"  # in KEY_FIGURES: each metric the run has a limit on
# Stage -> (what a person calls it, its key figures: metric names, names ending in "."
# or "_" stand for every metric they begin, LIMITED for each limited metric).
KEY_FIGURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "teacher": ("teacher", ("params",)),
    "corpus": ("corpus", ("files_train", "bytes_train")),
    "profile": ("hardware profile", ("gemm_fp32_tflops", "copy_bandwidth_gb_s")),
    "costmodel": ("cost model", ("train_mape.",)),
    "validation": ("cost model validated", ("mape.", "kendall_tau.")),
    "importance": ("importance", ("base_loss",)),
    "arch": ("search", ("params", f"predicted_{LIMITED}", "meets_limits")),
    "pruned": ("prune", ("params",)),
    "model": ("distill", ("final_", "tokens_seen")),
    "evaluation": ("eval", ("mc_mean", "bits_per_byte", "next_token_acc", "heldout_loss")),
    "engine_model": ("export", ("params",)),
    "verification": ("verify", (LIMITED, "ok")),
}
YES_NO = ("ok", "meets_limits")  # 1.0 / 0.0 metrics


class StageLine(BaseModel):
    """One stage of the lineage: its name, what a person calls it, its figures, its
    artifact."""

    stage: str
    title: str
    figures: str
    uri: str
    sha256: str


def _limited(limits: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """metric -> (``<=`` or ``>=``, limit) for each limit the run set."""
    return {metric: ("<=" if direction == "max" else ">=", float(limits[name]))
            for name, (metric, direction) in LIMIT_METRICS.items()
            if limits.get(name) is not None}


def _wanted(stage: str, limits: dict[str, Any]) -> list[str]:
    names = KEY_FIGURES.get(stage, (stage, ()))[1]
    out = []
    for name in names:
        out += ([name.replace(LIMITED, metric) for metric in _limited(limits)]
                if LIMITED in name else [name])
    return out


def key_figures(stage: str, metrics: dict[str, float], limits: dict[str, Any]
                ) -> dict[str, float]:
    """The metrics of ``stage``'s artifact a person is shown (and the tags keep), in
    ``KEY_FIGURES``' order, a prefix's by name: the tags store a dict with sorted keys, so
    an order taken from the dict would differ between registration and read-back."""
    shown: dict[str, float] = {}
    for want in _wanted(stage, limits):
        for name in sorted(metrics):
            if name == want or (want.endswith((".", "_")) and name.startswith(want)):
                shown.setdefault(name, metrics[name])
    return shown


def _number(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.4g}"


def _figure(name: str, value: float, limits: dict[str, tuple[str, float]]) -> str:
    if name in YES_NO:
        return f"{name} {'yes' if value else 'no'}"
    metric = name.removeprefix("predicted_")
    bound = f" (limit {limits[metric][0]} {_number(limits[metric][1])})" \
        if metric in limits else ""
    return f"{name} {_number(value)}{bound}"


def _figures(stage: str, ref: ArtifactRef, info: Lineage) -> str:
    limits = _limited(info.limits)
    shown = key_figures(stage, ref.metrics, info.limits)
    text = ", ".join(_figure(name, value, limits) for name, value in shown.items())
    if stage == "teacher":
        text = ", ".join(filter(None, [info.teacher, text]))
    return text


def stage_lines(info: Lineage) -> list[StageLine]:
    """The lineage's stages in pipeline order, each with its figures and artifact."""
    return [StageLine(stage=stage, title=KEY_FIGURES.get(stage, (stage,))[0],
                      figures=_figures(stage, ref, info), uri=ref.uri, sha256=ref.sha256)
            for stage, ref in info.artifacts.items()]


def headline(info: Lineage) -> str:
    """What was compressed for what: teacher, target, workload, limits."""
    limits = " and ".join(f"{metric} {sign} {_number(value)}"
                          for metric, (sign, value) in _limited(info.limits).items())
    where = f" for `{info.target}`" if info.target else ""
    workload = f" ({info.workload})" if info.workload else ""
    return (f"Compressed from `{info.teacher}`{where}{workload}"
            + (f" within {limits}" if limits else "") + ".")


def description(info: Lineage) -> str:
    """The model version's description in the MLflow UI (Markdown): the headline, then one
    numbered line per stage with its figures and a link to its artifact."""
    lines = [headline(info), ""]
    for number, line in enumerate(stage_lines(info), 1):
        figures = f": {line.figures}" if line.figures else ""
        lines.append(f"{number}. **{line.title}**{figures} · [{line.stage}]({line.uri}) "
                     f"`{line.sha256[:12]}`")
    lines += ["", "The `lineage.*` and `artifact.*` tags hold the same for tools; "
              "`autocompress lineage --model NAME@VERSION` re-checks every artifact's hash."]
    return "\n".join(lines)
