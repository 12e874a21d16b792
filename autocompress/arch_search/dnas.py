"""Differentiable architecture search under cost constraints.

Each choice (global hidden size; per layer attention option and FFN option)
has a vector of architecture logits ``α``. They start on a given architecture (the
search gives greedy repair from the teacher: a 100-step search over 30 layers from
uniform logits does not get back to where greedy already is) or uniform. One search
step:

1. draws a hard Gumbel-softmax sample of every choice (straight-through: the
   forward uses the one-hot sample, the backward the relaxed soft sample at
   temperature ``τ``, annealed geometrically from ``tau_start`` to ``tau_end``);
2. runs the masked teacher (``MaskedTeacher``) with those samples and measures
   ``KL(teacher ‖ student)`` on next-token distributions (+ optionally a hidden
   state term, ``1 − cos`` of the final normed hidden states);
3. adds the augmented Lagrangian of every limit c: with p = softmax(α) and
   ``g_c = E_p[cost_c] / budget_c − 1`` (exact and differentiable: the cost
   model is additive over blocks; with ``constraint="mode"`` the value is the cost
   of the most likely architecture and only the gradient is the expectation's), the
   penalty is
   ``(max(0, λ_c + ρ·g_c)² − λ_c²) / (2ρ)`` — that is ``λ_c·g_c + ρ/2·g_c²``
   while the limit is violated or λ_c > 0 (Powell–Hestenes–Rockafellar form);
4. takes an Adam step on α and a dual step ``λ_c ← max(0, λ_c + ρ·g_c)``
   (λ rises while a limit is violated and relaxes back toward 0 once it holds).

Everything a step uses is a pure function of ``(seed, step)`` (the batch and
the Gumbel noise), so a run resumed from a checkpoint follows exactly the
trajectory of an uninterrupted one. To save a third of the work, the search
cycles over ``teacher_cache`` calibration batches whose teacher logits are
computed once (the ~150 architecture logits do not overfit a few thousand
tokens; set 0 for a fresh batch every step). Checkpoints (α, Adam state, λ, trajectory)
are written atomically every ``checkpoint_every`` steps.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch_search.discretize import choice_kl
from autocompress.arch_search.masked import MaskedTeacher
from autocompress.arch_search.space import Choice, SearchSpace
from autocompress.atomic import publishing_dir, write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.losses import kd_loss

BatchFn = Callable[[int], torch.Tensor]
NEG = -1e9  # logit of a forbidden option
BEST_BATCHES = 2  # calibration batches that score the most likely architecture (keep_best_every)
# The checkpoint is a directory: JSON (fingerprint, counters, trajectory), read
# first, and tensors (α, Adam moments) loaded with weights_only=True only when
# the fingerprint matches. The pickle file of earlier versions is never loaded.
CHECKPOINT_NAME = "dnas-checkpoint"
_STATE_JSON, _TENSORS = "state.json", "tensors.pt"
LEGACY_CHECKPOINT = "dnas-state.pt"


class DNASConfig(BaseModel):
    """Hyper-parameters of the search (defaults sized for a ~7M-parameter teacher on 2 cores)."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=160, ge=1, description="Search steps (one batch each).")
    batch_size: int = Field(default=4, ge=1, description="Calibration sequences per step.")
    seq_len: int = Field(default=128, ge=2, description="Tokens per sequence.")
    lr: float = Field(default=0.1, gt=0, description="Adam learning rate on the logits α.")
    tau_start: float = Field(default=1.0, gt=0, description="Gumbel temperature at step 0.")
    tau_end: float = Field(default=0.1, gt=0, description="Gumbel temperature at the end.")
    rho: float = Field(default=2.0, gt=0, description="Penalty weight and dual step size.")
    start: Literal["greedy", "uniform"] = Field(
        default="greedy",
        description="Where the logits start. 'greedy': on repair from the teacher at the "
        "search's budgets, every option scored there (the greedy ablation's answer; the "
        "single-target search with measured scores), each of its options ``start_bias`` "
        "above the others. 'uniform': zero logits plus ``init_bias``. Why: on SmolLM2 (30 "
        "layers, 100 steps) DNAS from uniform ended far from the budget and its repaired "
        "answer was worse right after pruning (KL 6.9) than greedy's (5.0); started on "
        "greedy's answer, it improved on it (4.7).",
    )
    start_bias: float = Field(default=3.0, gt=0,
                              description="Logit lead of the start's options ('greedy').")
    init_bias: float = Field(
        default=0.0,
        description="Initial logit bonus per unit of kept fraction (>0 starts near the "
        "teacher, 0 = uniform; 'uniform' start, or when no start choice is given).",
    )
    constraint: Literal["expected", "mode"] = Field(
        default="expected",
        description="What the limits hold in the search. 'expected': the expected cost "
        "under p = softmax(α). 'mode': the cost of p's most likely architecture (what "
        "repair starts from), with the expected cost's gradient (straight through). Why: "
        "started on greedy's answer, which sits at the budget, the spread of p around it "
        "put the expected TPOT 25% over budget at step 1 (interactive-cpu @ 40%); the "
        "multiplier then pushed every choice cheaper and the sampled KL doubled before "
        "the expectation settled under the budget. Measured: a tie with 'expected' there "
        "(three seeds), and on SmolLM2 the mode jumped across the budget when the hidden "
        "size flipped (docs/results-history.md).",
    )
    keep_best_every: int = Field(
        default=0, ge=0,
        description="Every this many steps, at the start and at the end, score p's most likely "
        "architecture, if it meets every budget, by its KL on the first two calibration "
        "batches; the search answers with the best one scored, not the last (0 = the last "
        "argmax). Why: started on greedy's answer, the multiplier's push-pull around the budget "
        "can end far from a start that was better (SmolLM2 @ 50%: the DNAS side's best "
        "candidate was 0.15-0.97 nats of short-distillation KL behind the teacher side's). "
        "Measured on the bundled teacher only: a tie with 0 at interactive-cpu @ 40%.",
    )
    search_hidden: bool = Field(
        default=True,
        description="Search the hidden size too. False: every sample keeps the start's hidden "
        "size (greedy's answer, or the teacher's from 'uniform') and the search moves only "
        "the blocks; repair from its answer keeps that size too (its scores were measured "
        "there), so the hidden size is the teacher side's choice. Why: the hidden "
        "size is one choice that prices every block at once; on SmolLM2 @ 50% its most "
        "likely value flipped at step 33 and took the most likely architecture from 1.08 to "
        "0.73 of the budget in one step. Measured: a tie with True at interactive-cpu @ 40% "
        "(three seeds); on SmolLM2 @ 50% its side won on KL right after pruning (4.06 against "
        "5.37) and lost after the short distillation (2.03 against 1.60).")
    hidden_weight: float = Field(
        default=0.0, ge=0, description="Weight of the hidden-state term (1 - cos)."
    )
    teacher_cache: int = Field(
        default=24, ge=0,
        description="Cycle over this many calibration batches whose teacher outputs are "
        "computed once (fp16); 0 = a fresh batch and teacher forward every step.",
    )
    checkpoint_every: int = Field(default=20, ge=1, description="Steps between checkpoints.")
    seed: int = 0


