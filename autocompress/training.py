"""A small, resumable training loop shared by teacher training and distillation.

Everything that decides what the next step does — weights, optimizer moments,
learning-rate schedule position, RNG states, the step counter — goes into an
atomically written checkpoint. The data order is a pure function of the step
(see ``data.tokens.PackedTokens.batch_at``), so a resumed run continues exactly
where an uninterrupted one would have been.

The same loop runs under ``torchrun`` (see ``autocompress.distributed``): each
step's global batch is split over ranks and ``grad_accum`` micro-batches, the
model is wrapped in DDP or sharded with FSDP (``TrainConfig.parallel``), and
only rank 0 writes checkpoints and prints. Checkpoints hold full state dicts,
so a run may resume with another number of processes.
"""

from __future__ import annotations

import math
import pickle
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, Field

from autocompress import distributed
from autocompress.atomic import publishing_dir, remove_path
from autocompress.errors import AutoCompressError
from autocompress.progress import Bar

LossFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
BatchFn = Callable[[int], torch.Tensor]
EvalFn = Callable[[torch.nn.Module], dict[str, float]]


class TrainConfig(BaseModel):
    """Optimisation settings; ``max_steps`` × ``batch_size`` × ``seq_len`` = tokens."""

    max_steps: int = Field(gt=0)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    bf16: bool = True
    seed: int = 0
    ckpt_every: int = 100
    eval_every: int = 0  # 0 = only at the end
    log_every: int = 10
    # Micro-batches per step and process; the batch from batch_fn is the global
    # batch, split over processes x grad_accum (see distributed.local_micro_batches).
    grad_accum: int = Field(1, ge=1)
    # How to spread a step over processes when launched by torchrun (ignored in
    # a single process): replicate (ddp) or shard parameters (fsdp).
    parallel: Literal["ddp", "fsdp"] = "ddp"


