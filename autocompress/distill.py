"""Knowledge distillation: a pruned student recovers by imitating its teacher.

The loss follows Minitron (arXiv 2407.14679 / 2408.11796): forward KL from the
teacher's to the student's next-token distribution, both softened by a
temperature T and scaled by T² (so gradients keep their size as T changes).
Logits only by default; ``alpha > 0`` adds a cosine loss between mapped hidden
states, which helps students that lost many layers. When the student is
narrower than the teacher, one shared learned linear map lifts its hidden
states to the teacher's width (the projection is trained, then discarded).

Training itself is ``autocompress.training.train``: AdamW, warmup + cosine,
clipping, bf16 autocast, atomic checkpoints and exact resume, DDP/FSDP under
``torchrun``. This module supplies the loss, the held-out evaluation, and the
run directory layout:

- ``out_dir`` — the final student (``save_pretrained`` + tokenizer +
  ``distill.json``), published atomically when the run finishes;
- ``work_dir`` (default ``<out_dir>.work``) — checkpoints and the run's config,
  so an interrupted run resumes; removed after success unless asked to keep it.

Both directories are claimed with an advisory lock at the start, so a second
run into the same ``out_dir`` is refused before it trains. The work files carry
the fingerprint of the run that wrote them (its settings, the teacher, the
student's shape and the data): another run's checkpoints are never resumed, and
a ``reference_eval.json`` is reused only together with the checkpoint of its own
run (a stale one, e.g. from a killed run of another student, is recomputed).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from autocompress import distributed, paths
from autocompress.atomic import (
    check_out_dir,
    claim_output,
    publishing_dir,
    release_output,
    remove_path,
    write_json_atomic,
)
from autocompress.errors import AutoCompressError
from autocompress.hardware import machine_summary
from autocompress.losses import kd_loss
from autocompress.teacher_outputs import TeacherOutputs, cached_kd_loss, model_digest, tensor_digest
from autocompress.training import TrainConfig, TrainState, latest_checkpoint, train

# Config fields that may change when a run resumes: they do not alter the losses
# (the global batch stays the same whatever the processes and accumulation).
_RESUMABLE_CHANGES = {"eval_every", "eval_batches", "ckpt_every", "keep_checkpoints",
                      "parallel", "grad_accum"}


# The token budget when none is given (the compress flow and the Python API): CPU-scale.
DEFAULT_TOKENS = 200_000


class DistillConfig(BaseModel):
    """How long and how to distil; ``tokens`` / (``batch_size`` × ``seq_len``) = steps."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not ignored
    tokens: int = Field(gt=0, description="Training token budget (student-side tokens).")
    seq_len: int = Field(256, gt=1)
    batch_size: int = Field(16, gt=0, description="Global sequences per optimizer step.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per step and process.")
    lr: float = Field(1e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0)
    alpha: float = Field(0.0, ge=0, description="Weight of the hidden-state cosine loss.")
    # Student hidden-state index -> teacher hidden-state index (HF numbering:
    # 0 = embeddings, i = output of block i). None = the pruned student's
    # config.source_layers, else one to one / spread evenly.
    layer_map: dict[int, int] | None = None
    eval_every: int = Field(0, ge=0, description="Steps between held-out evals; 0 = end only.")
    eval_batches: int = Field(8, ge=1, description="Held-out batches (of batch_size) per eval.")
    ckpt_every: int = Field(50, ge=1)
    seed: int = 0
    # bf16 autocast where it is faster: measured at the start of each run on this
    # machine (a few student steps each way), not read off a CPU feature list.
    bf16: bool = True
    teacher_topk: int = Field(64, ge=0, description="Cache the teacher's top-k log-probs per "
                              "batch once and reuse them (0 = run the teacher live).")
    parallel: Literal["ddp", "fsdp"] = "ddp"
    keep_checkpoints: bool = False

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens / (self.batch_size * self.seq_len)))

    def train_config(self, bf16: bool | None = None) -> TrainConfig:
        """The loop's settings; ``bf16``: the decision taken for this run (default: asked)."""
        return TrainConfig(
            max_steps=self.steps, lr=self.lr, min_lr_ratio=self.min_lr_ratio,
            warmup_steps=min(self.warmup_steps, self.steps), weight_decay=self.weight_decay,
            grad_clip=self.grad_clip, bf16=self.bf16 if bf16 is None else bf16, seed=self.seed,
            ckpt_every=self.ckpt_every, eval_every=self.eval_every,
            grad_accum=self.grad_accum, parallel=self.parallel,
        )


