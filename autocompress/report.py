"""Comparison report: AutoCompress vs the matched Minitron baseline (issue 8).

Everything here reads the JSON written by ``bench/compare.py``
(``results/compare.json``) and nothing else, so the report, the plots and the
README table can always be regenerated from the numbers, never typed by hand.

- ``readme_table(data)``: the Markdown results table;
- ``replace_between_markers(text, table)``: put it between
  ``<!-- results:start -->`` and ``<!-- results:end -->`` (None if absent);
- ``write_report(data, out_dir)``: ``report.md`` + PNGs (accuracy vs measured
  TPOT / throughput / memory; per-layer architecture heatmaps; cost-model
  predicted vs measured for every final model).

Shape of ``data`` (see ``bench/compare.py``): ``teacher.scores``, ``teacher.arch``,
and ``runs[]`` with ``preset``, ``budget_fraction``, ``main_metric``, ``limits``,
``teacher_verify`` and ``methods.{autocompress,minitron}`` each holding ``arch``,
``params``, ``predicted``, ``measured``, ``noise``, ``verify_ok``, ``scores``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from autocompress.atomic import write_text_atomic
from autocompress.errors import AutoCompressError

START, END = "<!-- results:start -->", "<!-- results:end -->"
METHOD_LABELS = {"autocompress": "AutoCompress", "minitron": "Minitron"}
METHOD_COLORS = {"teacher": "black", "autocompress": "tab:red", "minitron": "tab:blue"}
PLOT_METRICS = (("tpot_ms", "measured TPOT (ms)"),
                ("throughput_tok_s", "measured throughput (tok/s)"),
                ("memory_gb", "measured memory (GB)"))
# The bar: AutoCompress should beat Minitron by >= 2 points of MC mean.
WIN_MARGIN = 0.02


def load_compare(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise AutoCompressError(f"{path} does not exist",
                                hint="run `autocompress bench compare` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AutoCompressError(f"{path} is not valid JSON ({err})",
                                hint="re-run `autocompress bench compare`") from None


# ------------------------------------------------------------------ table


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return format(value, fmt)


def _pm(value: Any, err: Any, fmt: str = ".3f") -> str:
    text = _num(value, fmt)
    return text if err is None or text == "—" else f"{text} ± {format(err, fmt)}"


def _limit_text(run: dict) -> str:
    parts = []
    for name, bound in run.get("limits", {}).items():
        sign = "≤" if name.startswith("max_") else "≥"
        parts.append(f"{name.removeprefix('max_').removeprefix('min_')} {sign} {bound:.3g}")
    return ", ".join(parts)


def table_rows(data: dict) -> list[dict[str, str]]:
    """One row per (preset, budget, method), teacher first; strings ready to print."""
    teacher = data.get("teacher", {})
    ts = teacher.get("scores", {})
    rows = [{"preset": "—", "budget": "100%", "limit": "—", "method": "teacher",
             "params": _num(teacher.get("params"), ","),
             "mc_mean": _pm(ts.get("mc_mean"), ts.get("mc_mean_stderr")),
             "loss": _num(ts.get("heldout_loss_fixed"), ".3f"),
             "main": "—", "memory": "—", "verify": "—"}]
    for run in data.get("runs", []):
        metric = run.get("main_metric", "tpot_ms")
        for method, m in run.get("methods", {}).items():
            s = m.get("scores", {})
            measured, noise = m.get("measured", {}), m.get("noise", {})
            rows.append({
                "preset": run["preset"], "budget": f"{run['budget_fraction']:.0%}",
                "limit": _limit_text(run), "method": METHOD_LABELS.get(method, method),
                "params": _num(m.get("params"), ","),
                "mc_mean": _pm(s.get("mc_mean"), s.get("mc_mean_stderr")),
                "loss": f"{_num(s.get('heldout_loss_pruned'), '.3f')} → "
                        f"{_num(s.get('heldout_loss_distilled'), '.3f')}",
                "main": f"{_pm(measured.get(metric), noise.get(metric), '.2f')} "
                        f"(pred {_num(m.get('predicted', {}).get(metric), '.2f')})",
                "memory": _num(measured.get("memory_gb"), ".4f"),
                "verify": "not run" if "verify_ok" not in m else "pass" if m["verify_ok"]
                          else "FAIL (" + ", ".join(m.get("violations", [])) + ")",
            })
        for method, reason in run.get("failed_methods", {}).items():
            rows.append({
                "preset": run["preset"], "budget": f"{run['budget_fraction']:.0%}",
                "limit": _limit_text(run), "method": METHOD_LABELS.get(method, method),
                "params": "—", "mc_mean": "—", "loss": "—", "main": "—", "memory": "—",
                "verify": "no architecture: " + reason.split(":")[0]})
    return rows


TABLE_COLUMNS = (("preset", "preset"), ("budget", "budget"), ("limit", "limit"),
                 ("method", "method"), ("params", "params"),
                 ("mc_mean", "MC mean ± s.e."),
                 ("loss", "held-out loss (pruned → distilled)"),
                 ("main", "measured main metric ± noise (pred)"),
                 ("memory", "measured memory GB"), ("verify", "verify on target"))


def readme_table(data: dict) -> str:
    """The Markdown results table (+ a one-line provenance note)."""
    lines = ["| " + " | ".join(title for _, title in TABLE_COLUMNS) + " |",
             "|" + "---|" * len(TABLE_COLUMNS)]
    for row in table_rows(data):
        lines.append("| " + " | ".join(row[key] for key, _ in TABLE_COLUMNS) + " |")
    settings = data.get("settings", {})
    note = (f"\n_Generated from `results/compare.json` ({data.get('created', '?')}; target "
            f"{data.get('target', '?')}; distillation {settings.get('distill_tokens', '?'):,} "
            f"tokens per model; " + (f"eval limit {settings['eval_limit']} items per task)._"
                                      if settings.get("eval_limit") else "full benchmark suite)._")
            if isinstance(settings.get("distill_tokens"), int) else "")
    if data.get("synthetic"):
        note += "\n_SYNTHETIC test data, not a measurement._"
    return "\n".join(lines) + "\n" + note + "\n"


def replace_between_markers(text: str, table: str) -> str | None:
    """``text`` with the part between the results markers replaced; None if absent."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0 or end < start:
        return None
    return text[: start + len(START)] + "\n" + table + text[end:]


