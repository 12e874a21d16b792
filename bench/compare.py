"""AutoCompress vs the matched Minitron baseline, side by side (issue 8).

For each CPU-scaled workload preset and each budget (a fraction of the
teacher's *predicted* cost on the preset's main metric), both methods start
from the same teacher, the same importance scores, the same calibration and
training data, the same distillation token budget and the same seeds:

1. AutoCompress: DNAS search + exact repair under the cost model;
   Minitron: the largest homogeneous model meeting the same limit (same importance);
2. prune both from the teacher; held-out loss before distillation;
3. distil both (KD from the teacher, ``--distill-tokens`` tokens each);
4. evaluate both with the benchmark suite (``--eval-limit`` items per task);
5. verify both on the target (measured TTFT/TPOT/memory vs the limit).

Every stage writes its output under ``results/compare-work/`` in a file or folder
named by a hash of its inputs, so a re-run skips finished stages and resumes an
interrupted search or distillation. The summary goes to ``results/compare.json``
(atomically, after every finished method, so a partial run is still readable)
and a rich table is printed. ``autocompress bench compare`` runs this module.

    .venv/bin/python bench/compare.py                 # the README's run (~40 min)
    .venv/bin/python bench/compare.py --presets interactive-cpu --budgets 0.4 \
        --distill-tokens 50000 --eval-limit 100 --search-steps 80   # a quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

PRESETS = ("local-coding-cpu", "datacenter-cpu", "interactive-cpu")
METHODS = ("autocompress", "minitron")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


# ------------------------------------------------------------------ caching helpers


def digest(*parts: Any) -> str:
    """Short stable hash of JSON-able inputs (the cache key of a stage)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def cached(path: Path, compute) -> tuple[Any, bool]:
    """``compute()`` once; later calls read ``path``. Returns (value, was_cached)."""
    if path.exists():
        return json.loads(path.read_text()), True
    value = compute()
    write_json_atomic(path, value)
    return value, False


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------ the run