class BatchSource(Protocol):
    """Deterministic training batches: batch number ``step`` is always the same."""

    def batch_at(self, step: int, batch_size: int, seed: int = 0) -> torch.Tensor: ...


class WindowBatches:
    """Batches drawn from token windows already in memory ``LongTensor[N, T]``.

    For data tokenized elsewhere (and for tests). Like ``PackedTokens``, batch
    ``step`` is a pure function of ``(seed, step)``: a reshuffle every epoch.
    """

    def __init__(self, windows: torch.Tensor):
        if windows.dim() != 2 or len(windows) == 0:
            raise AutoCompressError("token windows must be a non-empty [N, seq_len] tensor")
        self.windows = windows.long()
        self._perms: dict[tuple[int, int], torch.Tensor] = {}

    def batch_at(self, step: int, batch_size: int, seed: int = 0) -> torch.Tensor:
        n = len(self.windows)
        rows = []
        for pos in range(step * batch_size, (step + 1) * batch_size):
            epoch, idx = divmod(pos, n)
            rows.append(int(self._permutation(seed, epoch)[idx]))
        return self.windows[rows]

    def _permutation(self, seed: int, epoch: int) -> torch.Tensor:
        if (seed, epoch) not in self._perms:
            self._perms = {}  # keep one epoch's order in memory
            gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
            self._perms[(seed, epoch)] = torch.randperm(len(self.windows), generator=gen)
        return self._perms[(seed, epoch)]


@dataclass
class DistillData:
    """Training stream + fixed held-out windows ``LongTensor[N, seq_len]``."""

    train: BatchSource
    heldout: torch.Tensor | None = None

    @classmethod
    def from_corpus(cls, tokenizer, corpus_dir: Path, seq_len: int,
                    heldout_windows: int = 64) -> DistillData:
        """The corpus's train split and the first windows of its held-out split."""
        from autocompress.data.tokens import PackedTokens

        train_data = PackedTokens(tokenizer, corpus_dir, "train", seq_len)
        heldout = PackedTokens(tokenizer, corpus_dir, "heldout", seq_len)
        return cls(train=train_data, heldout=heldout.windows[:heldout_windows])


class DistillResult(BaseModel):
    """What a run did; also written to ``<out_dir>/distill.json``."""

    out_dir: str
    steps: int
    tokens_seen: int
    seconds: float
    world_size: int
    bf16: bool = False
    bf16_probe: dict[str, float | str] = {}
    teacher_outputs: dict = {}
    final_loss: float
    teacher_eval: dict[str, float] = {}
    initial_eval: dict[str, float] = {}
    final_eval: dict[str, float] = {}
    history: list[dict[str, float]]
    evals: list[dict[str, float]]
    layer_map: dict[int, int] = {}
    config: dict


# ---------------------------------------------------------------- losses


def hidden_cosine_loss(student_hidden: list[torch.Tensor],
                       teacher_hidden: list[torch.Tensor]) -> torch.Tensor:
    """Mean over mapped pairs and tokens of ``1 − cos(h_student, h_teacher)``."""
    losses = [
        1 - F.cosine_similarity(s.float(), t.float(), dim=-1).mean()
        for s, t in zip(student_hidden, teacher_hidden, strict=True)
    ]
    return torch.stack(losses).mean()