class DNASState(BaseModel):
    """What a checkpoint restores besides tensors (JSON-able)."""

    step: int = 0
    lambdas: dict[str, float] = Field(default_factory=dict)
    trajectory: list[dict[str, Any]] = Field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = Field(default=0.0, description="Process CPU time (all threads).")
    best: dict[str, Any] | None = Field(
        default=None, description="The best scored most likely architecture (keep_best_every): "
        "its step, KL and choice.")


@dataclass
class DNASResult:
    """Final logits and the recorded trajectory."""

    alpha_hidden: torch.Tensor
    alpha_attention: torch.Tensor
    alpha_ffn: torch.Tensor
    lambdas: dict[str, float]
    trajectory: list[dict[str, Any]]
    seconds: float
    completed: bool
    cpu_seconds: float = 0.0
    budgets: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] | None = None  # DNASState.best

    def anchor_choice(self, space: SearchSpace) -> Choice:
        """What repair starts from: the best scored architecture (keep_best_every), else
        the most likely one at the end."""
        if self.best is None:
            return self.argmax_choice(space)
        c = self.best["choice"]
        return Choice(int(c["hidden"]), tuple(c["attention"]), tuple(c["ffn"]))

    def probabilities(self, space: SearchSpace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _probabilities(space, self.alpha_hidden, self.alpha_attention, self.alpha_ffn)

    def argmax_choice(self, space: SearchSpace) -> Choice:
        """``most_likely`` under the final logits."""
        return most_likely(space, *self.probabilities(space))


def most_likely(space: SearchSpace, p_h: torch.Tensor, p_a: torch.Tensor,
                p_f: torch.Tensor) -> Choice:
    """The most likely option of every choice, made legal if it is not."""
    choice = Choice(
        int(p_h.argmax()),
        tuple(int(i) for i in p_a.argmax(1)),
        tuple(int(i) for i in p_f.argmax(1)),
    )
    if not space.is_legal(choice):  # every attention block removed: keep the likeliest
        keep = p_a[:, :-1].max(1).values.argmax()
        choice = choice.replace_block("attention", int(keep), int(p_a[keep, :-1].argmax()))
    return choice


def _masked_logits(alpha: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return alpha.masked_fill(~allowed, NEG)


def _probabilities(space: SearchSpace, a_h, a_a, a_f):
    return (
        F.softmax(a_h, dim=-1),
        F.softmax(_masked_logits(a_a, space.allowed_attention), dim=-1),
        F.softmax(_masked_logits(a_f, space.allowed_ffn), dim=-1),
    )


def _straight_through(logits: torch.Tensor, tau: float, generator: torch.Generator):
    """Hard one-hot Gumbel sample in the forward, soft sample's gradient in the backward."""
    uniform = torch.rand(logits.shape, generator=generator).clamp_(1e-10, 1.0 - 1e-10)
    gumbel = -torch.log(-torch.log(uniform))
    soft = F.softmax((logits + gumbel) / tau, dim=-1)
    hard = F.one_hot(soft.argmax(-1), logits.shape[-1]).to(soft.dtype)
    return hard + (soft - soft.detach())


def _initial_logits(space: SearchSpace, bias: float):
    """Zero logits, plus ``bias`` × kept fraction of each option when bias ≠ 0."""
    teacher = space.teacher.layers[0]
    hidden = torch.tensor([h / space.teacher.hidden_size for h in space.hidden_options])
    att = torch.tensor([
        0.0 if o is None else o.num_heads / teacher.attention.num_heads
        for o in space.attention_options
    ])
    ffn = torch.tensor([
        0.0 if o is None else o.intermediate_size / teacher.ffn.intermediate_size
        for o in space.ffn_options
    ])
    layers = space.num_layers
    return (
        (bias * hidden).clone(),
        (bias * att).repeat(layers, 1),
        (bias * ffn).repeat(layers, 1),
    )


def _logits_at(space: SearchSpace, choice: Choice, bias: float):
    """Zero logits with ``bias`` on every option of ``choice`` (a warm start)."""
    a_h = torch.zeros(len(space.hidden_options))
    a_a = torch.zeros(space.num_layers, len(space.attention_options))
    a_f = torch.zeros(space.num_layers, len(space.ffn_options))
    a_h[choice.hidden] = bias
    layers = torch.arange(space.num_layers)
    a_a[layers, torch.tensor(choice.attention)] = bias
    a_f[layers, torch.tensor(choice.ffn)] = bias
    return a_h, a_a, a_f


def expected_budget_costs(costs, metrics: list[str], p_attention: torch.Tensor,
                          p_ffn: torch.Tensor, p_hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """``AdditiveCosts.expected`` restricted to ``metrics``.

    Latencies are the exact sums over the tables (cheap); memory, whose activation
    peak is not a sum, comes from the cost model's own expectation.
    """
    out = {}
    for m in metrics:
        if m == "memory_gb":
            out[m] = costs.expected(p_attention, p_ffn, p_hidden)[m]
            continue
        per_hidden = (
            costs.const[m]
            + torch.einsum("lk,lkh->h", p_attention, costs.attention[m])
            + torch.einsum("lk,lkh->h", p_ffn, costs.ffn[m])
        )
        out[m] = (p_hidden * per_hidden).sum()
    return out


def _penalty(g: torch.Tensor, lam: float, rho: float) -> torch.Tensor:
    """PHR augmented-Lagrangian term of one inequality g ≤ 0."""
    return (torch.clamp(lam + rho * g, min=0.0) ** 2 - lam**2) / (2.0 * rho)


def _round(values: torch.Tensor, digits: int = 4) -> list:
    return torch.round(values.detach().double() * 10**digits).div(10**digits).tolist()


class DNAS:
    """One search: a masked teacher, cost tables and budgets (metric -> bound)."""

    def __init__(
        self,
        masked: MaskedTeacher,
        costs,
        budgets: dict[str, float],
        config: DNASConfig | None = None,
        start: Choice | None = None,
    ):
        self.masked = masked
        self.space = masked.space
        self.costs = costs
        self.config = config or DNASConfig()
        if not budgets:
            raise AutoCompressError("the search needs at least one limit",
                                    hint="give a --limit (e.g. tpot=5) or "
                                    "--budget-fraction")
        unknown = [m for m in budgets if m not in costs.const]
        if unknown:
            raise AutoCompressError(f"no additive cost for {unknown}",
                                    hint="limits are ttft_ms, tpot_ms, e2e_ms, memory_gb "
                                    "(throughput is converted to tpot_ms)")
        self.budgets = dict(budgets)
        self.start = start
        a_h, a_a, a_f = (_logits_at(self.space, start, self.config.start_bias) if start
                         else _initial_logits(self.space, self.config.init_bias))
        if not self.config.search_hidden:  # one hidden size, certain: only the blocks move
            a_h = torch.full_like(a_h, NEG).index_fill_(0, torch.tensor(
                start.hidden if start else 0), 0.0)
        self.alpha = [a.clone().requires_grad_(True) for a in (a_h, a_a, a_f)]
        searched = self.alpha if self.config.search_hidden else self.alpha[1:]
        self.optimizer = torch.optim.Adam(searched, lr=self.config.lr)
        self.state = DNASState(lambdas={m: 0.0 for m in budgets})

    # ------------------------------------------------------------ schedule
    def tau(self, step: int) -> float:
        cfg = self.config
        frac = step / max(1, cfg.steps - 1)
        return cfg.tau_start * (cfg.tau_end / cfg.tau_start) ** frac

    def expected_costs(self) -> dict[str, torch.Tensor]:
        p_h, p_a, p_f = _probabilities(self.space, *self.alpha)
        return expected_budget_costs(self.costs, list(self.budgets), p_a.double(), p_f.double(),
                                     p_h.double())

    @torch.no_grad()
    def mode_choice(self) -> Choice:
        """``most_likely`` under the current logits."""
        return most_likely(self.space, *_probabilities(self.space, *self.alpha))

    @torch.no_grad()
    def mode_costs(self, choice: Choice | None = None) -> dict[str, torch.Tensor]:
        """The cost of ``choice`` (default: the most likely architecture) as one-hot
        probabilities."""
        one_hot = _logits_at(self.space, choice or self.mode_choice(), 1.0)
        h, a, f = (t.double() for t in one_hot)
        return expected_budget_costs(self.costs, list(self.budgets), a, f, h)

    def constraint_costs(self, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The costs the limits hold (``DNASConfig.constraint``), differentiable in α."""
        if self.config.constraint == "expected":
            return expected
        mode = self.mode_costs()
        return {m: expected[m] + (mode[m] - expected[m]).detach() for m in expected}

    # ------------------------------------------------------------ one step
    @torch.no_grad()
    def teacher_outputs(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher logits (and final normed hidden states if the hidden term is on)."""
        hidden = self.masked.model.model(input_ids=batch).last_hidden_state
        logits = self.masked.model.lm_head(hidden)
        return logits, (hidden if self.config.hidden_weight > 0 else None)

    def step(self, step: int, batch: torch.Tensor,
             teacher: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> dict[str, Any]:
        """One search step on ``batch`` (``teacher``: its cached teacher outputs)."""
        cfg = self.config
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        tau = self.tau(step)
        a_h, a_a, a_f = self.alpha
        w_h = _straight_through(a_h, tau, gen)
        w_a = _straight_through(_masked_logits(a_a, self.space.allowed_attention), tau, gen)
        w_f = _straight_through(_masked_logits(a_f, self.space.allowed_ffn), tau, gen)
        w_a = self._legal_attention(w_a)

        teacher_logits, teacher_hidden = teacher or self.teacher_outputs(batch)
        student_logits, student_hidden = self.masked(batch, w_h, w_a, w_f, return_hidden=True)
        kl = kd_loss(student_logits[:, :-1], teacher_logits[:, :-1])
        loss = kl
        hidden_term = torch.zeros(())
        if cfg.hidden_weight > 0:
            kept = w_h.detach() @ self.masked.hidden_masks
            cos = F.cosine_similarity(student_hidden, teacher_hidden.float() * kept, dim=-1)
            hidden_term = (1.0 - cos).mean()
            loss = loss + cfg.hidden_weight * hidden_term

        expected = self.expected_costs()
        held = self.constraint_costs(expected)
        g = {m: held[m] / b - 1.0 for m, b in self.budgets.items()}
        penalty = sum(_penalty(g[m], self.state.lambdas[m], cfg.rho) for m in g)
        total = loss + penalty.float()
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.optimizer.step()
        for m in g:  # dual ascent
            self.state.lambdas[m] = max(0.0, self.state.lambdas[m] + cfg.rho * float(g[m].detach()))
        return self._record(step, tau, kl, hidden_term, penalty, expected, g)

    def _legal_attention(self, w_a: torch.Tensor) -> torch.Tensor:
        """A sample that removes every attention block keeps the likeliest one instead."""
        if self.space.config.allow_no_attention and bool((w_a.detach().argmax(1)
                                                          == w_a.shape[1] - 1).all()):
            probs = F.softmax(_masked_logits(self.alpha[1], self.space.allowed_attention), -1)
            layer = int(probs[:, :-1].max(1).values.argmax())
            fix = torch.zeros_like(w_a)
            fix[layer, -1] = -1.0
            fix[layer, int(probs[layer, :-1].argmax())] = 1.0
            w_a = w_a + fix
        return w_a

    def _record(self, step, tau, kl, hidden_term, penalty, expected, g) -> dict[str, Any]:
        p_h, p_a, p_f = (p.detach() for p in _probabilities(self.space, *self.alpha))
        return {
            "step": step,
            "tau": round(tau, 5),
            "kl": round(float(kl.detach()), 5),
            "hidden_term": round(float(hidden_term.detach()), 5),
            "penalty": round(float(penalty.detach()), 5),
            "lambda": {m: round(v, 5) for m, v in self.state.lambdas.items()},
            "constraint": self.config.constraint,  # what g holds: E_p[cost] or the mode's
            "g": {m: round(float(v.detach()), 5) for m, v in g.items()},
            "expected": {m: float(v.detach()) for m, v in expected.items()},
            "p_hidden": _round(p_h),
            "p_attention": _round(p_a),
            "p_ffn": _round(p_f),
        }

    # ------------------------------------------------------------- running
    def run(
        self,
        batch_fn: BatchFn,
        checkpoint_dir: str | Path | None = None,
        max_steps_this_run: int | None = None,
        progress: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> DNASResult:
        """Run (or resume) the search; ``max_steps_this_run`` stops early (resumable)."""
        ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir else None
        if ckpt is not None:
            _warn_legacy(ckpt.parent / LEGACY_CHECKPOINT)
            if (ckpt / _STATE_JSON).exists():
                self.load(ckpt)
        start_time, start_cpu = time.perf_counter(), time.process_time()
        done_before, cpu_before = self.state.seconds, self.state.cpu_seconds
        start = self.state.step
        end = self.config.steps if max_steps_this_run is None \
            else min(self.config.steps, start + max_steps_this_run)
        cache = self._teacher_cache(batch_fn) if start < end else []
        scoring = self._scoring_batches(batch_fn, cache) if start < end else []
        for step in range(start, end):
            if self._keeps_best(step):
                self._keep_best(step, scoring)
            if cache:
                batch, outputs = cache[step % len(cache)]
                record = self.step(step, batch, outputs)
            else:
                record = self.step(step, batch_fn(step))
            self.state.trajectory.append(record)
            self.state.step = step + 1
            self.state.seconds = done_before + time.perf_counter() - start_time
            self.state.cpu_seconds = cpu_before + time.process_time() - start_cpu
            if progress is not None:
                progress(step, record)
            last = step + 1 == end
            if step + 1 == self.config.steps and self.config.keep_best_every:
                self._keep_best(step + 1, scoring)
            if ckpt is not None and ((step + 1) % self.config.checkpoint_every == 0 or last):
                self.save(ckpt)
        a_h, a_a, a_f = (a.detach().clone() for a in self.alpha)
        return DNASResult(
            alpha_hidden=a_h, alpha_attention=a_a, alpha_ffn=a_f,
            lambdas=dict(self.state.lambdas), trajectory=list(self.state.trajectory),
            seconds=self.state.seconds, cpu_seconds=self.state.cpu_seconds,
            completed=self.state.step >= self.config.steps,
            budgets=dict(self.budgets), best=self.state.best,
        )

    # ---------------------------------------------------------- best iterate
    def _keeps_best(self, step: int) -> bool:
        every = self.config.keep_best_every
        return every > 0 and step % every == 0

    def _scoring_batches(self, batch_fn: BatchFn, cache: list) -> list[tuple[torch.Tensor, Any]]:
        """Two fixed batches with their teacher logits (the cache's first, when it has them)."""
        if not self.config.keep_best_every:
            return []
        if len(cache) >= BEST_BATCHES:
            return [(batch, outputs[0]) for batch, outputs in cache[:BEST_BATCHES]]
        return [(batch, self.teacher_outputs(batch)[0])
                for batch in (batch_fn(i) for i in range(BEST_BATCHES))]

    @torch.no_grad()
    def _keep_best(self, step: int, scoring: list[tuple[torch.Tensor, Any]]) -> None:
        """Score the most likely architecture if it meets every budget; keep it if best."""
        choice = self.mode_choice()
        costs = self.mode_costs(choice)
        if any(float(costs[m]) > b for m, b in self.budgets.items()):
            return
        best = self.state.best
        if best is not None and best["choice"] == choice.to_dict():
            return
        kl = choice_kl(self.masked, choice, [b for b, _ in scoring], [t for _, t in scoring])
        if best is None or kl < best["kl"]:
            self.state.best = {"step": step, "kl": round(kl, 6), "choice": choice.to_dict()}

    def _teacher_cache(self, batch_fn: BatchFn) -> list[tuple[torch.Tensor, tuple]]:
        """The first ``teacher_cache`` batches with their teacher outputs stored in fp16."""
        cache = []
        for index in range(self.config.teacher_cache):
            batch = batch_fn(index)
            logits, hidden = self.teacher_outputs(batch)
            cache.append((batch, (logits.half(), None if hidden is None else hidden.half())))
        return cache

    # ---------------------------------------------------------- checkpoint
    def _fingerprint(self) -> dict[str, Any]:
        # Compared as JSON (tuples become lists), as it is stored.
        return json.loads(json.dumps({"config": self.config.model_dump(), "budgets": self.budgets,
                                      "space": self.space.describe(),
                                      "start": self.start.to_dict() if self.start else None},
                                     default=str))

    def save(self, path: Path) -> None:
        """Write the checkpoint directory ``path`` atomically (JSON + tensors)."""
        tensors = {"alpha": [a.detach().clone() for a in self.alpha],
                   "optimizer": self.optimizer.state_dict()}
        with publishing_dir(path, overwrite=True) as tmp:
            torch.save(tensors, tmp / _TENSORS)
            write_json_atomic(tmp / _STATE_JSON, {"format": "autocompress-dnas-v2",
                                                  "fingerprint": self._fingerprint(),
                                                  "state": self.state.model_dump()})

    def load(self, path: Path) -> None:
        """Resume from ``path``: fingerprint first, then tensors only (no pickle code)."""
        start_over = f"delete {path} (or use another --work-dir) to start the search over"
        try:
            meta = json.loads((path / _STATE_JSON).read_text())
        except (OSError, ValueError) as err:
            raise AutoCompressError(f"search checkpoint {path} is unreadable ({err})",
                                    hint=start_over) from None
        if not isinstance(meta, dict) or meta.get("fingerprint") != self._fingerprint():
            raise AutoCompressError(
                f"search checkpoint {path} belongs to a different search (config, limits or "
                "search space changed)", hint=start_over)
        try:
            blob = torch.load(path / _TENSORS, weights_only=True, map_location="cpu")
            state = DNASState.model_validate(meta.get("state"))
            with torch.no_grad():
                for mine, saved in zip(self.alpha, blob["alpha"], strict=True):
                    mine.copy_(saved)
            self.optimizer.load_state_dict(blob["optimizer"])
        except pickle.UnpicklingError as err:
            raise AutoCompressError(
                f"search checkpoint {path} holds more than tensors and was not loaded "
                f"(possibly planted: {str(err).splitlines()[0][:120]})", hint=start_over) from None
        except (OSError, RuntimeError, EOFError, KeyError, TypeError, ValueError) as err:
            raise AutoCompressError(f"search checkpoint {path} is unreadable "
                                    f"({type(err).__name__}: {err})", hint=start_over) from None
        self.state = state


def _warn_legacy(path: Path) -> None:
    """An old-format (pickle) checkpoint is never loaded; say so once."""
    if path.exists():
        print(f"note: ignoring {path}: an old pickle-format search checkpoint is never loaded "
              "(it could run code); the search starts over", file=sys.stderr, flush=True)
