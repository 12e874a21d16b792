"""The same architectures timed in hf-eager (PyTorch), llama.cpp and vLLM.

Starting from the teacher's shape, one factor changes at a time: depth (whole
layers removed), FFN width (every layer), attention (query heads and KV heads of
every layer, or attention removed), hidden size. Every architecture is timed on
one workload in each engine with that engine's paired timing (hf-eager:
``costmodel.measure``; llama.cpp: ``costmodel.measure_llamacpp``; the reference
is the teacher's shape in the same engine; vLLM, which serves from processes of its
own, is timed absolutely, server by server), so the table compares *relative* costs:
how much of the teacher's TPOT / TTFT one factor buys in each engine. ``--model``
takes the shape from another teacher (``smollm2-135m``: SmolLM2's 30 layers of 576).
Where a fitted cost model of the engine's target exists (``costmodel fit``),
its prediction of each architecture is scored too (MAPE per engine).

    nice -n 10 .venv/bin/python -m bench.engines [--workload interactive-cpu]
        [--repeats 5] [--json bench/results/engines.json] [--plot bench/results/engines.png]
    .venv/bin/python -m bench.engines --model smollm2-135m --engines cpu-local/hf-eager/fp32 \
        cpu-local/llama.cpp/q8_0 cpu-local/vllm/bf16 --json bench/results/engines_smollm2.json \
        --plot bench/results/engines_smollm2.png
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.atomic import write_json_atomic
from autocompress.costmodel import CostModel, Target, get_workload
from autocompress.costmodel.fit import measure_on_target
from autocompress.costmodel.measure import timing_reference
from autocompress.costmodel.probes import default_base_config
from autocompress.hardware import engine_kernels, machine_summary
from autocompress.modeling import arch_spec_of, build_model

ENGINES = ("cpu-local/hf-eager/fp32", "cpu-local/llama.cpp/f32", "cpu-local/llama.cpp/q8_0")


def variants(base: ArchSpec) -> dict[str, list[tuple[float, ArchSpec]]]:
    """Per factor, (fraction kept, spec) from the teacher (1.0) down."""
    att, ffn = base.layers[0].attention, base.layers[0].ffn
    n = base.num_layers

    def every(attention, mlp) -> ArchSpec:
        return base.model_copy(update={"layers": [LayerSpec(attention=attention, ffn=mlp)
                                                  for _ in range(n)]})

    depth = [(k / n, base.model_copy(update={"layers": base.layers[:k]}))
             for k in (n, 3 * n // 4, n // 2, n // 4)]
    widths = [(f, every(att, FFNSpec(intermediate_size=int(ffn.intermediate_size * f))
                        if f else None)) for f in (1.0, 0.75, 0.5, 0.25, 0.0)]
    # Query and KV heads scaled together (the GQA ratio kept); 1/n: attention kept in
    # the first layer only (a model needs one).
    heads = [(f, every(AttentionSpec(num_heads=max(1, int(att.num_heads * f)),
                                     num_kv_heads=max(1, int(att.num_kv_heads * f))), ffn))
             for f in (1.0, 0.5, 0.25)]
    first_only = [LayerSpec(attention=att if i == 0 else None, ffn=ffn) for i in range(n)]
    heads.append((1 / n, base.model_copy(update={"layers": first_only})))
    hidden = [(f, base.model_copy(update={"hidden_size": int(base.hidden_size * f)}))
              for f in (1.0, 0.75, 0.5)]
    return {"depth": depth, "ffn": widths, "attention": heads, "hidden": hidden}


def time_engine(target_name: str, specs: list[ArchSpec], base_config, workload, repeats: int):
    target = Target.parse(target_name)
    models = [build_model(spec, base_config, seed=i) for i, spec in enumerate(specs)]
    reference = timing_reference(arch_spec_of(base_config)) if target.paired_timing else None
    grid = measure_on_target(target, models, [workload], repeats=repeats, warmup=1, seed=0,
                             progress=True, description=target_name, reference=reference)
    cost_model = CostModel.for_target(target)
    rows = []
    for spec, measured in zip(specs, grid[0], strict=True):
        metrics = measured.metrics()
        row = {"ttft_ms": metrics["ttft_ms"], "tpot_ms": metrics["tpot_ms"],
               "memory_gb": metrics["memory_gb"], "ttft_spread": measured.ttft_ms.spread,
               "tpot_spread": measured.tpot_ms.spread}
        if cost_model.source == "fitted":
            predicted = cost_model.predict(spec, workload)
            row["predicted"] = {"ttft_ms": predicted.ttft_ms, "tpot_ms": predicted.tpot_ms,
                                "memory_gb": predicted.memory_gb}
        rows.append(row)
    return rows, cost_model.version


def mape(rows: list[dict], key: str) -> float | None:
    errors = [abs(r["predicted"][key] - r[key]) / r[key] * 100 for r in rows if "predicted" in r]
    return sum(errors) / len(errors) if errors else None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = list(results["factors"])
    fig, axes = plt.subplots(1, len(factors), figsize=(4 * len(factors), 3.6), sharey=True)
    for ax, factor in zip(axes, factors, strict=True):
        for engine in results["engines"]:
            points = results["factors"][factor][engine]
            ax.plot([p["kept"] for p in points], [p["tpot_rel"] for p in points], "o-",
                    label=engine.removeprefix("cpu-local/"))
        ax.plot([0, 1], [0, 1], ":", color="grey", lw=1)
        ax.set_title(f"{factor} kept")
        ax.set_xlabel("fraction of the teacher's")
    axes[0].set_ylabel("TPOT / teacher's TPOT")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"relative decode cost per factor ({results['workload']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _cell(point: dict) -> str:
    return f"{point['tpot_rel']:.2f} ({point['ttft_rel']:.2f})".rjust(24)


def teacher_config(model: str | None):
    """The config of ``model`` (a named teacher, a directory, a hub id), else the default's."""
    if model is None:
        return default_base_config()
    from transformers import AutoConfig

    from autocompress.model_source import resolve_model_dir

    return AutoConfig.from_pretrained(resolve_model_dir(model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="teacher whose shape the variants start from (default: the bundled "
                        "one; e.g. smollm2-135m)")
    parser.add_argument("--workload", default="interactive-cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES))
    parser.add_argument("--json", type=Path, default=Path("bench/results/engines.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench/results/engines.png"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    base_config = teacher_config(args.model)
    base = arch_spec_of(base_config)
    workload = get_workload(args.workload)
    factors = variants(base)
    specs, index_of = [], {}  # each distinct architecture timed once
    for points in factors.values():
        for _, spec in points:
            key = spec.to_json()
            if key not in index_of:
                index_of[key] = len(specs)
                specs.append(spec)
    load_before = os.getloadavg()
    timed, versions = {}, {}
    for engine in args.engines:
        timed[engine], versions[engine] = time_engine(engine, specs, base_config, workload,
                                                      args.repeats)
    results: dict = {"workload": workload.name, "engines": args.engines, "factors": {},
                     "teacher": args.model or "default",
                     "timing": {e: "paired" if Target.parse(e).paired_timing else "absolute"
                                for e in args.engines},
                     "cost_models": versions, "cost_model_mape": {}}
    for factor, points in factors.items():
        results["factors"][factor] = {engine: [] for engine in args.engines}
        for kept, spec in points:
            for engine in args.engines:
                row = timed[engine][index_of[spec.to_json()]]
                teacher = timed[engine][0]
                results["factors"][factor][engine].append({
                    "kept": kept, "params": spec.num_params(), **row,
                    "tpot_rel": row["tpot_ms"] / teacher["tpot_ms"],
                    "ttft_rel": row["ttft_ms"] / teacher["ttft_ms"]})
    for engine in args.engines:
        results["cost_model_mape"][engine] = {
            key: mape(timed[engine], key) for key in ("ttft_ms", "tpot_ms", "memory_gb")}
    results["meta"] = {"created": datetime.now(UTC).isoformat(timespec="seconds"),
                       "seconds": time.perf_counter() - started, "repeats": args.repeats,
                       "threads": 1, "loadavg_before": load_before,
                       "loadavg_after": os.getloadavg(), "machine": machine_summary(),
                       "kernels": {e: engine_kernels(Target.parse(e).engine.name)
                                   for e in args.engines}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.json, results)
    plot(results, args.plot)
    header = f"{'factor':10} {'kept':>5} " + " ".join(
        f"{e.removeprefix('cpu-local/'):>24}" for e in args.engines)
    print(f"TPOT / teacher's TPOT (TTFT ratio in brackets), {workload.name}")
    print(header)
    for factor, by_engine in results["factors"].items():
        for i, point in enumerate(by_engine[args.engines[0]]):
            cells = " ".join(_cell(by_engine[e][i]) for e in args.engines)
            print(f"{factor:10} {point['kept']:>5.2f} {cells}")
    for engine in args.engines:
        teacher = timed[engine][0]
        print(f"teacher in {engine}: TPOT {teacher['tpot_ms']:.2f} ms "
              f"(±{100 * teacher['tpot_spread']:.1f}%), TTFT {teacher['ttft_ms']:.1f} ms, "
              f"memory {teacher['memory_gb']:.3f} GB")
    for engine, errors in results["cost_model_mape"].items():
        shown = ", ".join(f"{k} {v:.1f}%" for k, v in errors.items() if v is not None)
        print(f"cost model MAPE {engine}: {shown or 'no fitted model'}")
    print(f"load average before {load_before}, after {os.getloadavg()}; wrote {args.json}")


if __name__ == "__main__":
    main()
