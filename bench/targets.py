"""Each target gets its own architecture, and it matters (issue 17): measured.

``matrix``: the ``targets-matrix`` flow (``flows/targets.py``) searches each target's own
architecture at the same relative budget (a fraction of the teacher's predicted main
metric on that target), prunes, distils and evaluates it, then verifies every
architecture on every measurable target with that target's cost model and limits, and
predicts it on the GPU targets (spec-sheet cost models: predicted only). Writes
``results/targets.json``, ``results/targets.md`` (the N×N tables, the thesis check, why
the architectures differ) and ``results/targets_heatmaps.png``.

``pareto``: the ``pareto`` flow (one search, ``--budgets``) for one target, then, for the
time comparison, the same budgets one by one through ``flows/sweep.py`` (one ``compress``
run each). Writes ``results/targets_pareto.json`` and ``results/targets_pareto.png``; the
next ``report`` adds it to ``results/targets.md``.

``report``: rewrite ``results/targets.md`` from the JSON files.

    python bench/targets.py matrix      # the defaults below are what results/ holds
    python bench/targets.py pareto --one-by-one 0.3 0.5 0.7
    python bench/targets.py report

Stages are the flows' cached tasks: a re-run reuses every finished stage (shared with the
matrix: the teacher, the corpus, importance, the teacher's evaluation, and the cost model
and gate of the Pareto target).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
MEASURED = ["cpu-local/hf-eager/fp32", "cpu-local/llama.cpp/f32", "cpu-local/llama.cpp/q4_0"]
PREDICTED = ["rtx-5070/vllm/bf16", "h100-sxm/trtllm/bf16"]
# Small budgets, sized so the whole matrix and family fit ~25 min of 2 shared cores with
# the bundled 7M teacher; results/targets.md repeats them.
OPTIONS: dict[str, dict[str, Any]] = {
    "costmodel": {"n_probes": 12, "repeats": 3},
    "validation": {"n": 6, "repeats": 3, "max_mape": 60.0, "min_kendall_tau": 0.3},
    "search": {"dnas": {"steps": 60, "batch_size": 4, "teacher_cache": 8},
               "measured_rounds": 2, "measured_repeats": 5},
    "distill": {"tokens": 32768, "batch_size": 8, "seq_len": 256, "eval_batches": 2,
                "ckpt_every": 10},
    "verify": {"repeats": 5},
}


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


def _prepare() -> None:
    from autocompress.commands.pipeline import _prepare_environment

    _prepare_environment()  # Prefect's home and telemetry, before Prefect is imported


def _json(ref: dict) -> dict:
    from autocompress.artifacts import ArtifactRef, fetch

    return json.loads(fetch(ArtifactRef.model_validate(ref)).read_text())


def _arch(ref: dict) -> dict:
    from autocompress.artifacts import ArtifactRef, fetch

    return json.loads((fetch(ArtifactRef.model_validate(ref)) / "arch.json").read_text())


def _options(args) -> dict[str, dict[str, Any]]:
    extra = json.loads(args.options or "{}")
    return {stage: {**OPTIONS.get(stage, {}), **extra.get(stage, {})}
            for stage in {*OPTIONS, *extra}}


# ------------------------------------------------------------------ matrix


def run_matrix(args) -> dict:
    _prepare()
    from flows.targets import targets_matrix

    load = {"before": os.getloadavg()}
    started = time.perf_counter()
    data = targets_matrix(teacher=args.teacher, targets=args.targets,
                          predicted_targets=args.predicted, workload=args.workload,
                          predicted_workload=args.predicted_workload,
                          budget_fraction=args.budget_fraction, eval_limit=args.eval_limit,
                          options=_options(args), seed=args.seed, track=not args.no_track)
    load["after"] = os.getloadavg()
    for model in data["models"].values():
        model["arch_spec"] = _arch(model["arch"])
        model["evaluation_report"] = _summary(_json(model["evaluation"]))
        model["cost_terms"] = cost_terms(model["costmodel"], data, model)
        validation = _json(model["validation"])
        model["validation_mape"] = validation.get("mape")
    data.update(load_average=load, wall_s=time.perf_counter() - started,
                created=datetime.now(UTC).isoformat(timespec="seconds"),
                options=_options(args), eval_limit=args.eval_limit, teacher=args.teacher)
    return data


def _summary(evaluation: dict) -> dict:
    keys = ("mc_mean", "mc_mean_stderr", "heldout_loss", "heldout_loss_stderr",
            "bits_per_byte", "next_token_acc")
    return {k: evaluation.get(k) for k in keys}


def cost_terms(costmodel_ref: dict, data: dict, model: dict) -> dict[str, float]:
    """What each kind of cut saves on this target, as a share of the teacher's main metric:
    one attention block, one FFN block (a middle layer), all FFN widths halved, all query
    heads halved, the hidden size halved (the cost model's own predictions)."""
    from autocompress.artifacts import ArtifactRef, fetch
    from autocompress.costmodel import CostModel, get_workload
    from autocompress.modeling import arch_spec_of, load_causal_lm
    from autocompress.paths import resolve_model_dir

    cm = CostModel.load(fetch(ArtifactRef.model_validate(costmodel_ref)))
    measured = cm.target.name in data["targets"]
    wl = get_workload(data["workload"] if measured else data["predicted_workload"])
    teacher, _ = load_causal_lm(str(resolve_model_dir(data.get("teacher") or "default")),
                                with_tokenizer=False)
    spec = arch_spec_of(teacher)
    metric = wl.main_metric
    base = cm.predict(spec, wl).metrics()[metric]
    middle = spec.num_layers // 2

    def cut(update) -> float:
        layers = [layer.model_copy(deep=True) for layer in spec.layers]
        hidden = update(layers)
        variant = spec.model_copy(update={"layers": layers,
                                          "hidden_size": hidden or spec.hidden_size})
        return 1.0 - cm.predict(variant, wl).metrics()[metric] / base

    def drop(kind):
        def update(layers):
            setattr(layers[middle], kind, None)
        return update

    def halve_ffn(layers):
        for layer in layers:
            layer.ffn = layer.ffn.model_copy(update={"intermediate_size":
                                                     layer.ffn.intermediate_size // 2})

    def halve_heads(layers):
        for layer in layers:
            att = layer.attention
            layer.attention = att.model_copy(update={"num_heads": att.num_heads // 2})

    return {"metric": metric, "teacher": base, "one attention block": cut(drop("attention")),
            "one FFN block": cut(drop("ffn")), "FFN widths halved": cut(halve_ffn),
            "query heads halved": cut(halve_heads),
            "hidden size halved": cut(lambda layers: spec.hidden_size // 2)}


# ------------------------------------------------------------------ Pareto family


def run_pareto(args) -> dict:
    _prepare()
    from flows.sweep import SweepPoint, pareto_front, sweep
    from flows.targets import budget_label, pareto

    options = _options(args)
    load = {"before": os.getloadavg()}
    t0 = time.perf_counter()
    family = pareto(teacher=args.teacher, target=args.target, workload=args.workload,
                    budgets=args.budgets, eval_limit=args.eval_limit, options=options,
                    seed=args.seed, track=not args.no_track)
    family_wall = time.perf_counter() - t0
    load["after_family"] = os.getloadavg()
    points = []
    for fraction in args.budgets:
        label = budget_label(fraction)
        out = family.outputs
        evaluation, verification = out[f"evaluation.{label}"], out[f"verification.{label}"]
        points.append(SweepPoint(
            label=label, overrides={"budget_fraction": fraction},
            score=evaluation.metrics.get("mc_mean"),
            costs={m: verification.metrics[m] for m in ("tpot_ms", "memory_gb")
                   if m in verification.metrics},
            outputs={"arch": out[f"arch.{label}"], "evaluation": evaluation,
                     "verification": verification}))
    pareto_front(points, ["tpot_ms"])
    members = [_member(p, fraction) for p, fraction in zip(points, args.budgets, strict=True)]
    data = {"target": args.target, "workload": args.workload, "budgets": args.budgets,
            "members": members, "family_wall_s": family_wall,
            "family_steps": [s.model_dump() for s in family.steps]}
    if args.one_by_one:
        t1 = time.perf_counter()
        runs = [{"label": budget_label(f), "budget_fraction": f} for f in args.one_by_one]
        base = {"teacher": args.teacher, "target": args.target, "workload": args.workload,
                "eval_limit": args.eval_limit, "register_as": None, "options": options,
                "seed": args.seed, "track": not args.no_track}
        report = sweep(runs=runs, base=base, cost_metrics=["tpot_ms"])
        data["one_by_one"] = {"budgets": args.one_by_one, "wall_s": time.perf_counter() - t1,
                              "points": [_one(p) for p in report.points]}
        load["after_one_by_one"] = os.getloadavg()
    data.update(load_average=load, created=datetime.now(UTC).isoformat(timespec="seconds"),
                options=options, eval_limit=args.eval_limit)
    return data


def _member(point, fraction: float) -> dict:
    verification = _json(point.outputs["verification"].model_dump(mode="json"))
    evaluation = _json(point.outputs["evaluation"].model_dump(mode="json"))
    arch = point.outputs["arch"]
    return {"label": point.label, "budget_fraction": fraction,
            "params": arch.metrics.get("params"), "scores": _summary(evaluation),
            "measured": verification["measured"], "noise": verification["noise"],
            "predicted": verification["predicted"], "limits": verification["limits"],
            "ok": verification["ok"], "pareto": point.pareto,
            "arch_spec": _arch(arch.model_dump(mode="json"))}


def _one(point) -> dict:
    return {"label": point.label, "error": point.error, "score": point.score,
            "costs": point.costs, "steps": point.steps,
            "params": (point.outputs.get("arch").metrics.get("params")
                       if point.outputs.get("arch") is not None else None)}


def search_seconds(steps: list[dict], names: tuple[str, ...]) -> float:
    """Seconds the flow spent in steps whose name starts with one of ``names`` (not cached)."""
    return sum(s["seconds"] for s in steps
               if s["state"] != "Cached" and s["name"].split(".")[0] in names)


# ------------------------------------------------------------------ report


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def matrix_tables(data: dict) -> list[str]:
    names = list(data["models"])
    lines = [f"Budget: {data['budget_fraction']:.0%} of the teacher's predicted main metric "
             f"on each target (measured targets: workload `{data['workload']}`; GPU targets: "
             f"`{data['predicted_workload']}`, predicted only).", "",
             "**Each target's own architecture** (held-out loss: lower is better; s.e. over "
             "windows; MC: multiple-choice mean over the local tasks, s.e. over items)", "",
             "| searched for | params | hidden | held-out loss ± s.e. | MC ± s.e. | its limit | "
             "cost-model gate MAPE |", "|---|---|---|---|---|---|---|"]
    for name in names:
        m = data["models"][name]
        s = m["evaluation_report"]
        gate = m.get("validation_mape") or {}
        lines.append(
            f"| {name} | {m['params']:,.0f} | {m['arch_spec']['hidden_size']} | "
            f"{_fmt(s['heldout_loss'], 4)} ± {_fmt(s['heldout_loss_stderr'], 2)} | "
            f"{_fmt(s['mc_mean'])} ± {_fmt(s['mc_mean_stderr'], 2)} | "
            f"{_limit_text(m['limits'])} | "
            f"{', '.join(f'{k} {v:.1f}%' for k, v in gate.items()) or 'not measurable'} |")
    for measured in (True, False):
        targets = data["targets"] if measured else data["predicted_targets"]
        if not targets:
            continue
        title = ("**Measured** on this CPU (`verify`: median ± noise, ✓ = meets the target's "
                 "limit within the noise)" if measured else
                 "**Predicted** (spec-sheet cost models; nothing here was measured)")
        lines += ["", title, "", "| architecture ↓ / target → | " + " | ".join(targets) + " |",
                  "|---|" + "---|" * len(targets)]
        for arch in names:
            row = [arch]
            for target in targets:
                cell = _cell(data, arch, target)
                row.append(_cell_text(cell, data["models"][target]["limits"]))
            lines.append("| " + " | ".join(row) + " |")
    return lines


def _cell(data: dict, arch: str, target: str) -> dict:
    return next(c for c in data["cells"] if c["arch"] == arch and c["target"] == target)


def _limit_text(limits: dict) -> str:
    return ", ".join(f"{k.removeprefix('max_')} ≤ {v:.3g}" for k, v in limits.items()) or "–"


def _cell_text(cell: dict, limits: dict) -> str:
    metric = next(iter(limits)).removeprefix("max_")
    mark = "✓" if cell["ok"] else "✗"
    if cell["measured"]:
        value, noise = cell["costs"].get(metric), cell["noise"].get(metric, 0.0)
        return f"{mark} {_fmt(value)} ± {_fmt(noise, 2)} (pred {_fmt(cell['predicted'][metric])})"
    return f"{mark} {_fmt(cell['predicted'].get(metric))}"


def thesis_rows(data: dict) -> list[str]:
    """Per target: among the architectures meeting its limit, the most accurate one."""
    lines = ["| target | meet its limit | most accurate of those (held-out loss) | "
             "its own | own − best | verdict |", "|---|---|---|---|---|---|"]
    models = data["models"]
    for target in [*data["targets"], *data["predicted_targets"]]:
        meeting = [a for a in models if _cell(data, a, target)["ok"]]
        own = models[target]["evaluation_report"]
        if not meeting:
            lines.append(f"| {target} | none | – | {_fmt(own['heldout_loss'], 4)} | – | "
                         "no architecture meets it as measured |")
            continue
        best = min(meeting, key=lambda a: models[a]["evaluation_report"]["heldout_loss"])
        best_loss = models[best]["evaluation_report"]["heldout_loss"]
        se = max(models[best]["evaluation_report"].get("heldout_loss_stderr") or 0.0,
                 own.get("heldout_loss_stderr") or 0.0)
        if target not in meeting:
            verdict, gap = "**fails**: its own architecture misses its limit", "–"
        else:
            diff = own["heldout_loss"] - best_loss
            gap = f"{diff:+.4f}"
            verdict = ("holds" if best == target else
                       ("within noise" if diff <= 2 * se else "**fails**"))
        lines.append(f"| {target} | {', '.join(meeting)} | {best} ({best_loss:.4f}) | "
                     f"{_fmt(own['heldout_loss'], 4)} | {gap} | {verdict} |")
    return lines


def cost_term_rows(data: dict) -> list[str]:
    terms = ["one attention block", "one FFN block", "FFN widths halved", "query heads halved",
             "hidden size halved"]
    lines = ["| target | teacher's main metric | " + " | ".join(terms) + " |",
             "|---|---|" + "---|" * len(terms)]
    for name, m in data["models"].items():
        t = m["cost_terms"]
        lines.append(f"| {name} | {t['metric']} {t['teacher']:.3g} | " +
                     " | ".join(f"{100 * t[k]:.0f}%" for k in terms) + " |")
    return lines


def why_text(data: dict) -> list[str]:
    """Which cut buys the most on each target (the cost model's view), in words."""
    out = []
    for name, m in data["models"].items():
        t = m["cost_terms"]
        block = "attention" if t["one attention block"] > t["one FFN block"] else "FFN"
        width = ("query heads" if t["query heads halved"] > t["FFN widths halved"]
                 else "FFN width")
        out.append(f"- **{name}**: removing one {block} block saves the most per block "
                   f"({100 * max(t['one attention block'], t['one FFN block']):.0f}% of "
                   f"{t['metric']}); of the width cuts, halving {width} saves more; halving the "
                   f"hidden size saves {100 * t['hidden size halved']:.0f}%.")
    return out


def pareto_lines(data: dict) -> list[str]:
    lines = [f"Target `{data['target']}`, workload `{data['workload']}`, one search for "
             f"budgets {', '.join(f'{b:.0%}' for b in data['budgets'])} (the DNAS at the "
             "middle budget, every option scored once, one repair + measured loop per budget).",
             "", "| budget | params | held-out loss ± s.e. | MC ± s.e. | TPOT measured ± noise "
             "(pred) | limit | verify | on the front |", "|---|---|---|---|---|---|---|---|"]
    for m in data["members"]:
        s = m["scores"]
        lines.append(
            f"| {m['budget_fraction']:.0%} | {m['params']:,.0f} | "
            f"{_fmt(s['heldout_loss'], 4)} ± {_fmt(s['heldout_loss_stderr'], 2)} | "
            f"{_fmt(s['mc_mean'])} ± {_fmt(s['mc_mean_stderr'], 2)} | "
            f"{_fmt(m['measured']['tpot_ms'])} ± {_fmt(m['noise'].get('tpot_ms'), 2)} "
            f"({_fmt(m['predicted']['tpot_ms'])}) | {_fmt(m['limits'].get('max_tpot_ms'))} | "
            f"{'pass' if m['ok'] else 'FAIL'} | {'yes' if m['pareto'] else 'no'} |")
    family_search = search_seconds(data["family_steps"], ("family", "arch"))
    lines += ["", f"Family: {data['family_wall_s']:.0f} s wall for {len(data['budgets'])} "
              f"budgets, of which the search (one DNAS + scores + {len(data['budgets'])} "
              f"repairs and measured loops) {family_search:.0f} s."]
    one = data.get("one_by_one")
    if one:
        steps = [s for p in one["points"] for s in p["steps"]]
        searched = search_seconds(steps, ("arch",))
        per = searched / max(1, len(one["budgets"]))
        lines += [f"One by one (`flows/sweep.py`, one `compress` run per budget, budgets "
                  f"{', '.join(f'{b:.0%}' for b in one['budgets'])}): {one['wall_s']:.0f} s "
                  f"wall, of which the searches {searched:.0f} s ({per:.0f} s per budget, "
                  f"{per * len(data['budgets']):.0f} s for the family's "
                  f"{len(data['budgets'])} budgets at that rate). Both reuse the cached "
                  "teacher, corpus, cost model, gate, importance and teacher evaluation; "
                  "an identical architecture reuses prune/distill/verify from the cache."]
    return lines


def write_report(out_dir: Path) -> Path:
    """``targets.md`` (+ heatmaps, + the front's plot) from the JSON files in ``out_dir``."""
    from autocompress.atomic import atomic_path
    from autocompress.report import plot_heatmaps

    lines = ["# Each target gets its own architecture (issue 17)", "",
             "Regenerated by `python bench/targets.py report` from `targets.json` "
             "(`bench/targets.py matrix`) and `targets_pareto.json` (`bench/targets.py "
             "pareto`); nothing here is typed by hand.", ""]
    matrix_path = out_dir / "targets.json"
    if matrix_path.exists():
        data = json.loads(matrix_path.read_text())
        archs = [(name, m["arch_spec"]) for name, m in data["models"].items()]
        plot_heatmaps(archs, f"each target's own architecture at {data['budget_fraction']:.0%}",
                      out_dir / "targets_heatmaps.png")
        load = data["load_average"]
        lines += ["## The cross-target matrix", "",
                  f"Teacher `{data['teacher']}`; {data['created']}; {data['wall_s']:.0f} s wall; "
                  f"load average (1/5/15 min) before {_load(load['before'])}, after "
                  f"{_load(load['after'])}; eval limit {data['eval_limit']} items per task; "
                  f"options `{json.dumps(data['options'])}`.", "",
                  *matrix_tables(data), "", "### Does each target's own architecture win?", "",
                  *thesis_rows(data), "",
                  "![per-layer architectures](targets_heatmaps.png)", "",
                  "### Why they differ: what each cut saves (the target's cost model)", "",
                  *cost_term_rows(data), "", *why_text(data), ""]
    pareto_path = out_dir / "targets_pareto.json"
    if pareto_path.exists():
        data = json.loads(pareto_path.read_text())
        plot_front(data, out_dir / "targets_pareto.png")
        lines += ["## A Pareto family from one search", "",
                  f"{data['created']}; load average {_load_all(data['load_average'])}.", "",
                  *pareto_lines(data), "", "![front](targets_pareto.png)", ""]
    path = out_dir / "targets.md"
    with atomic_path(path) as tmp:
        Path(tmp).write_text("\n".join(lines))
    return path


def _load(values) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def _load_all(load: dict) -> str:
    return "; ".join(f"{k.replace('_', ' ')} {_load(v)}" for k, v in load.items())


def plot_front(data: dict, path: Path) -> Path:
    from autocompress.report import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    members = data["members"]
    for ax, key, label in ((axes[0], "heldout_loss", "held-out loss (lower is better)"),
                           (axes[1], "mc_mean", "MC mean (higher is better)")):
        xs = [m["measured"]["tpot_ms"] for m in members]
        ys = [m["scores"][key] for m in members]
        ax.errorbar(xs, ys, xerr=[m["noise"].get("tpot_ms", 0.0) for m in members], fmt="o-",
                    capsize=2, label="family (one search)")
        for m, x, y in zip(members, xs, ys, strict=True):
            ax.annotate(f"{m['budget_fraction']:.0%}", (x, y), fontsize=8,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"measured TPOT ms on {data['target']}")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("matrix", "pareto"):
        s = sub.add_parser(name)
        s.add_argument("--teacher", default="default")
        s.add_argument("--workload", default="interactive-cpu")
        s.add_argument("--eval-limit", type=int, default=50)
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--options", default=None, help="More per-stage settings as JSON, "
                       "merged over OPTIONS.")
        s.add_argument("--no-track", action="store_true")
        s.add_argument("--out", default=str(RESULTS))
    m = sub.choices["matrix"]
    m.add_argument("--targets", nargs="+", default=MEASURED)
    m.add_argument("--predicted", nargs="*", default=PREDICTED)
    m.add_argument("--predicted-workload", default="interactive")
    m.add_argument("--budget-fraction", type=float, default=0.5)
    f = sub.choices["pareto"]
    f.add_argument("--target", default="cpu-local/hf-eager/fp32")
    f.add_argument("--budgets", nargs="+", type=float, default=[0.7, 0.6, 0.5, 0.4, 0.3])
    f.add_argument("--one-by-one", nargs="*", type=float, default=[],
                   help="Budgets to also run one by one (compress per budget) for the time "
                   "comparison.")
    r = sub.add_parser("report")
    r.add_argument("--out", default=str(RESULTS))
    return p


def main(argv: list[str] | None = None) -> None:
    from autocompress.atomic import write_json_atomic

    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.command == "matrix":
        data = run_matrix(args)
        log(f"wrote {write_json_atomic(out / 'targets.json', data)}")
    elif args.command == "pareto":
        data = run_pareto(args)
        log(f"wrote {write_json_atomic(out / 'targets_pareto.json', data)}")
    report = write_report(out)
    log(f"wrote {report}")
    print(report.read_text())


if __name__ == "__main__":
    main()
