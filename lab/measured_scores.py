"""Measured one-block scores: whole forward vs a forward from the changed block's input.

The search's repair step scores every single-block change of an architecture by the
KL to the teacher on calibration batches (``discretize.measured_scores``: on a
30-layer teacher 2 × 450 jobs, the largest share of the search's time). A change to
block ``j`` leaves blocks ``< j`` as they are, so the library runs each job from the
stream entering ``j`` (``discretize.block_change_kl``) instead of from the embeddings
(``discretize.choice_kl``). This script times both on an evenly spread sample of the
teacher's jobs, interleaved job by job (the machine is shared: a drift hits both),
several repeats, and checks the two give the same scores.

    .venv/bin/python -m lab.measured_scores --teacher smollm2-135m --jobs 12 --repeats 3
    .venv/bin/python -m lab.measured_scores            # the bundled teacher
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from autocompress.arch_search.discretize import (
    block_change_kl,
    choice_kl,
    measured_job_list,
    teacher_logits,
)
from autocompress.arch_search.masked import MaskedTeacher
from autocompress.arch_search.space import SearchSpace, SpaceConfig
from autocompress.hardware import machine_summary
from autocompress.importance import CalibrationConfig, calibration_batches, compute_importance
from autocompress.modeling import arch_spec_of, load_causal_lm


def sample_jobs(space: SearchSpace, count: int) -> list[tuple[str, int, int]]:
    """``count`` legal one-block changes of the teacher, spread evenly over its job list."""
    full = space.full_choice()
    jobs = [j for j in measured_job_list(space, full, None)
            if j[0] != "hidden" and space.is_legal(full.replace_block(*j))]
    step = max(1, len(jobs) // count)
    return jobs[::step][:count]


def time_jobs(masked: MaskedTeacher, jobs, batches, repeats: int) -> dict:
    """Seconds per job, both ways, per repeat; and the largest difference of the scores."""
    full = masked.space.full_choice()
    with torch.no_grad():
        reference = teacher_logits(masked.model, batches)
        entering = [masked.block_inputs(b, full) for b in batches]
    whole, from_block, worst = [], [], 0.0
    for repeat in range(repeats):
        t_whole = t_from = 0.0
        for i, (kind, layer, k) in enumerate(jobs):
            cand = full.replace_block(kind, layer, k)
            block = 2 * layer + (kind == "ffn")
            # Alternate which way goes first, so a slow second of the machine hits both.
            order = ("whole", "from") if (i + repeat) % 2 == 0 else ("from", "whole")
            values = {}
            for way in order:
                t0 = time.perf_counter()
                values[way] = choice_kl(masked, cand, batches, reference) if way == "whole" \
                    else block_change_kl(masked, cand, block, batches, entering, reference)
                elapsed = time.perf_counter() - t0
                if way == "whole":
                    t_whole += elapsed
                else:
                    t_from += elapsed
            worst = max(worst, abs(values["whole"] - values["from"]))
        whole.append(t_whole / len(jobs))
        from_block.append(t_from / len(jobs))
    return {"whole_s_per_job": whole, "from_block_s_per_job": from_block,
            "ratio": [f / w for f, w in zip(from_block, whole, strict=True)],
            "max_abs_diff": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="default",
                        help="A built-in name (default, smollm2-135m), a directory or a hub id.")
    parser.add_argument("--jobs", type=int, default=12, help="One-block changes sampled.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=2,
                        help="Calibration batches scored per job (2 × 128 tokens each).")
    parser.add_argument("--json", type=Path, default=Path("lab/results/measured_scores.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, tokenizer = load_causal_lm(args.teacher)
    model = model.float().eval()
    calib = CalibrationConfig(seq_len=128, batch_size=2, num_batches=args.batches,
                              removal_batches=0)
    batches = calibration_batches(tokenizer, calib)
    # The order of the importance ranking does not change a forward's cost; a small
    # calibration is enough to build the search space.
    importance = compute_importance(model, batches, removal_batches=0)
    space = SearchSpace.build(arch_spec_of(model), importance, SpaceConfig())
    masked = MaskedTeacher(model, space)
    jobs = sample_jobs(space, args.jobs)
    all_jobs = len(measured_job_list(space, space.full_choice(), None))

    started = time.perf_counter()
    timing = time_jobs(masked, jobs, batches, args.repeats)
    result = {
        "teacher": args.teacher, "layers": space.num_layers, "params": arch_spec_of(model)
        .num_params(), "jobs_sampled": len(jobs), "jobs_per_scoring": all_jobs,
        "tokens_per_job": sum(b.numel() for b in batches), "repeats": args.repeats,
        "threads": args.threads, **timing,
        "seconds": time.perf_counter() - started, "machine": machine_summary(),
    }
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"One-block scores on {result['teacher']} ({result['layers']} layers, "
                  f"{result['jobs_sampled']} of {result['jobs_per_scoring']} jobs, "
                  f"{result['tokens_per_job']} tokens each, {result['threads']} thread(s); "
                  f"median [min, max] of {result['repeats']} repeats)")
    for col in ("whole s/job", "from block s/job", "ratio",
                "one scoring, whole", "one scoring, from block", "max |Δ score|"):
        table.add_column(col, justify="right")
    n = result["jobs_per_scoring"]
    table.add_row(_spread(result["whole_s_per_job"], ".3f"),
                  _spread(result["from_block_s_per_job"], ".3f"),
                  _spread(result["ratio"], ".2f"),
                  f"{n * statistics.median(result['whole_s_per_job']) / 60:.1f} min",
                  f"{n * statistics.median(result['from_block_s_per_job']) / 60:.1f} min",
                  f"{result['max_abs_diff']:.1e}")
    Console().print(table)
    machine = result["machine"]
    print(f"{machine['cpu']} ({machine['cpu_capability']}), load {machine['loadavg_1_5_15']}; "
          f"{result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