def default_layer_map(student_layers: int, teacher_layers: int,
                      source_layers: list[int] | None = None) -> dict[int, int]:
    """Which teacher hidden state each student block's output should match.

    Indices are into ``output_hidden_states`` (0 = embeddings, i = output of
    block i). A pruned student records in ``config.source_layers`` the teacher
    block each of its blocks came from: block i then matches that block's
    output. Otherwise a student that kept the teacher's depth maps one to one,
    and a shallower one is spread evenly (round(i·L_t/L_s)), last to last.
    """
    if source_layers and len(source_layers) == student_layers:
        return {i + 1: int(src) + 1 for i, src in enumerate(source_layers)}
    return {i: round(i * teacher_layers / student_layers) for i in range(1, student_layers + 1)}


class DistillStudent(torch.nn.Module):
    """The student plus the (optional) projection of its hidden states.

    One module, so DDP/FSDP wrap and checkpoint both together. ``forward``
    returns the logits and, when hidden states are distilled, the mapped and
    projected student hidden states.
    """

    def __init__(self, student: torch.nn.Module, layer_map: dict[int, int] | None,
                 teacher_hidden_size: int | None = None):
        super().__init__()
        self.student = student
        self.layer_map = dict(layer_map or {})
        width = student.config.hidden_size
        self.projection = None
        if self.layer_map and teacher_hidden_size and teacher_hidden_size != width:
            self.projection = torch.nn.Linear(width, teacher_hidden_size, bias=False)
            # Start from a copy of the identity on the shared channels: pruning
            # kept the teacher's most important channels first.
            with torch.no_grad():
                self.projection.weight.zero_()
                self.projection.weight[: min(width, teacher_hidden_size)].fill_diagonal_(1.0)

    def forward(self, input_ids: torch.Tensor):
        wants_hidden = bool(self.layer_map)
        out = self.student(input_ids=input_ids, output_hidden_states=wants_hidden,
                           use_cache=False)
        if not wants_hidden:
            return out.logits, None
        hidden = [out.hidden_states[i] for i in self.layer_map]
        if self.projection is not None:
            hidden = [self.projection(h) for h in hidden]
        return out.logits, hidden