def update_readme(readme: str | Path, data: dict) -> bool:
    """Rewrite the table in ``readme`` atomically; False (untouched) if no markers."""
    readme = Path(readme)
    new = replace_between_markers(readme.read_text(), readme_table(data))
    if new is None:
        return False
    write_text_atomic(readme, new)
    return True


# ------------------------------------------------------------------ analysis


def _diff(a: dict, b: dict, key: str) -> float | None:
    return None if a.get(key) is None or b.get(key) is None else a[key] - b[key]


def verdicts(data: dict) -> list[dict[str, Any]]:
    """Per run: MC-mean and loss deltas (AutoCompress − Minitron) and who wins."""
    out = []
    for run in data.get("runs", []):
        methods = run.get("methods", {})
        if "autocompress" not in methods or "minitron" not in methods:
            continue
        a, m = methods["autocompress"]["scores"], methods["minitron"]["scores"]
        delta = _diff(a, m, "mc_mean")

        se = math.hypot(a.get("mc_mean_stderr") or 0.0, m.get("mc_mean_stderr") or 0.0)
        out.append({
            "preset": run["preset"], "budget_fraction": run["budget_fraction"],
            "mc_delta": delta, "mc_delta_se": se,
            "loss_delta_pruned": _diff(a, m, "heldout_loss_pruned"),
            "loss_delta_distilled": _diff(a, m, "heldout_loss_distilled"),
            "meets_bar": delta is not None and delta >= WIN_MARGIN,
            "both_verified": bool(methods["autocompress"].get("verify_ok")
                                  and methods["minitron"].get("verify_ok")),
        })
    return out


