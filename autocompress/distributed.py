"""Multi-process training through ``torch.distributed`` (launched by ``torchrun``).

The training loop (``autocompress.training``) calls these helpers so that one
code path runs in a single process and under ``torchrun --nproc_per_node N``:

- every optimizer step consumes one *global* batch; each rank takes a disjoint
  slice of it and splits that slice into ``grad_accum`` micro-batches, so
  world size × accumulation × micro-batch = the same global batch a
  single process would see (the loss curve does not depend on the launch);
- ``ddp`` replicates the model (``DistributedDataParallel``); ``fsdp`` shards
  parameters, gradients and optimizer state over ranks (FSDP2,
  ``torch.distributed.fsdp.fully_shard``) for models that do not fit one GPU;
- gloo on CPU, NCCL on GPUs; only rank 0 writes files and prints.

Checkpoints are written as *full* (unsharded) state dicts, so a run may be
resumed with a different number of processes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from autocompress.errors import AutoCompressError
from autocompress.modeling.blocks import decoder_layers

Strategy = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class DistContext:
    """Who this process is within the job (a single process is rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


def context() -> DistContext:
    """The current process's place in the job, from the initialised process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistContext()
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())),
        backend=dist.get_backend(),
    )


def init_from_env(backend: str | None = None) -> DistContext:
    """Join the process group that ``torchrun`` describes in the environment.

    A plain ``python`` launch (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) stays a
    single process. The backend defaults to NCCL when CUDA is available, else gloo.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return context()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return context()


def shutdown() -> None:
    """Leave the process group (safe to call when none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def local_micro_batches(
    batch: torch.Tensor, ctx: DistContext, grad_accum: int
) -> list[torch.Tensor]:
    """This rank's share of a global batch, as ``grad_accum`` equal micro-batches.

    Rows are dealt in contiguous blocks: rank r gets micro-batches
    ``r·A … r·A + A − 1`` of the ``world·A`` equal pieces of the global batch.
    """
    pieces = ctx.world_size * grad_accum
    if batch.shape[0] % pieces:
        raise AutoCompressError(
            f"a global batch of {batch.shape[0]} rows cannot be split into "
            f"{ctx.world_size} processes x {grad_accum} accumulation steps",
            "choose a batch size divisible by processes x grad_accum",
        )
    micro = batch.shape[0] // pieces
    first = ctx.rank * grad_accum
    return [batch[(first + i) * micro:(first + i + 1) * micro] for i in range(grad_accum)]


def wrap(model: torch.nn.Module, ctx: DistContext, strategy: Strategy) -> torch.nn.Module:
    """Prepare ``model`` for training in this job; returns what the loss should call.

    Single process: the model itself, where it is. ``ddp``: a
    ``DistributedDataParallel`` wrapper around it (``.module`` is the model).
    ``fsdp``: the model itself, sharded in place, one unit per decoder layer.
    """
    if not ctx.enabled:
        return model
    if strategy == "ddp":
        model.to(ctx.device)
        device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if strategy == "fsdp":
        shard(model, ctx)
        return model
    raise AutoCompressError(f"unknown parallel strategy {strategy!r}", "use ddp or fsdp")


def shard(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """Shard ``model`` with FSDP2: each decoder layer is one unit, the rest the root.

    Also used for a frozen teacher: its forward then gathers one layer at a time.
    Embeddings and LM head stay in the root unit, so tied weights stay tied.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for block in decoder_layers(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model behind a DDP wrapper (FSDP2 shards in place: itself)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def is_sharded(model: torch.nn.Module) -> bool:
    """True for a model sharded by FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(unwrap(model), FSDPModule)


def no_sync(model: torch.nn.Module, skip: bool):
    """Skip DDP's gradient all-reduce for all but the last accumulation micro-batch."""
    if skip and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def mean_over_ranks(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The mean of a scalar tensor across ranks (itself in a single process)."""
    if not ctx.enabled:
        return value
    out = value.detach().clone().to(ctx.device)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / ctx.world_size


def gather_objects(obj, ctx: DistContext) -> list:
    """Every rank's ``obj`` in rank order (``[obj]`` in a single process)."""
    if not ctx.enabled:
        return [obj]
    out: list = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op in a single process)."""
    if ctx.enabled:
        dist.barrier()


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """An unsharded CPU copy of the weights; collective for FSDP (rank 0 gets it)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Unsharded optimizer state keyed by parameter name; collective (rank 0 gets it)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict
) -> None:
    """Load full (unsharded, name-keyed) states into a possibly sharded model."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=options)
    # The loader only fills keys the fresh optimizer already has; a scheduler
    # adds ``initial_lr`` to the groups later, so declare the saved keys first.
    for group, saved in zip(optimizer.param_groups, optim_sd.get("param_groups", []),
                            strict=False):
        for key, value in saved.items():
            if key != "params":
                group.setdefault(key, value)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=options)
