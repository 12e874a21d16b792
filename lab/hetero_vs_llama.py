"""Decode speed: homogeneous HeteroForCausalLM vs stock LlamaForCausalLM of the same shape.

The heterogeneous model must not cost speed when it is homogeneous (issue 3:
within 5% of LlamaForCausalLM). Both models get identical weights (``to_hetero``);
runs are interleaved (A B A B ...) so drifts on a shared machine hit both, and
the median per-token decode latency with its interquartile range is reported.

    .venv/bin/python -m lab.hetero_vs_llama [--device cpu|cuda] [--repeats 7]
        [--json lab/results/hetero_vs_llama.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from autocompress.modeling import to_hetero
from autocompress.modeling.tiny import tiny_model

SHAPES = {
    # Like the default code teacher (~7.6M parameters).
    "teacher-like": dict(
        hidden_size=256,
        num_layers=8,
        num_heads=8,
        gqa_ratio=2,
        head_dim=32,
        intermediate_size=704,
        vocab_size=6000,
    ),
    # A wider model where kernels, not Python overhead, dominate.
    "wide": dict(
        hidden_size=1024,
        num_layers=8,
        num_heads=16,
        gqa_ratio=4,
        head_dim=64,
        intermediate_size=2816,
        vocab_size=8000,
    ),
}


def decode_ms_per_token(model, prompt: torch.Tensor, new_tokens: int) -> float:
    """Wall time of greedy generation with the KV cache, minus the prefill, per new token."""
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    kwargs = dict(do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        sync()
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, min_new_tokens=1, **kwargs)
        sync()
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
        sync()
        total = time.perf_counter() - start
    return 1000 * (total - prefill) / (new_tokens - 1)


def bench_shape(name: str, shape: dict, args) -> dict:
    llama = tiny_model("llama", **{**shape, "max_position_embeddings": 4096}).to(args.device)
    hetero = to_hetero(llama).to(args.device).eval()
    prompt = torch.randint(
        3, shape["vocab_size"], (args.batch, args.prompt_len), device=args.device
    )
    for model in (llama, hetero):  # warm-up
        decode_ms_per_token(model, prompt, 8)
    times = {"llama": [], "hetero": []}
    for _ in range(args.repeats):
        for label, model in (("llama", llama), ("hetero", hetero)):
            times[label].append(decode_ms_per_token(model, prompt, args.new_tokens))
    result = {"shape": name, **shape}
    for label, values in times.items():
        q = statistics.quantiles(values, n=4)
        result[label] = {
            "median_ms": statistics.median(values),
            "q1_ms": q[0],
            "q3_ms": q[2],
            "all_ms": values,
        }
    result["ratio_hetero_over_llama"] = result["hetero"]["median_ms"] / result["llama"]["median_ms"]
    # Each repeat measures both models back to back: the per-pair ratio cancels slow drifts.
    pairs = [h / m for h, m in zip(times["hetero"], times["llama"], strict=True)]
    q = statistics.quantiles(pairs, n=4)
    result["paired_ratio"] = {"median": statistics.median(pairs), "q1": q[0], "q3": q[2]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--json", type=Path, default=Path("lab/results/hetero_vs_llama.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    results = [bench_shape(name, SHAPES[name], args) for name in args.shapes]

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Decode ms/token, batch {args.batch}, {args.device}, median [IQR]")
    for column in (
        "shape",
        "LlamaForCausalLM",
        "HeteroForCausalLM",
        "hetero / llama",
        "paired ratio [IQR]",
    ):
        table.add_column(column, justify="right")
    for r in results:
        cells = [
            f"{r[k]['median_ms']:.3f} [{r[k]['q1_ms']:.3f}–{r[k]['q3_ms']:.3f}]"
            for k in ("llama", "hetero")
        ]
        paired = r["paired_ratio"]
        table.add_row(
            r["shape"],
            *cells,
            f"{r['ratio_hetero_over_llama']:.3f}",
            f"{paired['median']:.3f} [{paired['q1']:.3f}–{paired['q3']:.3f}]",
        )
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": args.device,
        "threads": args.threads,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "repeats": args.repeats,
        "torch": torch.__version__,
    }
    args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