def compute_seconds(data: dict) -> float:
    """Seconds of search, distillation and evaluation behind ``data``, as each stage
    recorded them when it ran (so a resumed comparison still counts its cached stages)."""
    total = data.get("teacher", {}).get("scores", {}).get("seconds") or 0.0
    for run in data.get("runs", []):
        for m in run.get("methods", {}).values():
            search = m.get("search_seconds")
            total += (search.get("total", 0.0) if isinstance(search, dict)
                      else search or 0.0)
            total += (m.get("distill") or {}).get("seconds") or 0.0
            total += m.get("scores", {}).get("seconds") or 0.0
    return total


def analysis_text(data: dict) -> list[str]:
    lines = []
    for run in data.get("runs", []):
        for method, reason in run.get("failed_methods", {}).items():
            others = [METHOD_LABELS.get(k, k) for k in run.get("methods", {})]
            lines.append(
                f"- **{run['preset']} @ {run['budget_fraction']:.0%}**: "
                f"{METHOD_LABELS.get(method, method)} found no architecture ({reason})"
                + (f"; {', '.join(others)} did." if others else "."))
    for v in verdicts(data):
        head = f"- **{v['preset']} @ {v['budget_fraction']:.0%}**: "
        if v["mc_delta"] is None:
            loss = v["loss_delta_pruned"]
            lines.append(head + "benchmark scores missing (run stopped before evaluation)"
                         + ("" if loss is None else f"; held-out loss Δ after pruning "
                            f"(AutoCompress − Minitron) {loss:+.3f}, negative = AutoCompress "
                            "better") + ".")
            continue
        pts = 100 * v["mc_delta"]
        who = "AutoCompress ahead" if pts > 0 else ("tie" if pts == 0 else "Minitron ahead")
        bar = "meets" if v["meets_bar"] else "does NOT meet"
        noise = ("within" if abs(v["mc_delta"]) <= 2 * v["mc_delta_se"] else "outside")
        lines.append(
            head + f"MC mean Δ = {pts:+.1f} points ({who}; ±{100 * v['mc_delta_se']:.1f} s.e., "
            f"{noise} 2 s.e.), so it {bar} the ≥ 2-point bar. Held-out loss Δ "
            f"(AutoCompress − Minitron): {_num(v['loss_delta_pruned'], '+.3f')} after pruning, "
            f"{_num(v['loss_delta_distilled'], '+.3f')} after distillation (negative = "
            f"AutoCompress better). Both verified on target: "
            f"{'yes' if v['both_verified'] else 'no'}.")
    return lines


# ------------------------------------------------------------------ plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _teacher_points(run: dict) -> dict | None:
    tv = run.get("teacher_verify")
    return tv.get("measured") if tv else None


