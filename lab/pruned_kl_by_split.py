"""Is a short list's KL right after pruning the same on text the search never saw?

The search (DNAS, repair) and the short list's ``pruned_kl`` read the corpus's
small *calibration* split; the distillation reads *train*, the benchmarks
*held-out*. If the search's candidates owed their low KL right after pruning to
that split, they would lose the advantage on the others, and that would explain
why they recover worse than their ``pruned_kl`` says
(``lab/recovery_predictors.py``). For every candidate of a search report's short
list (``arch.search.json``: its ``selection`` rows with their ``choice``), this cuts
the candidate from the teacher and measures KL(teacher ‖ candidate) on the first
windows of the search's score stream (the calibration split, seed ``7919 + seed``:
with ``--windows`` = score batches × batch size they are exactly the short list's
score batches, so the first column reproduces the report's ``pruned_kl``) and on as
many windows of the held-out and train splits.

    .venv/bin/python -m lab.pruned_kl_by_split \\
        --report lab/results/diagnostics/smollm2_50_seed0_fixed_hidden.search.json \\
        --teacher $AUTOCOMPRESS_HOME/artifacts/teacher/<id>/teacher \\
        --importance $AUTOCOMPRESS_HOME/artifacts/importance/<id>/importance.safetensors \\
        --corpus $AUTOCOMPRESS_HOME/corpus --out lab/results/pruned_kl_by_split.json

Rows already in ``--out`` (same report and windows) are kept and not measured
again, so an interrupted run resumes. One thread by default (it runs beside
other work); a SmolLM2 row takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPLITS = {"calibration": 7919, "heldout": 5, "train": 11}  # split -> stream seed offset
BATCH = 4  # windows per forward


def split_batches(tokenizer, corpus: Path, seq_len: int, windows: int, seed: int) -> dict:
    from autocompress.data.tokens import PackedTokens

    out = {}
    for split, offset in SPLITS.items():
        data = PackedTokens(tokenizer, corpus, split, seq_len)
        out[split] = [data.batch_at(i, BATCH, seed + offset) for i in range(-(-windows // BATCH))]
    return out


def load_short_list(args: argparse.Namespace, report: dict[str, Any]):
    """The teacher (eval mode), its tokenizer and importance, and each short-listed
    candidate's report row with its ArchSpec (shared with ``block_local_probe.py``)."""
    import torch

    from autocompress.arch_search.options import SpaceConfig
    from autocompress.arch_search.space import Choice, SearchSpace
    from autocompress.importance import Importance
    from autocompress.modeling import arch_spec_of, load_causal_lm

    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(str(args.teacher))
    model.eval()
    importance = Importance.load(args.importance)
    space = SearchSpace.build(arch_spec_of(model), importance,
                              SpaceConfig(**report["space"]["config"]))
    candidates = []
    for row in report["selection"]:
        c = row["choice"]
        choice = Choice(int(c["hidden"]), tuple(c["attention"]), tuple(c["ffn"]))
        candidates.append((row, choice, space.spec_of(choice)))
    return model, tokenizer, importance, space, candidates


def measure(args: argparse.Namespace, report: dict[str, Any], done: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
    import torch

    from autocompress.arch_search.discretize import teacher_logits
    from autocompress.arch_search.selection import kl_to_teacher
    from autocompress.prune import prune

    model, tokenizer, importance, _, candidates = load_short_list(args, report)
    batches = split_batches(tokenizer, args.corpus, args.seq_len, args.windows, args.seed)
    with torch.no_grad():
        reference = {split: teacher_logits(model, b) for split, b in batches.items()}
    rows = list(done)
    for row, _, spec in candidates[len(rows):]:
        started = time.perf_counter()
        with torch.no_grad():
            student = prune(model, importance, spec)
            kl = {split: kl_to_teacher(student, batches[split], reference[split])
                  for split in batches}
        rows.append({"origin": row["origin"], "params": row["params"],
                     "reported_pruned_kl": row["pruned_kl"], "short_distill_kl": row["kl"],
                     "pruned_kl": {k: round(v, 4) for k, v in kl.items()},
                     "seconds": round(time.perf_counter() - started, 1)})
        _write(args.out, args, rows)
        print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    kl = row["pruned_kl"]
    return (f"{row['origin'][:30]:<30} {row['params'] / 1e6:>6.1f}M "
            + " ".join(f"{kl[s]:>11.3f}" for s in SPLITS) + f" {row['short_distill_kl']:>8.3f}")


def _write(path: Path, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    from autocompress.atomic import write_json_atomic
    from autocompress.hardware import machine_summary

    write_json_atomic(path, {"report": str(args.report), "windows": args.windows,
                             "seq_len": args.seq_len, "seed": args.seed, "rows": rows,
                             "threads": args.threads, "machine": machine_summary()})


def _resumed(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not args.out.exists():
        return []
    try:
        earlier = json.loads(args.out.read_text())
    except ValueError:
        return []
    same = all(earlier.get(k) == v for k, v in (("report", str(args.report)),
                                                ("windows", args.windows),
                                                ("seq_len", args.seq_len), ("seed", args.seed)))
    return earlier.get("rows", []) if same else []


def short_list_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments that name a recorded short list and what it was cut from."""
    parser.add_argument("--report", type=Path, required=True, help="a search's arch.search.json")
    parser.add_argument("--teacher", type=Path, required=True, help="the teacher's directory")
    parser.add_argument("--importance", type=Path, required=True,
                        help="the importance file the search used")
    parser.add_argument("--corpus", type=Path, required=True, help="the corpus directory")
    parser.add_argument("--windows", type=int, default=16,
                        help="windows per split (the short list's: score batches x batch size)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="the search's seed")


def read_report(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The report named by ``short_list_arguments``, refused (exit 2) without a short list."""
    for name in ("report", "teacher", "importance", "corpus"):
        if not getattr(args, name).exists():
            parser.error(f"--{name} {getattr(args, name)} does not exist")
    report = json.loads(args.report.read_text())
    if not report.get("selection") or not all("choice" in r for r in report["selection"]):
        parser.error(f"{args.report} has no short list with choices (a search's arch.search.json)")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    short_list_arguments(parser)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results/pruned_kl_by_split.json")
    args = parser.parse_args(argv)
    report = read_report(parser, args)
    print(f"{'candidate':<30} {'params':>7} " + " ".join(f"{s:>11}" for s in SPLITS)
          + f" {'short KL':>8}")
    done = _resumed(args)
    for row in done:
        print(_line(row))
    measure(args, report, done)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