class Comparison:
    """Shared state of one comparison: teacher, importance, data, settings."""

    def __init__(self, args: argparse.Namespace):
        from autocompress.data.corpus import ensure_corpus
        from autocompress.importance import Importance, calibration_batches, compute_importance
        from autocompress.modeling import load_causal_lm
        from autocompress.paths import resolve_model_dir
        from autocompress.search import SearchConfig
        from autocompress.search.dnas import DNASConfig

        self.args = args
        self.work = Path(args.work)
        self.teacher_dir = resolve_model_dir(args.teacher)
        self.model, self.tokenizer = load_causal_lm(self.teacher_dir)
        self.teacher_hash = file_digest(self.teacher_dir / "config.json",
                                        self.teacher_dir / "model.safetensors")
        self.corpus = ensure_corpus(None)
        self.config = SearchConfig(dnas=DNASConfig(steps=args.search_steps, seed=args.seed))
        calib = self.config.calibration.model_copy(update={"corpus_dir": str(self.corpus),
                                                           "seed": args.seed})
        imp_path = self.work / f"importance-{digest(self.teacher_hash, calib.model_dump())}.st"
        if imp_path.exists():
            self.importance = Importance.load(imp_path)
        else:
            log("importance on the calibration split")
            batches = calibration_batches(self.tokenizer, calib)
            self.importance = compute_importance(self.model, batches,
                                                 removal_batches=calib.removal_batches,
                                                 progress=False)
            tmp = imp_path.with_name(f".{imp_path.name}.tmp.safetensors")
            imp_path.parent.mkdir(parents=True, exist_ok=True)
            self.importance.save(tmp)
            os.replace(tmp, imp_path)
        from autocompress.costmodel.model import CostModel
        from autocompress.costmodel.target import Target

        target = Target.parse(args.target)
        # "fitted" = the saved fit of the target if there is one (else analytic), like the CLI.
        self.cost_model = (CostModel.analytic(target) if args.cost_model == "analytic"
                           else CostModel.for_target(target))
        self.base_key = digest(self.teacher_hash, calib.model_dump(), args.target, args.seed)

    # -------------------------------------------------------------- scores
    def heldout(self, model) -> float:
        from autocompress.evaluation import heldout_loss

        return heldout_loss(model, self.tokenizer, self.corpus,
                            max_batches=self.args.heldout_batches, seq_len=256, batch_size=8,
                            seed=0)

    def evaluate(self, model, name: str) -> dict:
        from autocompress.evaluation import evaluate

        t = time.perf_counter()
        result = evaluate(model, self.tokenizer, limit=self.args.eval_limit,
                          corpus_dir=self.corpus, model_name=name)
        return {
            "mc_mean": result.get("mc_mean"), "mc_mean_stderr": result.get("mc_mean_stderr"),
            "mc_chance_mean": result.get("mc_chance_mean"),
            "tasks": {k: {"score": v.get("score"), "stderr": v.get("stderr"), "n": v.get("n")}
                      for k, v in result.get("tasks", {}).items()},
            "heldout_loss": result.get("heldout_loss"),
            "heldout_loss_stderr": result.get("heldout_loss_stderr"),
            "bits_per_byte": result.get("bits_per_byte"),
            "next_token_acc": result.get("next_token_acc"),
            "eval_limit": self.args.eval_limit, "seconds": time.perf_counter() - t,
        }

    def verify(self, model_dir: Path, preset: str, limits) -> dict:
        from autocompress.verify import verify

        t = time.perf_counter()
        report = verify(model_dir, self.args.target, preset, limits,
                        repeats=self.args.verify_repeats, cost_model=self.cost_model)
        # (threads: those the cost model was fitted with, so measured and predicted agree)
        out = report.model_dump(mode="json")
        out["seconds"] = time.perf_counter() - t
        return out

    # -------------------------------------------------------------- teacher
    def teacher_entry(self) -> dict:
        key = digest(self.teacher_hash, self.args.eval_limit, self.args.heldout_batches)
        scores, _ = cached(self.work / f"teacher-eval-{key}.json",
                           lambda: {**self.evaluate(self.model, "teacher"),
                                    "heldout_loss_fixed": self.heldout(self.model)})
        from autocompress.modeling import arch_spec_of

        return {"dir": str(self.teacher_dir), "sha": self.teacher_hash,
                "params": sum(p.numel() for p in self.model.parameters()),
                "arch": arch_spec_of(self.model).to_dict(), "scores": scores}

    def teacher_verify(self, preset: str, limits) -> dict:
        key = digest(self.teacher_hash, preset, limits.model_dump(), self.args.target,
                     self.args.verify_repeats, self.cost_model.version)
        value, _ = cached(self.work / f"teacher-verify-{preset}-{key}.json",
                          lambda: self.verify(self.teacher_dir, preset, limits))
        return value

    # -------------------------------------------------------------- one budget
    def run_budget(self, preset: str, fraction: float) -> dict:
        from autocompress.errors import AutoCompressError
        from autocompress.search import SearchContext

        ctx = SearchContext.build((self.model, self.tokenizer), self.args.target, preset,
                                  self.config, importance=self.importance,
                                  corpus_dir=self.corpus, cost_model=self.cost_model,
                                  progress=False)
        ctx.teacher_dir = str(self.teacher_dir)
        limits = ctx.resolve_limits(None, fraction)
        log(f"== {preset} @ {fraction:.0%}: {limits.describe()}")
        run = {"preset": preset, "budget_fraction": fraction,
               "main_metric": ctx.workload.main_metric,
               "limits": limits.model_dump(exclude_none=True),
               "teacher_predicted": ctx.teacher_costs(),
               "cost_model": ctx.cost_model.version,
               "teacher_verify": _verify_summary(self.teacher_verify(preset, limits)),
               "methods": {}}
        folder = self.work / f"{preset}-{fraction:g}"
        # Stage-major order (both architectures, then both pruned losses, then both
        # distillations, ...): a run stopped early still compares the two methods
        # as far as it got; compare.json is rewritten after every stage.
        states = {m: {"method": m} for m in self.args.methods}
        for stage in (self.stage_arch, self.stage_pruned, self.stage_distill, self.stage_eval,
                      self.stage_verify):
            for method, st in states.items():
                if method in run.get("failed_methods", {}):
                    continue
                try:
                    stage(ctx, limits, folder, st)
                except AutoCompressError as err:
                    # One method finding no architecture is a result (the other may still
                    # reach the budget); record why and carry on with the other.
                    if stage != self.stage_arch:
                        raise
                    run.setdefault("failed_methods", {})[method] = err.message
                    log(f"{method}: {err.message}")
                    continue
                run["methods"][method] = self.summary(st)
                if self.on_method_done:
                    self.on_method_done(run)
        return run

    on_method_done = None  # set by main() to rewrite compare.json after every stage

    # Each stage reads and extends ``st`` (one method's state) and caches on disk.
    def stage_arch(self, ctx, limits, folder: Path, st: dict) -> None:
        from autocompress.arch import ArchSpec
        from autocompress.search.run import minitron_to_file, search_to_file

        method = st["method"]
        key = digest(self.base_key, ctx.workload.name, limits.model_dump(),
                     self.config.model_dump(), method, ctx.cost_model.version)
        arch_path = folder / f"{method}-{key}.arch.json"
        report_path = arch_path.with_name(arch_path.stem + ".search.json")
        t = time.perf_counter()
        if report_path.exists() and arch_path.exists():
            report = json.loads(report_path.read_text())
        else:
            log(f"{method}: architecture")
            if method == "autocompress":
                report = search_to_file(ctx, limits, arch_path, self.config)
            else:
                report = minitron_to_file(ctx, arch_path, limits=limits, config=self.config)
        st.update(key=key, report=report, arch_path=arch_path,
                  spec=ArchSpec.from_json(arch_path.read_text()),
                  timings={"arch_s": time.perf_counter() - t})

    def _pruned(self, st: dict):
        from autocompress.prune import prune

        torch.manual_seed(self.args.seed)
        return prune(self.model, self.importance, st["spec"])

    def stage_pruned(self, ctx, limits, folder: Path, st: dict) -> None:
        log(f"{st['method']}: held-out loss after pruning")
        before, _ = cached(folder / f"{st['method']}-{st['key']}.pruned-heldout.json",
                           lambda: {"heldout_loss": self.heldout(self._pruned(st))})
        st["pruned_loss"] = before["heldout_loss"]

    def stage_distill(self, ctx, limits, folder: Path, st: dict) -> None:
        args = self.args
        st["distill_key"] = digest(st["key"], args.distill_tokens, args.seed, args.lr)
        out_dir = folder / f"{st['method']}-{st['distill_key']}.distilled"
        t = time.perf_counter()
        st["distilled"] = self.distill(lambda: self._pruned(st), out_dir, st["method"])
        st["out_dir"] = out_dir
        st["timings"]["distill_s"] = time.perf_counter() - t

    def stage_eval(self, ctx, limits, folder: Path, st: dict) -> None:
        from autocompress.modeling import load_causal_lm

        args = self.args
        key = digest(st["distill_key"], args.eval_limit, args.heldout_batches)
        t = time.perf_counter()

        def run_eval():
            log(f"{st['method']}: benchmark suite")
            student, _ = load_causal_lm(st["out_dir"], with_tokenizer=False)
            return {**self.evaluate(student, st["method"]),
                    "heldout_loss_fixed": self.heldout(student)}

        st["scores"], _ = cached(folder / f"{st['method']}-{key}.eval.json", run_eval)
        st["timings"]["eval_s"] = time.perf_counter() - t

    def stage_verify(self, ctx, limits, folder: Path, st: dict) -> None:
        args = self.args
        key = digest(st["distill_key"], ctx.workload.name, limits.model_dump(), args.target,
                     args.verify_repeats, self.cost_model.version)
        t = time.perf_counter()
        log(f"{st['method']}: verify on {args.target}")
        st["verify"], _ = cached(folder / f"{st['method']}-{key}.verify.json",
                                 lambda: self.verify(st["out_dir"], ctx.workload.name, limits))
        st["timings"]["verify_s"] = time.perf_counter() - t

    @staticmethod
    def summary(st: dict) -> dict:
        """What compare.json records for one method (fields appear as stages finish)."""
        report = st["report"]
        out = {"arch": report["arch"], "params": report["params"],
               "teacher_params": report.get("teacher_params"),
               "predicted": report["predicted"],
               "meets_limits_predicted": report["meets_limits"],
               "margins": report.get("margins"), "search_seconds": report.get("seconds"),
               "timings": st["timings"], "files": {"arch": str(st["arch_path"])},
               "scores": {"heldout_loss_pruned": st.get("pruned_loss")}}
        if "distilled" in st:
            d = st["distilled"]
            out["distill"] = {k: d.get(k) for k in ("steps", "tokens_seen", "seconds",
                                                    "initial_eval", "final_eval",
                                                    "teacher_eval")}
            out["files"]["model"] = str(st["out_dir"])
        if "scores" in st:
            out["scores"].update(st["scores"])
            out["scores"]["heldout_loss_distilled"] = st["scores"]["heldout_loss_fixed"]
        if "verify" in st:
            v = st["verify"]
            out.update(measured=v["measured"], noise=v["noise"], verify_ok=v["ok"],
                       violations=v["violations"], prediction_error=v["prediction_error"],
                       measurement={k: v["measurement"].get(k)
                                    for k in ("ttft_ms", "tpot_ms", "repeats", "threads")})
        return out

    def distill(self, pruned_model, out_dir: Path, method: str) -> dict:
        from autocompress.distill import DistillConfig, DistillData, distill

        args = self.args
        record = out_dir / "distill.json"
        if record.exists():
            return json.loads(record.read_text())
        steps = max(1, -(-args.distill_tokens // (16 * 256)))
        config = DistillConfig(tokens=args.distill_tokens, seq_len=256, batch_size=16,
                               lr=args.lr, warmup_steps=max(1, steps // 10), eval_batches=2,
                               ckpt_every=10, seed=args.seed, bf16=True)
        log(f"{method}: distil {args.distill_tokens:,} tokens ({config.steps} steps)")
        data = DistillData.from_corpus(self.tokenizer, self.corpus, 256, heldout_windows=32)
        resume = (out_dir.with_name(out_dir.name + ".work") / "checkpoints" / "last").exists()
        result = distill(self.model, pruned_model(), data, config, out_dir,
                         tokenizer=self.tokenizer, resume=resume)
        self.model.eval()
        return result.model_dump(mode="json")


def _verify_summary(report: dict) -> dict:
    return {"measured": report["measured"], "noise": report["noise"],
            "predicted": report["predicted"], "ok": report["ok"],
            "prediction_error": report["prediction_error"]}


# ------------------------------------------------------------------ output


def print_table(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="AutoCompress vs matched Minitron (after distillation)")
    for col in ("preset", "budget", "method", "params", "mc_mean", "loss pruned",
                "loss distilled", "TPOT pred", "TPOT meas", "mem GB", "verify"):
        table.add_column(col, justify="right")
    teacher = data.get("teacher", {}).get("scores", {})

    def f(value, fmt):
        return "—" if value is None else format(value, fmt)

    for run in data.get("runs", []):
        for method, m in run["methods"].items():
            s, meas, noise = m["scores"], m.get("measured", {}), m.get("noise", {})
            verdict = ("—" if "verify_ok" not in m else
                       "ok" if m["verify_ok"] else "FAIL " + ",".join(m["violations"]))
            table.add_row(run["preset"], f"{run['budget_fraction']:.0%}", method,
                          f"{m['params']:,}",
                          f"{f(s.get('mc_mean'), '.3f')}±{f(s.get('mc_mean_stderr'), '.3f')}",
                          f(s.get("heldout_loss_pruned"), ".3f"),
                          f(s.get("heldout_loss_distilled"), ".3f"),
                          f(m["predicted"].get("tpot_ms"), ".2f"),
                          f"{f(meas.get('tpot_ms'), '.2f')}±{f(noise.get('tpot_ms'), '.2f')}",
                          f(meas.get("memory_gb"), ".4f"), verdict)
    Console().print(table)
    if teacher:
        print(f"teacher: mc_mean {teacher.get('mc_mean', float('nan')):.3f}, held-out loss "
              f"{teacher.get('heldout_loss_fixed', float('nan')):.3f}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", default="default", help="Teacher dir or `default`.")
    p.add_argument("--target", default="cpu-local/hf-eager/fp32")
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--budgets", nargs="+", type=float, default=[0.6, 0.4],
                   help="Fractions of the teacher's predicted main-metric cost.")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    # Defaults = the run behind the README table (about 40 minutes on 2 cores).
    p.add_argument("--distill-tokens", type=int, default=100_000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-limit", type=int, default=0,
                   help="Items per benchmark task (0 = all of them).")
    p.add_argument("--heldout-batches", type=int, default=8)
    p.add_argument("--search-steps", type=int, default=160)
    p.add_argument("--verify-repeats", type=int, default=5)
    p.add_argument("--cost-model", default="fitted", choices=["fitted", "analytic"],
                   help="fitted: the target's saved fit if any, else analytic.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads for search, "
                   "distillation and evaluation (timing uses the cost model's own count)")
    p.add_argument("--work", default=str(RESULTS / "compare-work"))
    p.add_argument("--json", default=str(RESULTS / "compare.json"))
    p.add_argument("--report", action="store_true", help="Write results/report.md + PNGs too.")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.eval_limit == 0:
        args.eval_limit = None
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    t0 = time.perf_counter()
    out = Path(args.json)
    cmp = Comparison(args)
    data: dict[str, Any] = {
        "version": 1, "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "target": args.target, "synthetic": False,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "work")},
        "teacher": cmp.teacher_entry(), "runs": [], "not_run": [],
    }
    done: list[dict] = []

    def save(partial: dict | None = None) -> None:
        data["runs"] = done + ([partial] if partial is not None and partial not in done else [])
        data["wall_s"] = time.perf_counter() - t0
        write_json_atomic(out, data)

    cmp.on_method_done = save
    for preset in args.presets:
        for fraction in args.budgets:
            try:
                done.append(cmp.run_budget(preset, fraction))
            except Exception as err:  # record and go on: one failing preset must not hide others
                from autocompress.errors import AutoCompressError

                if not isinstance(err, AutoCompressError):
                    raise
                data["not_run"].append({"preset": preset, "budget_fraction": fraction,
                                        "reason": str(err)})
                log(f"{preset} @ {fraction}: {err}")
            save()
    save()
    print_table(data)
    log(f"wrote {out} ({data['wall_s']:.0f} s)")
    if args.report:
        from autocompress.report import write_report

        log(f"report: {write_report(data, out.parent)}")
    return data


if __name__ == "__main__":
    main()
