"""Does each target get its own architecture, and does it matter? Measured (issue 52).

``matrix``: the ``targets-matrix`` flow (``flows/targets.py``) over columns (a target, the
workload it serves, ``PRESET:METRIC`` for a budget on another metric, and a budget as a
fraction of the teacher's predicted cost there): each column's own architecture and, on
measured columns, the homogeneous one of the same parameter count; each distilled once per
seed and evaluated with per-window and per-item scores; every one verified on every
measured column and predicted on the GPU ones (spec-sheet cost models, never counted).
Writes ``results/targets.json``, ``results/targets.md`` (the tables, the paired verdict of
each column, the params-matched misses, what each column pays for) and
``results/targets_heatmaps.png``.

``pareto``: the ``pareto`` flow (one search, ``--budgets``) for one target, then, for the
time comparison, the search of a family of the ``--one-by-one`` budgets against those
budgets searched one by one (``time_searches``). Writes ``results/targets_pareto.json``
and ``results/targets_pareto.png``; ``report`` adds it to ``results/targets.md``.

``joint``: the ``compress-joint`` flow (``autocompress run --target A --target B ...``) for
the matrix's measured targets: one architecture within every target's limit, verified on
each, against each target's own (``results/targets_joint.json``).

``report``: rewrite ``results/targets.md`` from the JSON files.

    python -m bench.targets matrix      # the defaults below are what results/ holds
    python -m bench.targets joint       # one architecture for the matrix's measured targets
    python -m bench.targets pareto --one-by-one 0.3 0.5 0.7
    python -m bench.targets report

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

from autocompress.hardware import cpu_flags
from autocompress.vllm_engine import engine_available, unavailable_reason
from bench.report import _pyplot, plot_heatmaps

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# The matrix's columns (``TARGET@WORKLOAD=FRACTION``), chosen so that each pays for a
# different term of the cost model (``results/targets.md`` shows each term's share):
# llama.cpp q4_0 decode at batch 1 (quantized weight bytes and per-head attention work),
# hf-eager fp32 decode at batch 1 (a fixed cost per block: width buys little, depth a lot),
# a long prompt's prefill on hf-eager (the matmuls' FLOPs and attention's quadratic term),
# and llama.cpp's memory for 6 concurrent sequences (the compute buffer, sized by the
# widest block, and the KV cache: FFN width and KV heads).
MEASURED = ["cpu-local/llama.cpp/q4_0@interactive-cpu=0.5",
            "cpu-local/hf-eager/fp32@interactive-cpu=0.5",
            "cpu-local/hf-eager/fp32@local-coding-cpu:ttft_ms=0.5",
            "cpu-local/llama.cpp/q4_0@datacenter-cpu:memory_gb=0.5"]
# hf-eager in bf16 joins the measured columns only where this CPU runs bf16 natively.
BF16 = "cpu-local/hf-eager/bf16@interactive-cpu=0.5"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# vLLM's columns, where its environment is installed (issue 61; lab/plans/targets-vllm.md):
# batch-1 decode and 6 concurrent sequences, the cost structure where vLLM differs most
# (its scheduler's fixed cost per step). 70%, not 50%: on 30 held-out architectures of the
# teacher's class its TPOT spans 1.24-2.31 ms at interactive-cpu, so half the teacher's
# is the very smallest of them. bf16 only where the CPU runs it natively, as for hf-eager.
VLLM = ["cpu-local/vllm/{dtype}@interactive-cpu=0.7", "cpu-local/vllm/{dtype}@datacenter-cpu=0.7"]
# Spec-sheet columns, predicted only and never counted for the thesis. The 7M teacher is
# mostly fixed per-token overhead on a GPU (the smallest reachable is 84% of its TPOT on
# the RTX 5070 with vLLM, 87% on the H100 with TensorRT-LLM), so their budget is 90%.
PREDICTED = ["rtx-5070/vllm/bf16@interactive=0.9", "h100-sxm/trtllm/bf16@interactive=0.9"]
JOINT = ["cpu-local/hf-eager/fp32", "cpu-local/llama.cpp/f32", "cpu-local/llama.cpp/q4_0"]
SEEDS = [0, 1]  # distillation seeds per architecture: training noise inside the intervals
# Targets the issue names that the matrix leaves out, and why (``absent_targets``).
LLAMACPP_THREADS = (
    "the flows take a target as `hardware/engine/dtype`, which carries no thread count "
    "(`Target.threads` and `costmodel fit|validate --threads` exist in the library, but the "
    "`run`/matrix flows time llama.cpp at 1 thread); on these 2 shared cores a 2-thread "
    "timing is wall-clock and measures the other sessions' load as much as the engine")
# Small budgets, sized so the whole matrix and family fit ~25 min of 2 shared cores with
# the bundled 7M teacher; results/targets.md repeats them.
OPTIONS: dict[str, dict[str, Any]] = {
    "costmodel": {"n_probes": 10, "repeats": 2},
    "validation": {"n": 4, "repeats": 2, "max_mape": 60.0, "min_kendall_tau": None},
    # The final pick (every search here: each target's own, the joint one, the family's)
    # short-lists 4 candidates and gives each 8k tokens of short distillation (8 steps of
    # 8x128), not the defaults' 10 x 32k: ~10 s a candidate instead of ~25 on 2 cores.
    "search": {"dnas": {"steps": 30, "batch_size": 4, "teacher_cache": 8},
               "measured_rounds": 2, "measured_repeats": 5,
               "selection": {"top_k": 4}, "minitron": {"distill_tokens": 8192}},
    # bf16 off: this AVX2 CPU emulates it (the distillation's own probe says so, and costs).
    "distill": {"tokens": 32768, "batch_size": 8, "seq_len": 256, "eval_batches": 2,
                "ckpt_every": 10, "bf16": False, "warmup_steps": 2},
    "verify": {"repeats": 3},
}


def native_bf16(flags: set[str]) -> list[str]:
    """The bf16 instructions among ``flags`` (none: torch emulates bf16 matmuls in fp32)."""
    return sorted(flags & set(BF16_FLAGS))


def vllm_columns(flags: set[str], installed: bool) -> list[str]:
    """The matrix's vLLM columns on a CPU with ``flags`` (none where vLLM is not installed)."""
    dtype = "bf16" if native_bf16(flags) else "fp32"
    return [column.format(dtype=dtype) for column in VLLM] if installed else []