def make_loss_fn(teacher: torch.nn.Module, config: DistillConfig,
                 layer_map: dict[int, int]) -> Callable:
    """The training loss for ``training.train``: KD (+ α · hidden cosine)."""
    teacher_indices = list(layer_map.values())

    def loss_fn(engine: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t_out = teacher(input_ids=batch, output_hidden_states=bool(layer_map),
                            use_cache=False)
        logits, hidden = engine(batch)
        loss = kd_loss(logits, t_out.logits, config.temperature)
        if layer_map:
            t_hidden = [t_out.hidden_states[i] for i in teacher_indices]
            loss = loss + config.alpha * hidden_cosine_loss(hidden, t_hidden)
        return loss

    return loss_fn


# ---------------------------------------------------------------- evaluation


def _lm_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    logits = logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def _eval_batches(heldout: torch.Tensor | None, n: int, batch_size: int) -> list[torch.Tensor]:
    if heldout is None:
        return []
    batches = [heldout[i * batch_size:(i + 1) * batch_size] for i in range(n)]
    return [b for b in batches if len(b)]


def make_eval_fn(teacher: torch.nn.Module, batches: list[torch.Tensor],
                 device: torch.device) -> Callable[[torch.nn.Module], dict[str, float]]:
    """Held-out student LM loss/perplexity and KL to the teacher (T = 1)."""

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        lm, kd = 0.0, 0.0
        for batch in batches:
            batch = batch.to(device)
            logits, _ = model(batch)
            t_logits = teacher(input_ids=batch, use_cache=False).logits
            lm += float(_lm_loss(logits, batch))
            kd += float(kd_loss(logits, t_logits))
        n = max(1, len(batches))
        return {"heldout_loss": lm / n, "heldout_ppl": math.exp(lm / n), "heldout_kd": kd / n}

    return evaluate


def teacher_eval(teacher: torch.nn.Module, batches: list[torch.Tensor],
                 device: torch.device) -> dict[str, float]:
    """The teacher's own held-out loss: the ceiling the student tries to reach."""
    with torch.no_grad():
        losses = [float(_lm_loss(teacher(input_ids=b.to(device), use_cache=False).logits,
                                 b.to(device))) for b in batches]
    loss = sum(losses) / max(1, len(losses))
    return {"heldout_loss": loss, "heldout_ppl": math.exp(loss)} if losses else {}


# ---------------------------------------------------------------- the run


def default_work_dir(out_dir: Path) -> Path:
    """Checkpoints live next to the output: ``<out_dir>.work``."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".work")


@torch.enable_grad()  # callers may score under no_grad (the random ablation's final pick)
def distill(
    teacher: torch.nn.Module,
    student: torch.nn.Module,
    data: DistillData,
    config: DistillConfig,
    out_dir: Path,
    tokenizer=None,
    resume: bool = False,
    work_dir: Path | None = None,
    on_step: Callable[[int, float], None] | None = None,
    teacher_id: str | None = None,
    outputs_dir: Path | None = None,
    overwrite: bool = False,
) -> DistillResult:
    """Distil ``teacher`` into ``student`` for ``config.tokens`` tokens.

    Writes the final student to ``out_dir`` (with ``tokenizer`` if given and
    ``distill.json``). With ``resume`` it continues the checkpoint in
    ``work_dir`` exactly; without it an existing checkpoint is an error rather
    than silently overwritten; resuming a run that already finished returns
    its record. Under ``torchrun`` every rank calls this with the same
    arguments; only rank 0 writes. ``on_step(step, loss)`` runs after every
    optimizer step (tests interrupt runs from it). ``teacher_id`` names the
    teacher in the key of its cached outputs (default: a hash of its weights);
    ``outputs_dir`` is where they live (default ``$AUTOCOMPRESS_HOME/teacher-outputs``).
    """
    ctx = distributed.context()
    own_work_dir = work_dir is None
    out_dir, work_dir = Path(out_dir), Path(work_dir or default_work_dir(out_dir))
    _check_pair(teacher, student)
    finished = _finished_run(out_dir, work_dir, config) if resume else None
    if finished is not None:
        return finished
    check_out_dir(out_dir, overwrite)  # before the work, not after it (and locks it)
    claim_output(work_dir)  # a second run into the same --out is refused here, not later
    try:
        return _distill_claimed(teacher, student, data, config, out_dir, work_dir, own_work_dir,
                                tokenizer, resume, on_step, teacher_id, outputs_dir, overwrite,
                                ctx)
    finally:
        release_output(work_dir)
        release_output(out_dir)


def _distill_claimed(teacher, student, data: DistillData, config: DistillConfig,
                     out_dir: Path, work_dir: Path, own_work_dir: bool, tokenizer, resume: bool,
                     on_step, teacher_id, outputs_dir, overwrite: bool, ctx) -> DistillResult:
    """``distill`` once its output and work directories are claimed."""
    # Hashing the teacher's weights once serves the fingerprint and the output cache's key.
    teacher_id = teacher_id or model_digest(teacher)
    fingerprint = run_fingerprint(teacher, student, data, config, teacher_id)
    resuming = _prepare_work_dir(work_dir, config, resume, ctx, fingerprint)

    layer_map = _layer_map(teacher, student, config)
    student_cls = type(student)
    fsdp = ctx.enabled and config.parallel == "fsdp"
    device = ctx.device if ctx.enabled else next(student.parameters()).device
    module = DistillStudent(student, layer_map, teacher.config.hidden_size)
    if not fsdp:  # FSDP moves shards to the device itself
        module.to(device)
    # The caller may use the teacher afterwards: give back its flags and mode.
    trainable = [p.requires_grad for p in teacher.parameters()]
    was_training = teacher.training
    try:
        state, reference, run_info = _run(teacher, module, data, config, work_dir, layer_map,
                                          device, fsdp, ctx, on_step, teacher_id, outputs_dir,
                                          fingerprint, resuming)
    finally:
        for param, flag in zip(teacher.parameters(), trainable, strict=True):
            param.requires_grad_(flag)
        teacher.train(was_training)
    result = _result(out_dir, state, config, layer_map, reference, ctx)
    result.bf16 = run_info["bf16"]
    result.bf16_probe = run_info["bf16_probe"]
    result.teacher_outputs = run_info["teacher_outputs"]
    weights = _student_weights(module) if fsdp else None  # collective
    if ctx.is_main:
        # FSDP left the student's parameters sharded: rebuild a plain copy to save.
        final = student_cls(student.config) if fsdp else student
        _publish(out_dir, final, weights, tokenizer, result, overwrite)
        if not config.keep_checkpoints:
            _clean_work_dir(work_dir, own_work_dir)
    distributed.barrier(ctx)
    return result


def _run(teacher, module, data: DistillData, config: DistillConfig, work_dir: Path,
         layer_map: dict[int, int], device, fsdp: bool, ctx, on_step, teacher_id, outputs_dir,
         fingerprint: str, resuming: bool):
    """Reference scores, then the training loop; returns (TrainState, reference, run info).

    ``fingerprint``: this run's (``run_fingerprint``); ``resuming``: its own
    checkpoint is continued, so its saved reference scores may be reused."""
    teacher = _place_teacher(teacher, device, fsdp, ctx)
    eval_batches = _eval_batches(data.heldout, config.eval_batches, config.batch_size)
    eval_fn = make_eval_fn(teacher, eval_batches, device) if eval_batches else None
    # The untrained student is scored before FSDP shards it only without FSDP.
    reference = _reference_evals(work_dir, teacher, None if fsdp else module,
                                 eval_batches, device, ctx, fingerprint, resuming)

    def batch_fn(step: int) -> torch.Tensor:
        return data.train.batch_at(step, config.batch_size, config.seed)

    outputs = _teacher_outputs(teacher, data, config, layer_map, teacher_id, outputs_dir,
                               batch_fn)
    if outputs is not None:
        if ctx.is_main:  # one process computes the teacher's outputs; the others read them
            outputs.ensure(teacher, config.steps, device)
        distributed.barrier(ctx)
        # Under DDP each process takes a contiguous block of every global batch.
        first_row = ctx.rank * (config.batch_size // ctx.world_size) if ctx.enabled else 0
        loss = CachedTeacherLoss(outputs, batch_fn, config.temperature, device, first_row)
        loss_fn, batch_fn = loss, loss.batch
    else:
        loss_fn = make_loss_fn(teacher, config, layer_map)
    use_bf16, probe = choose_bf16(module, loss_fn, batch_fn, config, device, ctx)
    state = train(
        module, loss_fn, batch_fn,
        config.train_config(bf16=use_bf16), ckpt_dir=work_dir / "checkpoints", eval_fn=eval_fn,
        on_step=on_step, tokens_per_step=config.batch_size * config.seq_len,
        description="distill",
    )
    info = {"bf16": use_bf16, "bf16_probe": probe, "teacher_outputs": {}}
    if outputs is not None:
        info["teacher_outputs"] = {
            "dir": str(outputs.dir), "topk": outputs.topk,
            "steps_built": outputs.built_steps, "build_seconds": round(outputs.build_seconds, 3),
            "steps_reused": max(0, config.steps - outputs.built_steps)}
    return state, reference, info


# ---------------------------------------------------------------- teacher outputs and bf16


def _teacher_outputs(teacher, data: DistillData, config: DistillConfig, layer_map,
                     teacher_id: str | None, outputs_dir: Path | None,
                     batch_fn) -> TeacherOutputs | None:
    """The on-disk teacher outputs for this run, or None where they do not apply.

    Not with hidden-state matching (that needs the teacher's hidden states) nor
    with ``parallel="fsdp"`` (a sharded teacher runs on every rank at once); there
    the teacher runs live, in one process too, so that the result does not
    depend on the number of processes.
    """
    windows = getattr(data.train, "windows", None)
    if config.teacher_topk == 0 or layer_map or config.parallel == "fsdp" or windows is None:
        return None
    from autocompress.paths import home

    topk = min(config.teacher_topk, int(teacher.config.vocab_size))
    key = {"format": 1, "teacher": teacher_id or model_digest(teacher),
           "data": tensor_digest(windows), "batches": type(data.train).__name__,
           "batch_size": config.batch_size, "seed": config.seed, "topk": topk,
           "temperature": config.temperature}
    root = Path(outputs_dir) if outputs_dir else home() / "teacher-outputs"
    return TeacherOutputs(root, key, batch_fn, topk, config.temperature)


class CachedTeacherLoss:
    """The KD loss read from cached teacher outputs (``training.train``'s loss_fn).

    ``batch(step)`` is the loop's batch function: it remembers the step, so that
    each micro-batch (``grad_accum`` > 1 splits a step's rows in order, starting at
    this process's ``first_row``) is matched to its rows of the cache; the token
    ids are checked against the cache's.
    """

    def __init__(self, outputs: TeacherOutputs, batch_fn, temperature: float, device,
                 first_row: int = 0):
        self.outputs, self.batch_fn = outputs, batch_fn
        self.temperature, self.device = temperature, device
        self.first_row = first_row
        self.step, self.row = -1, first_row

    def batch(self, step: int) -> torch.Tensor:
        self.step, self.row = step, self.first_row
        return self.batch_fn(step)

    def __call__(self, engine: torch.nn.Module, micro: torch.Tensor) -> torch.Tensor:
        rows = self.outputs.rows(self.step, self.row, len(micro))
        self.row += len(micro)
        if not torch.equal(rows["tokens"].long(), micro.cpu().long()):
            raise RuntimeError(f"cached teacher outputs of step {self.step} do not match "
                               "the batch (the cache key missed a change in the data)")
        logits, _ = engine(micro)
        return cached_kd_loss(logits, rows["values"].to(self.device),
                              rows["indices"].to(self.device), rows["tail"].to(self.device),
                              self.temperature)


def choose_bf16(module, loss_fn, batch_fn, config: DistillConfig, device, ctx,
                rows: int = 2, repeats: int = 2) -> tuple[bool, dict[str, float]]:
    """bf16 autocast or fp32, whichever trains faster here: timed, not assumed.

    CPUs differ (AVX2 emulates bf16 and runs it slower; AVX-512/AMX runs it
    faster), so a few forward/backward passes on ``rows`` sequences of the first
    batch are timed each way, interleaved; bf16 must win by 5%. GPUs use bf16
    where supported; under torchrun, too, the measurement is skipped.

    The decision is measured once per machine and model size and then kept in
    ``$AUTOCOMPRESS_HOME/precision.json``: a timing taken on a busy machine
    must not make two runs with the same seed (or a run and its resume after a
    crash) train in different precisions.
    """
    if not config.bf16:
        return False, {}
    if device.type == "cuda" or ctx.enabled:
        return (device.type != "cuda" or torch.cuda.is_bf16_supported()), {}
    key = _precision_key(module)
    record = _precision_record()
    if key in record:
        return bool(record[key]["bf16"]), {**record[key]["probe"],
                                           "decided": "earlier on this machine"}
    probe = _time_precisions(module, loss_fn, batch_fn, device, rows, repeats)
    use_bf16 = probe["bf16_s"] < 0.95 * probe["fp32_s"]
    record[key] = {"bf16": use_bf16, "probe": probe}
    write_json_atomic(paths.home() / "precision.json", record, sort_keys=True)
    return use_bf16, {**probe, "decided": "measured now"}


def _precision_key(module) -> str:
    """This CPU, torch build and thread count, and the model's size to a factor of two."""
    machine = machine_summary()
    params = sum(p.numel() for p in module.parameters())
    return (f"{machine['cpu']}|{machine['cpu_capability']}|torch {machine['torch']}"
            f"|threads {machine['torch_threads']}|params 2^{max(params, 1).bit_length()}")


def _precision_record() -> dict:
    path = paths.home() / "precision.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _time_precisions(module, loss_fn, batch_fn, device, rows: int,
                     repeats: int) -> dict[str, float]:
    import time

    seconds = {"fp32": [], "bf16": []}
    for _ in range(repeats + 1):  # the first round warms up
        for mode in ("fp32", "bf16"):
            sample = batch_fn(0)[:rows].to(device)  # (re)sets a cached loss to step 0
            started = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mode == "bf16"):
                loss = loss_fn(module, sample)
            loss.backward()
            seconds[mode].append(time.perf_counter() - started)
    module.zero_grad(set_to_none=True)
    return {f"{mode}_s": min(times[1:]) for mode, times in seconds.items()}


def _finished_run(out_dir: Path, work_dir: Path, config: DistillConfig) -> DistillResult | None:
    """The record of a run that already completed with these settings, if any."""
    record = out_dir / "distill.json"
    if latest_checkpoint(work_dir / "checkpoints") is not None or not record.exists():
        return None
    result = DistillResult.model_validate_json(record.read_text())
    now = config.model_dump(mode="json")
    same = all(result.config.get(k) == v for k, v in now.items() if k not in _RESUMABLE_CHANGES)
    return result if same else None


def _check_pair(teacher: torch.nn.Module, student: torch.nn.Module) -> None:
    t_vocab, s_vocab = teacher.config.vocab_size, student.config.vocab_size
    if t_vocab != s_vocab:
        raise AutoCompressError(
            f"teacher and student vocabularies differ ({t_vocab} vs {s_vocab} tokens)",
            "distil a student pruned from this teacher (same tokenizer)",
        )


def _layer_map(teacher, student, config: DistillConfig) -> dict[int, int]:
    """Which hidden states to match (empty when the cosine term is off)."""
    if config.alpha == 0:
        return {}
    n_s, n_t = student.config.num_hidden_layers, teacher.config.num_hidden_layers
    source = getattr(student.config, "source_layers", None)
    layer_map = config.layer_map or default_layer_map(n_s, n_t, source)
    bad = {s: t for s, t in layer_map.items() if not (0 <= s <= n_s and 0 <= t <= n_t)}
    if bad:
        raise AutoCompressError(
            f"layer_map entries {bad} are out of range (student has {n_s} blocks, "
            f"teacher {n_t}; indices count hidden states, 0 = embeddings)",
            "fix layer_map or leave it unset for an even spread",
        )
    return dict(sorted(layer_map.items()))


def _place_teacher(teacher, device: torch.device, fsdp: bool, ctx) -> torch.nn.Module:
    """Freeze the teacher and put it where the student's batches will be."""
    teacher.eval()
    teacher.requires_grad_(False)
    if fsdp:
        return distributed.shard(teacher, ctx)  # a teacher too big for one device
    return teacher.to(device)


def run_fingerprint(teacher, student, data: DistillData, config: DistillConfig,
                    teacher_id: str | None) -> str:
    """What makes this run this run: its settings (those a resume may not change), the
    teacher, the student's shape (its weights come from the checkpoint on a resume) and
    the data. Work files carry it."""
    settings = {k: v for k, v in config.model_dump(mode="json").items()
                if k not in _RESUMABLE_CHANGES}
    windows = getattr(data.train, "windows", None)
    parts = {
        "settings": settings,
        "teacher": teacher_id or model_digest(teacher),
        "student": sorted((name, list(t.shape)) for name, t in student.state_dict().items()),
        "train": tensor_digest(windows) if windows is not None else type(data.train).__name__,
        "heldout": tensor_digest(data.heldout) if data.heldout is not None else None,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _prepare_work_dir(work_dir: Path, config: DistillConfig, resume: bool, ctx,
                      fingerprint: str) -> bool:
    """Refuse to clobber or mis-resume a checkpoint; record the config and fingerprint.

    True when this run resumes its own checkpoint."""
    saved = work_dir / "distill_config.json"
    has_ckpt = latest_checkpoint(work_dir / "checkpoints") is not None
    if has_ckpt and not resume:
        raise AutoCompressError(
            f"{work_dir} holds a checkpoint of an earlier distillation run",
            "pass --resume to continue it, or delete that folder to start over",
        )
    if has_ckpt:
        before = _read_json_object(saved)
        now = config.model_dump(mode="json")
        changed = sorted(k for k in now if k not in _RESUMABLE_CHANGES
                         and before.get(k) != now[k])
        if changed:
            raise AutoCompressError(
                f"cannot resume {work_dir} with different settings: {', '.join(changed)}",
                "resume with the original settings, or delete the folder to start over",
            )
        if before.get("run_fingerprint") != fingerprint:
            raise AutoCompressError(
                f"the checkpoint in {work_dir} belongs to another run (another student, "
                "teacher or data, or its record is missing) and is not resumed",
                f"delete {work_dir} to start over, or resume with the original inputs",
            )
    distributed.barrier(ctx)  # every rank has checked before rank 0 writes
    if ctx.is_main:
        work_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(saved, {**config.model_dump(mode="json"),
                                  "run_fingerprint": fingerprint}, indent=1)
    distributed.barrier(ctx)
    return has_ckpt


def _read_json_object(path: Path) -> dict:
    """A JSON object from ``path``; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _reference_evals(work_dir: Path, teacher, module, batches, device, ctx,
                     fingerprint: str, resuming: bool) -> dict:
    """Teacher and untrained-student held-out scores, computed once per run.

    A saved ``reference_eval.json`` is reused only by the resume of the run that
    wrote it (same fingerprint, its checkpoint present): one left by a killed run
    of another student would otherwise be reported as this student's "before".
    """
    path = work_dir / "reference_eval.json"
    saved = _read_json_object(path)
    if resuming and saved.get("run_fingerprint") == fingerprint:
        return {k: v for k, v in saved.items() if k != "run_fingerprint"}
    if not batches:
        return {"teacher": {}, "initial": {}}
    reference = {"teacher": teacher_eval(teacher, batches, device), "initial": {}}
    if module is not None:
        module.eval()
        with torch.no_grad():
            reference["initial"] = make_eval_fn(teacher, batches, device)(module)
        module.train()
    if ctx.is_main:
        write_json_atomic(path, {**reference, "run_fingerprint": fingerprint}, indent=1)
    distributed.barrier(ctx)
    return reference


def _result(out_dir: Path, state: TrainState, config: DistillConfig,
            layer_map: dict[int, int], reference: dict, ctx) -> DistillResult:
    return DistillResult(
        out_dir=str(out_dir), steps=state.step,
        tokens_seen=state.step * config.batch_size * config.seq_len,
        seconds=round(state.seconds, 3), world_size=ctx.world_size,
        final_loss=state.history[-1]["loss"] if state.history else float("nan"),
        teacher_eval=reference.get("teacher", {}), initial_eval=reference.get("initial", {}),
        final_eval={k: v for k, v in (state.evals[-1] if state.evals else {}).items()
                    if k != "step"},
        history=state.history, evals=state.evals, layer_map=layer_map,
        config=config.model_dump(mode="json"),
    )


def _student_weights(module: DistillStudent) -> dict[str, torch.Tensor]:
    """The student's full weights (without the projection), on CPU."""
    full = distributed.full_model_state(module)
    prefix = "student."
    return {k[len(prefix):]: v for k, v in full.items() if k.startswith(prefix)}


def _publish(out_dir: Path, model, weights, tokenizer, result: DistillResult,
             overwrite: bool) -> None:
    """Write the final student to a temp dir, then swap it in."""
    if weights is not None:
        model.load_state_dict(weights)
    with publishing_dir(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / "distill.json", result.model_dump(mode="json"), indent=1)


def _clean_work_dir(work_dir: Path, own: bool) -> None:
    """Drop the checkpoints: the whole default dir, or only our files in a given one."""
    if own:
        remove_path(work_dir)
        return
    for name in ("checkpoints", "distill_config.json", "reference_eval.json"):
        remove_path(work_dir / name)