def plot_accuracy_vs_cost(data: dict, path: Path) -> Path:
    """MC mean vs measured TPOT / throughput / memory: teacher, Minitron, AutoCompress."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PLOT_METRICS), figsize=(5 * len(PLOT_METRICS), 4))
    teacher_mc = data.get("teacher", {}).get("scores", {}).get("mc_mean")
    markers = "osD^v<>"
    presets = sorted({r["preset"] for r in data.get("runs", [])})
    for ax, (metric, label) in zip(axes, PLOT_METRICS, strict=True):
        for run in data.get("runs", []):
            mk = markers[presets.index(run["preset"]) % len(markers)]
            tmeas = _teacher_points(run)
            if tmeas and teacher_mc is not None:
                ax.scatter(tmeas[metric], teacher_mc, color=METHOD_COLORS["teacher"], marker=mk)
            for method, m in run.get("methods", {}).items():
                if "measured" not in m or m["scores"].get("mc_mean") is None:
                    continue  # not verified or not evaluated yet: no point to draw
                x = m["measured"].get(metric)
                y = m["scores"].get("mc_mean")
                err = m["noise"].get(metric, 0.0)
                ax.errorbar(x, y, xerr=err, yerr=m["scores"].get("mc_mean_stderr") or 0.0,
                            fmt=mk, color=METHOD_COLORS.get(method, "gray"),
                            mfc="none" if not m.get("verify_ok") else None, capsize=2)
                ax.annotate(f"{run['budget_fraction']:.0%}", (x, y), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("MC mean (benchmark suite)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=n.capitalize() if
                          n == "teacher" else METHOD_LABELS[n])
               for n, c in METHOD_COLORS.items()]
    handles += [plt.Line2D([], [], color="gray", marker=markers[i % len(markers)], ls="",
                           label=p) for i, p in enumerate(presets)]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def arch_matrix(arch: dict) -> dict[str, list[int]]:
    """Per-layer heads, KV groups and FFN width (0 = block removed)."""
    heads, kv, ffn = [], [], []
    for layer in arch["layers"]:
        att, mlp = layer.get("attention"), layer.get("ffn")
        heads.append(att["num_heads"] if att else 0)
        kv.append(att["num_kv_heads"] if att else 0)
        ffn.append(mlp["intermediate_size"] if mlp else 0)
    return {"query heads": heads, "KV groups": kv, "FFN width": ffn}


def plot_arch_heatmaps(run: dict, teacher_arch: dict | None, path: Path) -> Path:
    """One panel per quantity; rows = teacher / methods, columns = layers."""
    import numpy as np

    plt = _pyplot()
    archs = ([("teacher", teacher_arch)] if teacher_arch else []) + [
        (METHOD_LABELS.get(k, k), m["arch"]) for k, m in run.get("methods", {}).items()]
    mats = [(name, arch_matrix(a), a["hidden_size"]) for name, a in archs]
    quantities = list(mats[0][1])
    fig, axes = plt.subplots(len(quantities), 1, figsize=(8, 1.2 + 1.1 * len(mats) *
                                                           len(quantities)))
    width = max(len(m[quantities[0]]) for _, m, _ in mats)
    for ax, q in zip(axes, quantities, strict=True):
        # Models may differ in depth (Minitron drops whole layers): pad with masked cells.
        grid = np.ma.masked_less([m[q] + [-1] * (width - len(m[q])) for _, m, _ in mats], 0)
        vmax = int(grid.max()) or 1
        ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, aspect="auto")
        for i, row in enumerate(grid.filled(-1).tolist()):
            for j, value in enumerate(row):
                text = "" if value < 0 else (str(value) if value else "–")
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if value < 0.6 * vmax else "black")
        ax.set_yticks(range(len(mats)), [f"{n} (h{h})" for n, _, h in mats], fontsize=8)
        ax.set_xticks(range(width), [str(i) for i in range(width)], fontsize=7)
        ax.set_title(q, fontsize=9)
    axes[-1].set_xlabel("layer of the model (– = block removed, blank = no such layer)")
    fig.suptitle(f"{run['preset']} @ {run['budget_fraction']:.0%} ({_limit_text(run)})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_predicted_vs_measured(data: dict, path: Path) -> Path:
    """Cost-model prediction vs measurement for every final model (and the teacher)."""
    plt = _pyplot()
    metrics = (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("memory_gb", "memory GB"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4))
    for ax, (metric, label) in zip(axes, metrics, strict=True):
        values = []
        for run in data.get("runs", []):
            points = [("teacher", run.get("teacher_verify") or {})]
            points += [(k, {"predicted": m["predicted"], "measured": m.get("measured"),
                            "noise": m.get("noise", {})})
                       for k, m in run.get("methods", {}).items()]
            for who, p in points:
                if not p.get("predicted") or not p.get("measured"):
                    continue
                x, y = p["predicted"][metric], p["measured"][metric]
                values += [x, y]
                ax.errorbar(x, y, yerr=p.get("noise", {}).get(metric, 0.0), fmt="o",
                            color=METHOD_COLORS.get(who, "gray"), capsize=2)
        if values:
            lo, hi = min(values), max(values)
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
        ax.set_xlabel(f"predicted {label}")
        ax.set_ylabel(f"measured {label}")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=n)
               for n, c in METHOD_COLORS.items()]
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ report


def prediction_rows(data: dict) -> list[str]:
    lines = ["| preset | budget | model | metric | predicted | measured ± noise | error |",
             "|---|---|---|---|---|---|---|"]
    for run in data.get("runs", []):
        points = [("teacher", run.get("teacher_verify") or {})]
        points += [(METHOD_LABELS.get(k, k), m) for k, m in run.get("methods", {}).items()]
        for who, p in points:
            if not p.get("predicted") or not p.get("measured"):
                continue
            for metric in ("ttft_ms", "tpot_ms", "memory_gb"):
                pred, meas = p["predicted"][metric], p["measured"][metric]
                err = (pred - meas) / meas if meas else float("nan")
                lines.append(f"| {run['preset']} | {run['budget_fraction']:.0%} | {who} | "
                             f"{metric} | {pred:.4g} | {meas:.4g} ± "
                             f"{p['noise'].get(metric, 0.0):.2g} | {err:+.0%} |")
    return lines


def write_report(data: dict, out_dir: str | Path) -> Path:
    """Write ``report.md`` and its PNGs into ``out_dir``; returns the report path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = data.get("runs", [])
    lines = ["# AutoCompress vs matched Minitron", ""]
    if data.get("synthetic"):
        lines += ["**SYNTHETIC DATA (test fixture) — not a measurement.**", ""]
    s = data.get("settings", {})
    limit = s.get("eval_limit")
    lines += [f"Target `{data.get('target')}`; teacher `{data.get('teacher', {}).get('dir')}`; "
              f"created {data.get('created')}; wall time of the last invocation "
              f"{data.get('wall_s', 0):.0f} s (stages cached by earlier ones are not in it); "
              f"search + distillation + evaluation of every model, cached or not: "
              f"{compute_seconds(data):.0f} s.",
              f"Same importance, calibration/training data, seeds (seed {s.get('seed')}) and "
              f"distillation budget ({s.get('distill_tokens')} tokens) for both methods; "
              + (f"benchmark items capped at {limit} per task; " if limit else
                 "the full benchmark suite; ") +
              f"search steps {s.get('search_steps')}.", "", "## Results", "",
              readme_table(data), "## Verdict (tighter budgets are what the issue asks about)",
              ""]
    lines += analysis_text(data) or ["- no run has both methods yet."]
    if data.get("not_run"):
        lines += ["", "Not run:"] + [f"- {n['preset']} @ {n['budget_fraction']:.0%}: "
                                     f"{n['reason']}" for n in data["not_run"]]
    if runs:
        lines += ["", "## Accuracy vs measured cost", "",
                  "Hollow markers = failed verification on the target; error bars = "
                  "measurement noise (x) and benchmark standard error (y).", "",
                  f"![accuracy vs cost]({plot_accuracy_vs_cost(data, out_dir / 'accuracy_vs_cost.png').name})",  # noqa: E501
                  "", "## Architectures per layer", ""]
        for run in runs:
            name = f"arch_{run['preset']}_{round(100 * run['budget_fraction'])}.png"
            plot_arch_heatmaps(run, data.get("teacher", {}).get("arch"), out_dir / name)
            lines += [f"![{run['preset']} architecture]({name})", ""]
        png = plot_predicted_vs_measured(data, out_dir / "predicted_vs_measured.png")
        lines += ["## Cost model: predicted vs measured", "", f"![predicted vs measured]"
                  f"({png.name})", ""] + prediction_rows(data)
    return write_text_atomic(out_dir / "report.md", "\n".join(lines) + "\n")