def absent_targets(flags: set[str], vllm_absent: str | None = None) -> dict[str, str]:
    """Targets of the issue the matrix does not measure here, each with its reason
    (``vllm_absent``: why vLLM is not installed, where it is not)."""
    import torch

    absent = {"cpu-local/llama.cpp (2 threads)": LLAMACPP_THREADS}
    if vllm_absent:
        absent["cpu-local/vllm"] = vllm_absent
    if not native_bf16(flags):
        absent[BF16.split("@")[0]] = (
            f"this CPU has none of {', '.join(BF16_FLAGS)} in /proc/cpuinfo (torch's CPU kernels: "
            f"{torch.backends.cpu.get_cpu_capability()}): bf16 is emulated, so timing it would "
            "measure the emulation, not a bf16 deployment")
    return absent


def default_columns(flags: set[str], vllm: bool = False) -> list[str]:
    """The matrix's columns on a CPU with ``flags``; ``vllm``: its environment is installed."""
    return (MEASURED + ([BF16] if native_bf16(flags) else []) + vllm_columns(flags, vllm)
            + PREDICTED)


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
    """``OPTIONS`` with ``--options`` over them, stage by stage, checked."""
    from autocompress.stage_config import check_options, parse_options

    extra = parse_options(args.options)
    return check_options({stage: {**OPTIONS.get(stage, {}), **extra.get(stage, {})}
                          for stage in {*OPTIONS, *extra}})


# ------------------------------------------------------------------ matrix


def run_matrix(args) -> dict:
    _prepare()
    from flows.targets import Column, targets_matrix

    load = {"before": os.getloadavg()}
    started = time.perf_counter()
    data = targets_matrix(teacher=args.teacher, columns=[Column.parse(c) for c in args.columns],
                          seeds=args.seeds, params_matched=not args.no_params_matched,
                          eval_limit=args.eval_limit, eval_tasks=args.eval_tasks,
                          options=_options(args), seed=args.seed, track=not args.no_track)
    load["after"] = os.getloadavg()
    data = enrich_matrix(data, args, load, time.perf_counter() - started)
    flags = cpu_flags()
    data.update(native_bf16=native_bf16(flags), absent=absent_targets(flags, unavailable_reason()))
    return data