class TrainState(BaseModel):
    step: int = 0
    history: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    seconds: float = 0.0


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with no weight decay on norms and biases (1-D parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def _rng_state() -> dict:
    # Plain containers and tensors only, so the checkpoint loads with
    # ``torch.load(weights_only=True)`` (numpy's state array becomes a list).
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# Checkpoints of FSDP runs key optimizer state by parameter name (full, unsharded).
_BY_NAME = "full-by-name"
# A checkpoint is a directory ``step-NNNNNNNN`` holding these two files; it gets
# that name only once both are on disk (see _write_checkpoint).
_STATE_FILE, _TENSORS_FILE = "train_state.json", "state.pt"
_CKPT_PREFIX = "step-"


def _checkpoint_blob(model, optimizer, ctx: distributed.DistContext) -> dict:
    """Everything to save; collective under FSDP, complete only on rank 0."""
    rng = distributed.gather_objects(_rng_state(), ctx)
    if distributed.is_sharded(model):
        blob = {"format": _BY_NAME, "model": distributed.full_model_state(model),
                "optimizer": distributed.full_optimizer_state(model, optimizer)}
    else:
        blob = {"model": distributed.unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict()}
    # "rng" is rank 0's (the single-process format); "rng_ranks" has every rank's.
    blob.update(rng=rng[0], rng_ranks=rng)
    return blob


def save_checkpoint(ckpt_dir: Path, model, optimizer, state: TrainState) -> None:
    """Write a new checkpoint under ``ckpt_dir``; the previous one goes only after.

    Under torchrun every rank must call it (FSDP gathers shards); rank 0 writes.
    """
    ctx = distributed.context()
    blob = _checkpoint_blob(model, optimizer, ctx)
    if ctx.is_main:
        _write_checkpoint(ckpt_dir, blob, state)
    distributed.barrier(ctx)


def _write_checkpoint(ckpt_dir: Path, blob: dict, state: TrainState) -> None:
    """Write ``step-N`` completely (fsynced), rename it in, then drop older ones.

    At every instant the newest complete checkpoint is on disk under its final
    name: the new one is written in a hidden temp directory and renamed only
    once complete, and the old ones are deleted only after that rename.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"{_CKPT_PREFIX}{state.step:08d}"
    with publishing_dir(final, overwrite=True) as tmp:
        torch.save(blob, tmp / _TENSORS_FILE)
        (tmp / _STATE_FILE).write_text(state.model_dump_json())
    for path in ckpt_dir.iterdir():
        if path != final and (path.name.startswith(_CKPT_PREFIX) or path.name.startswith(".")
                              or path.name in ("last", "last.tmp", "last.old")):
            remove_path(path)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint directory under ``ckpt_dir``, or None."""
    if not ckpt_dir.is_dir():
        return None
    done = [p for p in ckpt_dir.iterdir() if p.name.startswith(_CKPT_PREFIX)
            and p.name[len(_CKPT_PREFIX):].isdigit() and (p / _STATE_FILE).is_file()
            and (p / _TENSORS_FILE).is_file()]
    return max(done, key=lambda p: int(p.name[len(_CKPT_PREFIX):]), default=None)


def checkpoint_step(ckpt_dir: Path) -> int:
    """The step of the newest complete checkpoint (0 if none)."""
    final = latest_checkpoint(ckpt_dir)
    if final is None:
        return 0
    return TrainState.model_validate_json((final / _STATE_FILE).read_text()).step


def load_checkpoint(ckpt_dir: Path, model, optimizer) -> TrainState | None:
    """Restore the newest complete checkpoint under ``ckpt_dir``; None for a fresh run.

    Tensors load with ``weights_only=True``: a checkpoint file someone else put
    there can hold only tensors and plain containers, never code to run.
    """
    final = latest_checkpoint(ckpt_dir)
    if final is None:
        return None
    ctx = distributed.context()
    try:
        state = TrainState.model_validate_json((final / _STATE_FILE).read_text())
        blob = torch.load(final / _TENSORS_FILE, weights_only=True, map_location="cpu")
        if blob.get("format") == _BY_NAME:
            distributed.load_full_state(model, optimizer, blob["model"], blob["optimizer"])
        elif distributed.is_sharded(model):
            raise AutoCompressError(
                f"checkpoint {final} was written without FSDP",
                "resume it with parallel='ddp' (not fsdp), or start a new run",
            )
        else:
            distributed.unwrap(model).load_state_dict(blob["model"])
            optimizer.load_state_dict(blob["optimizer"])
        ranks = blob.get("rng_ranks") or [blob["rng"]]
        _set_rng_state(ranks[ctx.rank] if ctx.rank < len(ranks) else blob["rng"])
        return state
    except pickle.UnpicklingError as err:
        raise AutoCompressError(
            f"checkpoint {final} holds more than tensors and was not loaded "
            f"(possibly planted: {str(err).splitlines()[0][:120]})",
            f"delete {ckpt_dir} to start over",
        ) from None
    except (RuntimeError, KeyError, ValueError, TypeError, EOFError) as err:
        raise AutoCompressError(
            f"checkpoint {final} is corrupt or from another model ({type(err).__name__})",
            f"delete {ckpt_dir} to start over",
        ) from err


def train(
    model: torch.nn.Module,
    loss_fn: LossFn,
    batch_fn: BatchFn,
    cfg: TrainConfig,
    ckpt_dir: Path | None = None,
    eval_fn: EvalFn | None = None,
    on_step: Callable[[int, float], None] | None = None,
    tokens_per_step: int = 0,
    description: str = "train",
) -> TrainState:
    """Run (or resume) ``cfg.max_steps`` optimizer steps; return the state.

    ``loss_fn(model, micro_batch)`` gets the (possibly DDP-wrapped) model;
    ``eval_fn`` gets the bare (or FSDP-sharded) model and runs on every rank.
    ``on_step(step, loss)`` runs after each step — tests use it to interrupt a
    run; callers use it for logging. Under torchrun, ``model`` is trained in
    place (sharded in place with FSDP: use ``distributed.full_model_state``).
    """
    torch.manual_seed(cfg.seed)
    ctx = distributed.context()
    engine = distributed.wrap(model, ctx, cfg.parallel)
    model = distributed.unwrap(engine)
    # A single process trains where the caller put the model (CPU or one GPU).
    device = ctx.device if ctx.enabled else next(model.parameters()).device
    optimizer = make_optimizer(model, cfg)
    state = load_checkpoint(ckpt_dir, model, optimizer) if ckpt_dir else None
    state = state or TrainState()
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg), last_epoch=state.step - 1
    ) if state.step else torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    model.train()
    progress = _Progress(description, cfg.max_steps, state.step, tokens_per_step,
                         enabled=ctx.is_main)
    started = time.perf_counter() - state.seconds
    while state.step < cfg.max_steps:
        micro_batches = distributed.local_micro_batches(batch_fn(state.step), ctx, cfg.grad_accum)
        optimizer.zero_grad(set_to_none=True)
        loss = _accumulate(engine, loss_fn, micro_batches, device, cfg.bf16)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor
            grad_norm = grad_norm.full_tensor()
        optimizer.step()
        scheduler.step()
        state.step += 1
        value = float(distributed.mean_over_ranks(loss, ctx))
        if not math.isfinite(value):
            raise AutoCompressError(
                f"training diverged at step {state.step} (loss {value})",
                "lower the learning rate or disable bf16",
            )
        state.history.append({"step": state.step, "loss": value,
                              "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm)})
        state.seconds = time.perf_counter() - started
        progress.update(state.step, value)
        if eval_fn and cfg.eval_every and state.step % cfg.eval_every == 0:
            state.evals.append({"step": state.step, **_evaluate(model, eval_fn)})
            progress.note(state.evals[-1])
        if ckpt_dir and (state.step % cfg.ckpt_every == 0 or state.step == cfg.max_steps):
            save_checkpoint(ckpt_dir, model, optimizer, state)
        if on_step:
            on_step(state.step, value)
    if eval_fn and (not state.evals or state.evals[-1]["step"] != state.step):
        state.evals.append({"step": state.step, **_evaluate(model, eval_fn)})
        progress.note(state.evals[-1])
    progress.close()
    distributed.barrier(ctx)
    return state


def _accumulate(engine, loss_fn: LossFn, micro_batches: list[torch.Tensor],
                device: torch.device, bf16: bool) -> torch.Tensor:
    """Forward/backward every micro-batch; return the mean loss (detached).

    Each micro loss is divided by their number, so the summed gradient is the
    gradient of the mean loss over this rank's rows; DDP/FSDP then average ranks.
    """
    total = torch.zeros((), device=device)
    for i, micro in enumerate(micro_batches):
        micro = micro.to(device)
        last = i == len(micro_batches) - 1
        with distributed.no_sync(engine, skip=not last):
            # The caller decides (distill measures both ways): bf16 is honoured as given.
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(engine, micro)
            (loss / len(micro_batches)).backward()
        total += loss.detach().float() / len(micro_batches)
    return total


def _evaluate(model: torch.nn.Module, eval_fn: EvalFn) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        result = eval_fn(model)
    model.train()
    return result


class _Progress:
    """Training progress: steps, the loss and tokens/s (``progress.Bar``), eval lines."""

    def __init__(self, description: str, total: int, start: int, tokens_per_step: int,
                 enabled: bool = True):
        self.tokens_per_step = tokens_per_step
        self.t0, self.s0 = time.perf_counter(), start
        self.bar = Bar(description, total, enabled=enabled, completed=start)

    def _rate(self, step: int) -> float:
        dt = time.perf_counter() - self.t0
        return (step - self.s0) * self.tokens_per_step / dt if dt > 0 else 0.0

    def update(self, step: int, loss: float) -> None:
        self.bar.update(step, f"loss {loss:.3f}  {self._rate(step):,.0f} tok/s")

    def note(self, evals: dict[str, float]) -> None:
        self.bar.note("eval " + " ".join(f"{k}={v:.4g}" for k, v in evals.items()))

    def close(self) -> None:
        self.bar.close()

