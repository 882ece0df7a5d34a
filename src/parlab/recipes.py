"""Training loops, one per strategy, shared by the notebooks and the scripts in ``examples/``.

Each ``train_*`` function is what every rank runs: in a notebook through ``parlab.launch(train_ddp, 4)``,
on a cluster through ``torchrun ... examples/ddp.py``, which calls the very same function. It trains a
small residual MLP (``parlab.models.tiny_blocks``) on a synthetic regression task and returns the loss of each step over the global
batch, identical on every rank, so that runs can be compared across strategies and launchers:
:func:`train_single` is the one-process reference they all must match.

These use PyTorch's own implementation of each strategy (DDP, FSDP2 ``fully_shard``, DTensor
``parallelize_module``, ``torch.distributed.pipelining``); the chapters build each from scratch and check it
against them. Chapter 00 ("From notebook to cluster") shows how to run them on several nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

from parlab import runtime
from parlab.models import regression_batch, shard, tiny_blocks

HIDDEN = 16
NUM_BLOCKS = 4
LR = 0.05


def make_model(seed: int = 0) -> nn.Sequential:
    """The same initial weights on every rank and in the reference, from ``seed``."""
    return tiny_blocks(NUM_BLOCKS, HIDDEN, seed)


def make_batch(step: int, global_batch: int, seed: int = 0):
    """The global batch of ``step``: the same on every rank, regardless of launcher or strategy."""
    return regression_batch(global_batch, HIDDEN, HIDDEN, seed=seed * 100_003 + step)


def _mean_over_ranks(loss: torch.Tensor, group=None, size: int | None = None) -> float:
    loss = loss.detach().clone()
    dist.all_reduce(loss, group=group)
    return loss.item() / (size or dist.get_world_size(group))


def train_single(steps: int = 5, global_batch: int = 16, seed: int = 0) -> list[float]:
    """The reference: one process, the whole batch."""
    model = make_model(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = make_batch(step, global_batch, seed)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _data_parallel_loop(model, steps, global_batch, seed, dp_rank, dp_size) -> list[float]:
    device = runtime.device()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = (t.to(device) for t in shard(make_batch(step, global_batch, seed), dp_rank, dp_size))
        loss = F.mse_loss(model(x), y)  # mean over this rank's shard; gradients are averaged over ranks
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(_mean_over_ranks(loss))
    return losses


def train_ddp(steps: int = 5, global_batch: int = 16, seed: int = 0) -> list[float]:
    """Data parallel: every rank holds the whole model and a 1/n slice of the batch (chapter 03)."""
    device = runtime.device()
    model = DDP(make_model(seed=seed).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    return _data_parallel_loop(model, steps, global_batch, seed, dist.get_rank(), dist.get_world_size())


def train_zero(steps: int = 5, global_batch: int = 16, seed: int = 0) -> list[float]:
    """ZeRO-3 / FSDP2: parameters, gradients and optimizer state sharded across ranks (chapter 04)."""
    model = make_model(seed=seed).to(runtime.device())
    for block in model:
        fully_shard(block)  # each block is gathered just before use and freed after
    fully_shard(model)
    return _data_parallel_loop(model, steps, global_batch, seed, dist.get_rank(), dist.get_world_size())


def _tensor_parallel(model: nn.Sequential, mesh) -> None:
    plan = {}
    for i in range(len(model)):
        plan[f"{i}.up"] = ColwiseParallel()  # (batch, 4 hidden / tp_size) on each rank
        plan[f"{i}.down"] = RowwiseParallel()  # partial sums, all-reduced to (batch, hidden)
    parallelize_module(model, mesh, plan)


def train_tp(steps: int = 5, global_batch: int = 16, seed: int = 0) -> list[float]:
    """Tensor parallel: every layer split across ranks, the whole batch on every rank (chapter 05)."""
    device = runtime.device()
    model = make_model(seed=seed).to(device)
    _tensor_parallel(model, init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("tp",)))
    return _data_parallel_loop(model, steps, global_batch, seed, 0, 1)


def train_pp(steps: int = 5, global_batch: int = 16, seed: int = 0, num_micro_batches: int = 4) -> list[float]:
    """Pipeline parallel (GPipe): rank r holds the r-th group of blocks; micro-batches flow through
    (chapter 06)."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), runtime.device()
    if NUM_BLOCKS % n:
        raise ValueError(f"train_pp splits {NUM_BLOCKS} blocks into equal stages: world_size must divide "
                         f"{NUM_BLOCKS}; got {n}")
    per_stage = NUM_BLOCKS // n
    stage_module = make_model(seed)[rank * per_stage:(rank + 1) * per_stage].to(device)
    stage = PipelineStage(stage_module, rank, n, device)
    schedule = ScheduleGPipe(stage, num_micro_batches, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(stage_module.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = (t.to(device) for t in make_batch(step, global_batch, seed))
        opt.zero_grad()
        micro_losses = []
        if rank == 0:
            schedule.step(x)
        elif rank == n - 1:
            schedule.step(target=y, losses=micro_losses)
        else:
            schedule.step()
        opt.step()
        # Only the last stage knows the loss: the mean of the (equal-sized) micro-batch losses.
        loss = torch.stack(micro_losses).mean().detach() if rank == n - 1 else torch.zeros((), device=device)
        dist.broadcast(loss, src=n - 1)
        losses.append(loss.item())
    return losses


def train_2d(steps: int = 5, global_batch: int = 16, seed: int = 0, tp_size: int = 2) -> list[float]:
    """FSDP2 across the ``dp`` axis and tensor parallelism within the ``tp`` axis of a 2-D mesh
    (chapter 07). TP is applied first: FSDP then shards the already-split parameters."""
    n, device = dist.get_world_size(), runtime.device()
    if n % tp_size:
        raise ValueError(f"world_size={n} must be a multiple of tp_size={tp_size}")
    mesh = init_device_mesh(device.type, (n // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    model = make_model(seed=seed).to(device)
    _tensor_parallel(model, mesh["tp"])
    for block in model:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return _data_parallel_loop(model, steps, global_batch, seed, mesh["dp"].get_local_rank(), n // tp_size)


STRATEGIES = {"ddp": train_ddp, "zero": train_zero, "tp": train_tp, "pp": train_pp, "2d": train_2d}


def script_main(train, argv: list[str] | None = None) -> None:
    """The body of each script in ``examples/``: run ``train`` with ``parlab.launch``.

    Started by torchrun or SLURM, each process is one rank of that job; started with plain ``python``,
    it launches ``--world-size`` ranks itself. Rank 0 prints the losses and, with ``--out``, writes them
    as JSON.
    """
    import parlab

    parser = argparse.ArgumentParser(description=(train.__doc__ or "").splitlines()[0])
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 4)))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the losses as JSON to this file (rank 0)")
    args = parser.parse_args(argv)
    result = parlab.launch(train, args.world_size, kwargs={"steps": args.steps, "global_batch": args.global_batch},
                           output="rank0")
    from parlab.launch.cluster import current_job

    losses = result if current_job() else result[0]  # a job returns this rank's value, else one per rank
    if runtime.rank() == 0:
        print("losses:", " ".join(f"{v:.6f}" for v in losses))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(losses, f)
    sys.stdout.flush()