def _stamp(load: dict, options: dict, args) -> dict:
    """When, on what machine (CPU, torch's kernels, cores, threads: machines here differ),
    under what load and with which options a result was measured."""
    from autocompress.hardware import machine_summary

    return {"load_average": load, "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine_summary(), "options": options, "eval_limit": args.eval_limit}


def enrich_matrix(data: dict, args, load: dict, wall_s: float) -> dict:
    """The flow's matrix plus what the report reads: architectures, per-item scores, the
    columns' cost terms and gates."""
    data["teacher"] = args.teacher
    for column in data["columns"]:
        column["cost_terms"] = cost_terms(column["costmodel"], column["workload"], args.teacher)
        column["validation_mape"] = _json(column["validation"]).get("mape")
    for row in data["rows"].values():
        row["arch_spec"] = _arch(row["arch"])
        evaluations = {seed: _json(ref) for seed, ref in row["evaluations"].items()}
        row["evaluation_report"] = {seed: _summary(e) for seed, e in evaluations.items()}
        row["per_item"] = {seed: e.get("per_item") or {} for seed, e in evaluations.items()}
    data["thesis"] = thesis(data)
    data["thesis_count"] = thesis_count(data["thesis"])
    data.update(wall_s=wall_s, **_stamp(load, _options(args), args))
    return data


def _summary(evaluation: dict) -> dict:
    keys = ("mc_mean", "mc_mean_stderr", "heldout_loss", "heldout_loss_stderr",
            "bits_per_byte", "next_token_acc")
    return {k: evaluation.get(k) for k in keys}


def cost_terms(costmodel_ref: dict, workload: str, teacher_name: str) -> dict[str, float]:
    """What each kind of cut saves on a column, as a share of the teacher's main metric
    there: one attention block, one FFN block (a middle layer), all FFN widths, query heads
    or KV heads halved, every other attention block removed, the hidden size halved (the
    column's cost model's own predictions)."""
    from transformers import AutoConfig

    from autocompress.artifacts import ArtifactRef, fetch
    from autocompress.costmodel import CostModel, get_workload
    from autocompress.model_source import resolve_model_dir
    from autocompress.modeling import arch_spec_of

    cm = CostModel.load(fetch(ArtifactRef.model_validate(costmodel_ref)))
    wl = get_workload(workload)
    spec = arch_spec_of(AutoConfig.from_pretrained(resolve_model_dir(teacher_name or "default")))
    metric = wl.main_metric
    base = cm.predict(spec, wl).metrics()[metric]
    middle = spec.num_layers // 2

    def cut(layer_fn=lambda i, layer: layer, hidden: int | None = None) -> float:
        """1 − cost of the teacher with ``layer_fn`` applied to each layer / its own cost."""
        layers = [layer_fn(i, layer) for i, layer in enumerate(spec.layers)]
        variant = spec.model_copy(update={"layers": layers,
                                          "hidden_size": hidden or spec.hidden_size})
        return 1.0 - cm.predict(variant, wl).metrics()[metric] / base

    def drop(kind):
        return lambda i, layer: layer.model_copy(update={kind: None}) if i == middle else layer

    def halve_ffn(i, layer):
        width = layer.ffn.intermediate_size // 2
        return layer.model_copy(update={"ffn": layer.ffn.model_copy(
            update={"intermediate_size": width})})

    def halve(field):
        def fn(i, layer):
            value = max(1, getattr(layer.attention, field) // 2)
            return layer.model_copy(update={"attention": layer.attention.model_copy(
                update={field: value})})
        return fn

    def every_other_attention(i, layer):
        return layer.model_copy(update={"attention": None}) if i % 2 else layer

    return {"metric": metric, "teacher": base, "one attention block": cut(drop("attention")),
            "one FFN block": cut(drop("ffn")), "FFN widths halved": cut(halve_ffn),
            "query heads halved": cut(halve("num_heads")),
            "KV heads halved": cut(halve("num_kv_heads")),
            "half the attention blocks": cut(every_other_attention),
            "hidden size halved": cut(hidden=spec.hidden_size // 2)}


# ------------------------------------------------------------------ one search, many targets


def run_joint(args) -> dict:
    _prepare()
    from flows.targets import compress_joint, target_label

    load = {"before": os.getloadavg()}
    started = time.perf_counter()
    report = compress_joint(teacher=args.teacher, targets=args.targets, workload=args.workload,
                            budget_fraction=args.budget_fraction, eval_limit=args.eval_limit,
                            eval_tasks=args.eval_tasks,
                            options=_options(args), seed=args.seed, track=not args.no_track)
    load["after"] = os.getloadavg()
    out = report.outputs
    search = _search_json(out["arch"])
    verifications = {}
    for target in args.targets:
        v = _json(out[f"verification.{target_label(target)}"].model_dump(mode="json"))
        verifications[target] = {k: v[k] for k in ("measured", "noise", "predicted", "limits",
                                                   "ok")}
    return {"targets": args.targets, "workload": args.workload,
            "budget_fraction": args.budget_fraction, "params": search["params"],
            "arch_spec": search["arch"], "search": {k: search[k] for k in (
                "budgets", "targets", "final_lambda", "measured_rounds", "seconds")},
            "selection": _selection(search),
            "scores": _summary(_json(out["evaluation"].model_dump(mode="json"))),
            "verifications": verifications, "wall_s": time.perf_counter() - started,
            "steps": [s.model_dump() for s in report.steps],
            **_stamp(load, _options(args), args)}


def _selection(search: dict) -> list[dict]:
    """The final pick's short list of a search report (each candidate's KL after the short
    distillation; ``chosen`` marks the winner)."""
    keys = ("origin", "layers", "params", "pruned_kl", "kl", "chosen")
    return [{k: c.get(k) for k in keys} for c in search.get("selection") or []]


def _search_json(ref) -> dict:
    from autocompress.artifacts import fetch

    return json.loads((fetch(ref) / "arch.search.json").read_text())


# ------------------------------------------------------------------ Pareto family


def run_pareto(args) -> dict:
    _prepare()
    from flows.sweep import SweepPoint
    from flows.targets import budget_label, pareto

    options = _options(args)
    load = {"before": os.getloadavg()}
    t0 = time.perf_counter()
    family = pareto(teacher=args.teacher, target=args.target, workload=args.workload,
                    budgets=args.budgets, eval_limit=args.eval_limit,
                    eval_tasks=args.eval_tasks, options=options,
                    seed=args.seed, track=not args.no_track)
    family_wall = time.perf_counter() - t0
    load["after_family"] = os.getloadavg()
    points = []
    for fraction in args.budgets:
        label = budget_label(fraction)
        out = family.outputs
        evaluation, verification = out[f"evaluation.{label}"], out[f"verification.{label}"]
        points.append(SweepPoint(  # the front is ranked from the members (``on_front``)
            label=label, overrides={"budget_fraction": fraction},
            outputs={"arch": out[f"arch.{label}"], "evaluation": evaluation,
                     "verification": verification}))
    members = [_member(p, fraction) for p, fraction in zip(points, args.budgets, strict=True)]
    for member, front in zip(members, on_front(members), strict=True):
        member["pareto"] = front
    data = {"target": args.target, "workload": args.workload, "budgets": args.budgets,
            "members": members, "family_wall_s": family_wall,
            "family_steps": [s.model_dump() for s in family.steps]}
    if args.one_by_one:
        data["search_times"] = time_searches(family, args, options)
        load["after_search_times"] = os.getloadavg()
    data.update(_stamp(load, options, args))
    return data


def _member(point, fraction: float) -> dict:
    verification = _json(point.outputs["verification"].model_dump(mode="json"))
    evaluation = _json(point.outputs["evaluation"].model_dump(mode="json"))
    arch = point.outputs["arch"]
    return {"label": point.label, "budget_fraction": fraction,
            "params": arch.metrics.get("params"), "scores": _summary(evaluation),
            "measured": verification["measured"], "noise": verification["noise"],
            "predicted": verification["predicted"], "limits": verification["limits"],
            "ok": verification["ok"],
            "arch_spec": _arch(arch.model_dump(mode="json")),
            "selection": _selection(_search_json(arch))}


def time_searches(family, args, options: dict) -> dict:
    """The family's search against the same budgets searched one by one, back to back in
    one process on one ``SearchContext`` (the teacher, importance, cost model and corpus of
    the family's flow run): only the search differs between the two ways, prune, distill,
    evaluate and verify are the same work per budget."""
    from autocompress.arch_search.family import run_family
    from autocompress.arch_search.run import SearchConfig, SearchContext, run_search
    from autocompress.artifacts import fetch
    from autocompress.costmodel import CostModel
    from flows.compress import seeded
    from flows.targets import budget_label, target_label

    missing = [f for f in args.one_by_one if f not in args.budgets]
    if missing or len(args.one_by_one) < 2:
        raise SystemExit(f"--one-by-one needs two or more of --budgets ({missing} are not)")
    out = family.outputs
    config = SearchConfig.model_validate(seeded(options, args.seed)["search"])
    ctx = SearchContext.build(
        str(fetch(out["teacher"])), args.target, args.workload, config=config,
        importance=fetch(out["importance"]), progress=False,
        cost_model=CostModel.load(fetch(out[f"costmodel.{target_label(args.target)}"])))
    limits = [out[f"limits.{budget_label(f)}"] for f in args.one_by_one]
    t0 = time.perf_counter()
    members = run_family(ctx, limits, config)
    family_s = time.perf_counter() - t0
    singles = []
    for fraction, own in zip(args.one_by_one, limits, strict=True):
        t1 = time.perf_counter()
        outcome = run_search(ctx, own, config, progress=False)
        singles.append({"budget_fraction": fraction, "seconds": time.perf_counter() - t1,
                        "params": outcome.spec.num_params(),
                        "measured_rounds": len(outcome.measured_rounds)})
    return {"budgets": args.one_by_one, "family_s": family_s,
            "family_shared_s": members[0].seconds["shared"],
            "family_params": [m.spec.num_params() for m in members],
            "family_measured_rounds": [len(m.measured_rounds) for m in members],
            "one_by_one": singles, "one_by_one_s": sum(s["seconds"] for s in singles)}


def search_seconds(steps: list[dict], names: tuple[str, ...]) -> float:
    """Seconds the flow spent in steps whose name starts with one of ``names`` (not cached)."""
    return sum(s["seconds"] for s in steps
               if s["state"] != "Cached" and s["name"].split(".")[0] in names)


# ------------------------------------------------------------------ report


def _count(value) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def _short(label: str) -> str:
    """``llama.cpp-q4_0.datacenter-cpu-memory_gb.params`` -> a readable row or column name."""
    return label.replace(".params", " (params-matched)")


def matrix_tables(data: dict) -> list[str]:
    """The columns, the rows (architectures, scores over seeds) and the cells."""
    seeds = data["seeds"]
    lines = ["**Columns** (budget: a fraction of the teacher's predicted main metric; each "
             "column's dominant cost from its cost model, see below)", "",
             "| column | target | workload | limit | dominant cut (share of the teacher's "
             "cost it saves) | cost-model gate MAPE |", "|---|---|---|---|---|---|"]
    for c in data["columns"]:
        gate = c.get("validation_mape") or {}
        lines.append(
            f"| {c['label']} | {c['target']} | {c['workload']} | {_limit_text(c['limits'])} "
            f"({c['budget_fraction']:.0%}) | {dominant_text(c['cost_terms'])} | "
            f"{', '.join(f'{k} {v:.1f}%' for k, v in gate.items()) or 'predicted only'} |")
    lines += ["", f"**Rows** (each architecture distilled with seeds {seeds}; held-out loss "
              "(lower is better) and MC (multiple-choice mean over the local tasks): mean over "
              "seeds, ± half the seeds' range)", "",
              "| architecture | kind | params | hidden | attention / FFN blocks | held-out loss "
              "| MC |", "|---|---|---|---|---|---|---|"]
    for name, row in data["rows"].items():
        spec = row["arch_spec"]
        attn = sum(1 for layer in spec["layers"] if layer.get("attention"))
        ffn = sum(1 for layer in spec["layers"] if layer.get("ffn"))
        lines.append(f"| {_short(name)} | {row['kind']} | {_count(row['params'])} | "
                     f"{spec['hidden_size']} | {attn} / {ffn} | "
                     f"{_over_seeds(row, 'heldout_loss', 4)} | {_over_seeds(row, 'mc_mean')} |")
    for measured in (True, False):
        columns = [c for c in data["columns"] if c["measured"] == measured]
        if not columns:
            continue
        title = ("**Measured** on this CPU (`verify` of seed "
                 f"{seeds[0]}'s model: median ± noise (predicted), ✓ = within the limit)"
                 if measured else "**Predicted** (spec-sheet cost models; nothing here was "
                 "measured, and these columns never count for the thesis)")
        lines += ["", title, "", "| architecture ↓ / column → | " +
                  " | ".join(c["label"] for c in columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for name in data["rows"]:
            lines.append("| " + " | ".join([_short(name)] + [
                _cell_text(_cell(data, name, c["label"]), c) for c in columns]) + " |")
        lines += _refusals(data, columns)
    return lines


def _refusals(data: dict, columns: list[dict]) -> list[str]:
    """One line per refused cell: the rule its column's engine would break."""
    labels = {c["label"] for c in columns}
    refused = [c for c in data["cells"] if c.get("refused") and c["target"] in labels]
    if not refused:
        return []
    return ["", "Refused (the column's engine cannot serve the architecture exactly, so it "
            "was not timed and is not within the limit):", ""] + [
        f"- {_short(c['arch'])} on {c['target']}: {c['refused']}" for c in refused]


def _over_seeds(row: dict, key: str, digits: int = 3) -> str:
    values = [s[key] for s in row["evaluation_report"].values() if s.get(key) is not None]
    if not values:
        return "–"
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def _cell(data: dict, row: str, column: str) -> dict:
    return next(c for c in data["cells"] if c["arch"] == row and c["target"] == column)


def _limit_text(limits: dict) -> str:
    return ", ".join(f"{k.removeprefix('max_')} ≤ {v:.3g}" for k, v in limits.items()) or "–"


def _cell_text(cell: dict, column: dict) -> str:
    metric = column["metric"]
    if cell.get("refused"):  # the engine cannot serve it exactly: never timed
        return "refused"
    mark = "✓" if cell["ok"] else "✗"
    if cell["measured"]:
        value, noise = cell["costs"].get(metric), cell["noise"].get(metric, 0.0)
        return f"{mark} {_fmt(value)} ± {_fmt(noise, 2)} (pred {_fmt(cell['predicted'][metric])})"
    return f"{mark} {_fmt(cell['predicted'].get(metric))}"


def _runs(row: dict, tasks: list[str] | None) -> list[dict]:
    """A row's per-item scores, one mapping per seed (in seed order), restricted to
    ``tasks`` (None: the multiple-choice tasks, every task but the held-out windows)."""
    runs = []
    for seed in sorted(row["per_item"], key=int):
        items = row["per_item"][seed]
        keep = tasks or [t for t in items if t != "heldout_loss"]
        runs.append({t: items[t] for t in keep if t in items})
    return runs


def paired(data: dict, a: str, b: str, metric: str) -> dict | None:
    """A − B (rows) on held-out loss per window or MC per item, seed s of A paired with
    seed s of B (same data order), 95% percentile bootstrap (``bench.stats``)."""
    from bench.stats import OVERALL, paired_differences

    tasks = ["heldout_loss"] if metric == "heldout_loss" else None
    runs_a, runs_b = _runs(data["rows"][a], tasks), _runs(data["rows"][b], tasks)
    if not all(runs_a + runs_b):
        return None
    diff = paired_differences(runs_a, runs_b, tasks, n_boot=2000, seed=0, paired_seeds=True)
    return diff[OVERALL].model_dump()


def verdict(loss_diff: dict) -> str:
    """One rule whichever row wins (own − other on held-out loss; lower is better): the
    own row holds when the whole interval is below zero, is reversed when the whole
    interval is above zero, and ties otherwise."""
    if loss_diff["high"] < 0:
        return "holds"
    if loss_diff["low"] > 0:
        return "reversed"
    return "tie"


def thesis(data: dict) -> list[dict]:
    """Per column: the rows within its limit, its own row against the most accurate other
    row within the limit (paired, loss and MC), and the verdict."""
    out = []
    for column in data["columns"]:
        label = column["label"]
        if label not in data["rows"]:
            continue
        within = [r for r in data["rows"] if _cell(data, r, label)["ok"]]
        entry = {"column": label, "measured": column["measured"], "within": within,
                 "own": label, "best_other": None, "loss": None, "mc": None}
        others = [r for r in within if r != label]
        if label not in within:
            entry["verdict"] = "own misses its limit"
        elif not others:
            entry["verdict"] = "only row within the limit"
        else:
            best = min(others, key=lambda r: _mean_score(data["rows"][r], "heldout_loss"))
            entry.update(best_other=best, loss=paired(data, label, best, "heldout_loss"),
                         mc=paired(data, label, best, "mc"))
            entry["verdict"] = verdict(entry["loss"])
        out.append(entry)
    return out


def _mean_score(row: dict, key: str) -> float:
    values = [s[key] for s in row["evaluation_report"].values()]
    return sum(values) / len(values)


def thesis_count(entries: list[dict]) -> dict[str, int]:
    """Verdicts on the measured columns (predicted columns never count)."""
    measured = [e for e in entries if e["measured"]]
    return {"measured_columns": len(measured),
            **{v: sum(e["verdict"] == v for e in measured)
               for v in ("holds", "tie", "reversed", "own misses its limit",
                         "only row within the limit")}}


def thesis_sentence(entries: list[dict]) -> str:
    c = thesis_count(entries)
    return (f"Each column's own architecture is the most accurate within its limit beyond "
            f"noise on **{c['holds']} of {c['measured_columns']} measured columns** "
            f"(tie {c['tie']}, reversed {c['reversed']}, own misses its limit "
            f"{c['own misses its limit']}, only row within the limit "
            f"{c['only row within the limit']}); predicted GPU columns are listed apart.")


def thesis_rows(entries: list[dict]) -> list[str]:
    lines = ["| column | rows within its limit | most accurate other row | own − it: held-out "
             "loss [95% CI] | own − it: MC points [95% CI] | verdict |",
             "|---|---|---|---|---|---|"]
    for e in entries:
        loss = (f"{e['loss']['mean']:+.4f} [{e['loss']['low']:+.4f}, {e['loss']['high']:+.4f}]"
                if e["loss"] else "–")
        mc = (f"{100 * e['mc']['mean']:+.1f} [{100 * e['mc']['low']:+.1f}, "
              f"{100 * e['mc']['high']:+.1f}]" if e["mc"] else "–")
        name = e["column"] + ("" if e["measured"] else " (predicted)")
        lines.append(f"| {name} | {len(e['within'])}: {', '.join(map(_short, e['within']))} | "
                     f"{_short(e['best_other']) if e['best_other'] else '–'} | {loss} | {mc} | "
                     f"{e['verdict']} |")
    return lines


def params_matched_rows(data: dict) -> list[str]:
    """Claim (a): per measured column, the homogeneous architecture of its own row's
    parameter count, measured there against the limit."""
    lines = ["| column | own: params, measured / limit | params-matched: params, measured / "
             "limit | the parameter budget's pick |", "|---|---|---|---|"]
    for column in data["columns"]:
        label, matched = column["label"], f"{column['label']}.params"
        if matched not in data["rows"]:
            continue
        metric = column["metric"]
        limit = column["limits"][f"max_{metric}"]
        own, other = _cell(data, label, label), _cell(data, matched, label)
        if other.get("refused"):
            shown, what = "refused", "the engine cannot serve it exactly"
        else:
            ratio = other["costs"][metric] / limit
            shown = f"{ratio:.2f}"
            what = (f"misses the limit by {100 * (ratio - 1):.0f}%" if not other["ok"] else
                    f"meets it, leaving {100 * (1 - ratio):.0f}% of the budget unused")
        lines.append(f"| {label} | {_count(data['rows'][label]['params'])}, "
                     f"{own['costs'][metric] / limit:.2f} | "
                     f"{_count(data['rows'][matched]['params'])}, {shown} | {what} |")
    return lines


TERMS = ["one attention block", "one FFN block", "FFN widths halved", "query heads halved",
         "KV heads halved", "half the attention blocks", "hidden size halved"]


def dominant_text(terms: dict) -> str:
    top = max(TERMS, key=lambda k: terms[k])
    return f"{top} ({100 * terms[top]:.0f}%)"


def cost_term_rows(data: dict) -> list[str]:
    lines = ["| column | teacher's main metric | " + " | ".join(TERMS) + " |",
             "|---|---|" + "---|" * len(TERMS)]
    for c in data["columns"]:
        t = c["cost_terms"]
        lines.append(f"| {c['label']} | {t['metric']} {t['teacher']:.3g} | " +
                     " | ".join(f"{100 * t[k]:.0f}%" for k in TERMS) + " |")
    return lines


def why_text(data: dict) -> list[str]:
    """What each column pays for (the cost model's view), in one sentence each."""
    out = []
    for c in data["columns"]:
        t = c["cost_terms"]
        block = "attention" if t["one attention block"] > t["one FFN block"] else "FFN"
        widths = {k: t[k] for k in ("FFN widths halved", "query heads halved",
                                    "KV heads halved")}
        width = max(widths, key=widths.get)
        out.append(f"- **{c['label']}** ({t['metric']}): one {block} block saves "
                   f"{100 * max(t['one attention block'], t['one FFN block']):.0f}% of the "
                   f"teacher's cost; of the width cuts, {width} saves most "
                   f"({100 * widths[width]:.0f}%); half the attention blocks "
                   f"{100 * t['half the attention blocks']:.0f}%, the hidden size halved "
                   f"{100 * t['hidden size halved']:.0f}%.")
    return out


def on_front(members: list[dict]) -> list[bool]:
    """Whether each member is on the front: no other member is both faster as measured and
    better, by the MC suite where the family was evaluated on it, else by held-out loss."""
    from flows.sweep import SweepPoint, pareto_front

    mc = all(m["scores"].get("mc_mean") is not None for m in members)
    points = [SweepPoint(label=str(i), overrides={}, costs={"tpot_ms": m["measured"]["tpot_ms"]},
                         score=m["scores"]["mc_mean"] if mc else -m["scores"]["heldout_loss"])
              for i, m in enumerate(members)]
    pareto_front(points, ["tpot_ms"])
    return [bool(p.pareto) for p in points]


def pareto_lines(data: dict) -> list[str]:
    picked = all("selection" in m for m in data["members"])  # runs before the final pick: no
    per_budget = ("a repair, the search's final pick and the measured loop" if picked else
                  "a repair and the measured loop")
    lines = [f"Target `{data['target']}`, workload `{data['workload']}`, one search for "
             f"budgets {', '.join(f'{b:.0%}' for b in data['budgets'])} (the DNAS at the "
             f"middle budget, every option scored once, per budget {per_budget}).",
             "", "| budget | params | held-out loss ± s.e. | MC ± s.e. | TPOT measured ± noise "
             "(pred) | limit | verify | on the front |", "|---|---|---|---|---|---|---|---|"]
    for m, front in zip(data["members"], on_front(data["members"]), strict=True):
        s = m["scores"]
        lines.append(
            f"| {m['budget_fraction']:.0%} | {_count(m['params'])} | "
            f"{_fmt(s['heldout_loss'], 4)} ± {_fmt(s['heldout_loss_stderr'], 2)} | "
            f"{_fmt(s['mc_mean'])} ± {_fmt(s['mc_mean_stderr'], 2)} | "
            f"{_fmt(m['measured']['tpot_ms'])} ± {_fmt(m['noise'].get('tpot_ms'), 2)} "
            f"({_fmt(m['predicted']['tpot_ms'])}) | {_fmt(m['limits'].get('max_tpot_ms'))} | "
            f"{'pass' if m['ok'] else 'FAIL'} | {'yes' if front else 'no'} |")
    if picked:
        lines += ["", *[f"- {m['budget_fraction']:.0%}: {selection_text(m['selection'])}"
                        for m in data["members"]]]
    family_search = search_seconds(data["family_steps"], ("family", "arch"))
    lines += ["", f"Family: {data['family_wall_s']:.0f} s wall for {len(data['budgets'])} "
              f"budgets, of which the search (one DNAS + scores + {len(data['budgets'])} "
              f"times {per_budget}) {family_search:.0f} s."]
    times = data.get("search_times")
    if times:
        budgets = ", ".join(f"{b:.0%}" for b in times["budgets"])
        singles = ", ".join(f"{s['seconds']:.0f}" for s in times["one_by_one"])
        lines += ["", f"**Search time, one search vs one by one** (budgets {budgets}, back to "
                  "back in one process on the same teacher, importance and cost model; prune, "
                  "distill, evaluate and verify are the same work either way): the family "
                  f"{times['family_s']:.0f} s (shared DNAS + scores {times['family_shared_s']:.0f}"
                  f" s), one by one {times['one_by_one_s']:.0f} s ({singles} s). Parameters: "
                  f"family {times['family_params']}, one by one "
                  f"{[s['params'] for s in times['one_by_one']]}."]
    return lines


def selection_text(selection: list[dict]) -> str:
    """The final pick in words: how many candidates, which won, against repair's answer."""
    if not selection:
        return "no final pick recorded (top_k 1: repair's answer, untrained)"
    best = next(c for c in selection if c["chosen"])
    own = selection[0]  # repair's own answer comes first
    depths = sorted({c["layers"] for c in selection})
    text = (f"final pick among {len(selection)} candidates ({depths[0]}-{depths[-1]} layers), "
            f"each after the baseline's short distillation: {best['origin']}, {best['layers']} "
            f"layers, KL {_fmt(best['kl'])}")
    if best is not own:
        text += f" (repair's own answer: {own['layers']} layers, KL {_fmt(own['kl'])})"
    return text


def _same_limits(a: dict, b: dict, tolerance: float = 0.01) -> bool:
    """Whether two runs set the same limits (each within ``tolerance``): only then is one's
    model comparable with the other's."""
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tolerance * b[k] for k in a)


def joint_lines(data: dict, own: dict) -> list[str]:
    """The joint architecture verified on each target, against each target's own."""
    s = data["scores"]
    lines = [f"`autocompress run --target {' --target '.join(data['targets'])} --budget-fraction "
             f"{data['budget_fraction']}` (the `compress-joint` flow): {_count(data['params'])} "
             f"parameters, held-out loss {_fmt(s['heldout_loss'], 4)} ± "
             f"{_fmt(s['heldout_loss_stderr'], 2)}, MC {_fmt(s['mc_mean'])} ± "
             f"{_fmt(s['mc_mean_stderr'], 2)}.", "",
             "| target | limit | joint: measured ± noise (pred) | verify | that target's own "
             "architecture: params, held-out loss | joint − own (held-out loss) |",
             "|---|---|---|---|---|---|"]
    for target, v in data["verifications"].items():
        limits = {k: x for k, x in v["limits"].items() if x is not None}
        metric = next(iter(limits)).removeprefix("max_")
        mine = own.get(target)  # the matrix's column of this target, under the same limit
        own_text, diff = "–", "–"
        if mine and _same_limits(mine["limits"], limits):
            loss = _mean_score(mine, "heldout_loss")
            own_text = f"{_count(mine['params'])}, {loss:.4f}"
            diff = f"{s['heldout_loss'] - loss:+.4f}"
        lines.append(f"| {target} | {_limit_text(limits)} | {_fmt(v['measured'][metric])} ± "
                     f"{_fmt(v['noise'].get(metric), 2)} ({_fmt(v['predicted'][metric])}) | "
                     f"{'pass' if v['ok'] else 'FAIL'} | {own_text} | {diff} |")
    if "selection" in data:
        lines += ["", f"The joint search's {selection_text(data['selection'])}."]
    return lines


def write_report(out_dir: Path) -> Path:
    """``targets.md`` (+ heatmaps, + the front's plot) from the JSON files in ``out_dir``."""
    from autocompress.atomic import atomic_path

    lines = ["# Does each target get its own architecture? Measured", "",
             "Regenerated by `python -m bench.targets report` from `targets.json` "
             "(`bench/targets.py matrix`) and `targets_pareto.json` (`bench/targets.py "
             "pareto`); nothing here is typed by hand.", ""]
    matrix_path = out_dir / "targets.json"
    own: dict[tuple[str, str], dict] = {}  # (target, workload) -> the matrix's own row
    if matrix_path.exists():
        data = json.loads(matrix_path.read_text())
        entries = data.get("thesis") or thesis(data)  # (files from before it was kept)
        own = {(c["target"], c["workload"]): {**data["rows"][c["label"]], "limits": c["limits"]}
               for c in data["columns"] if c["label"] in data["rows"]}
        archs = [(c["label"], data["rows"][c["label"]]["arch_spec"]) for c in data["columns"]
                 if c["label"] in data["rows"]]
        plot_heatmaps(archs, "each column's own architecture", out_dir / "targets_heatmaps.png")
        load = data["load_average"]
        lines += ["## The cross-target matrix", "",
                  thesis_sentence(entries), "",
                  f"Teacher `{data['teacher']}`; {_machine(data)}"
                  f"{data['wall_s']:.0f} s wall; load average (1/5/15 min) before "
                  f"{_load(load['before'])}, after {_load(load['after'])}; eval limit "
                  f"{data['eval_limit']} items per task; "
                  f"options `{json.dumps(data['options'])}`.", "",
                  *matrix_tables(data), "",
                  *[f"- **{t}: no architecture** — {e}" for t, e in
                    (data.get("errors") or {}).items()],
                  *[f"- **{t}: not in the matrix** — {why}." for t, why in
                    (data.get("absent") or {}).items()],
                  "", "### Does each column's own architecture win?", "",
                  "Against the most accurate other row within the column's measured limit, "
                  "paired per held-out window (loss) or per item (MC) and per seed; one rule "
                  "whichever row wins: **holds** when the loss interval lies below zero, "
                  "**reversed** when it lies above, **tie** otherwise.", "",
                  *thesis_rows(entries), "",
                  "### Does the parameter count predict the target?", "",
                  "Each measured column's homogeneous architecture of its own row's parameter "
                  "count (Model Optimizer's `params` rule: the largest homogeneous candidate "
                  "with at most that many parameters, ranked like the Minitron baseline), "
                  "measured on that column (measured / limit: above 1 misses it).", "",
                  *params_matched_rows(data), "",
                  "![per-layer architectures](targets_heatmaps.png)", "",
                  "### Why they differ: what each cut saves (each column's cost model)", "",
                  *cost_term_rows(data), "", *why_text(data), ""]
    joint_path = out_dir / "targets_joint.json"
    if joint_path.exists():
        data = json.loads(joint_path.read_text())
        lines += ["## One architecture for several targets", "",
                  f"{data['created']}; {data['wall_s']:.0f} s wall; load average "
                  f"{_load_all(data['load_average'])}.", "",
                  *joint_lines(data, {t: own[t, w] for t, w in own if w == data["workload"]}),
                  ""]
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


def _machine(data: dict) -> str:
    """``on <CPU> (<kernels>, <n> torch threads); `` where the JSON records it."""
    m = data.get("machine")
    return (f"on {m['cpu']} ({m['cpu_capability']}, {m['torch_threads']} torch threads of "
            f"{m['cores']} cores); " if m else "")


def _load(values) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def _load_all(load: dict) -> str:
    return "; ".join(f"{k.replace('_', ' ')} {_load(v)}" for k, v in load.items())


def plot_front(data: dict, path: Path) -> Path:

    plt = _pyplot()
    members = data["members"]
    # Only the scores the family was evaluated on (the MC suite is optional).
    panels = [(key, label) for key, label in (("heldout_loss", "held-out loss (lower is better)"),
                                              ("mc_mean", "MC mean (higher is better)"))
              if all(m["scores"].get(key) is not None for m in members)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    axes = axes[0]
    for ax, (key, label) in zip(axes, panels, strict=True):
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
    for name in ("matrix", "joint", "pareto"):
        s = sub.add_parser(name)
        s.add_argument("--teacher", default="default")
        s.add_argument("--workload", default="interactive-cpu")
        s.add_argument("--eval-limit", type=int, default=30)
        s.add_argument("--eval-tasks", default="heldout",
                       help="Benchmarks (default: held-out loss, next-token accuracy and bits "
                       "per byte; `local` adds the multiple-choice tasks, ~3x the time).")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--options", default=None, help="More per-stage settings as JSON, "
                       "merged over OPTIONS.")
        s.add_argument("--no-track", action="store_true")
        s.add_argument("--out", default=str(RESULTS))
    m = sub.choices["matrix"]
    # The matrix's verdicts pair MC items too, so it runs the multiple-choice tasks.
    m.set_defaults(eval_tasks="local", eval_limit=60)
    m.add_argument("--columns", nargs="+",
                   default=default_columns(cpu_flags(), engine_available()),
                   metavar="TARGET@WORKLOAD=FRACTION",
                   help="The columns: a target, its workload (PRESET or PRESET:METRIC, the "
                   "metric the budget is on) and the budget as a fraction of the teacher's "
                   "predicted cost there. Targets this machine cannot time are predicted.")
    m.add_argument("--seeds", nargs="+", type=int, default=SEEDS,
                   help="Distillation seeds: every architecture is distilled once per seed.")
    m.add_argument("--no-params-matched", action="store_true",
                   help="Skip the homogeneous architecture of each measured column's "
                   "parameter count.")
    j = sub.choices["joint"]
    j.add_argument("--targets", nargs="+", default=JOINT)
    j.add_argument("--budget-fraction", type=float, default=0.5)
    f = sub.choices["pareto"]
    f.add_argument("--target", default="cpu-local/llama.cpp/q4_0",
                   help="llama.cpp by default: its steps are timed in CPU time, which a shared "
                   "machine's load moves least, and 30%% of the teacher is reachable there.")
    f.add_argument("--budgets", nargs="+", type=float, default=[0.7, 0.6, 0.5, 0.4, 0.3])
    f.add_argument("--one-by-one", nargs="*", type=float, default=[],
                   help="Budgets (of --budgets) whose search is also timed one by one "
                   "against a family of the same budgets.")
    r = sub.add_parser("report")
    r.add_argument("--out", default=str(RESULTS))
    return p


def main(argv: list[str] | None = None) -> None:
    from autocompress.atomic import write_json_atomic

    args = build_parser().parse_args(argv)
    if args.command != "report":
        _options(args)  # a bad --options stops the script here, before any flow
    if args.command == "matrix":
        from flows.targets import Column

        [Column.parse(c) for c in args.columns]  # a bad column too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.command == "matrix":
        data = run_matrix(args)
        log(f"wrote {write_json_atomic(out / 'targets.json', data)}")
    elif args.command == "joint":
        data = run_joint(args)
        log(f"wrote {write_json_atomic(out / 'targets_joint.json', data)}")
    elif args.command == "pareto":
        data = run_pareto(args)
        log(f"wrote {write_json_atomic(out / 'targets_pareto.json', data)}")
    report = write_report(out)
    log(f"wrote {report}")
    print(report.read_text())


if __name__ == "__main__":
    from autocompress.cli import report_errors

    report_errors(main)
