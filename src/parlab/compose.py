"""Compose strategies on a mesh: ``parallelize(model, topology)`` turns a single-device model into what one
rank runs (chapter 07; chapters 03–06 each use one axis of it).

The order matters, and it is the one torchtitan uses:

1. **Pipeline split** (``pp``) first: a stage is then an ordinary, smaller model, and everything below
   applies to it alone. Stages hold whole blocks, so the model must be an ``nn.Sequential`` of blocks.
2. **Tensor parallelism** (``tp``) next: it replaces weights by DTensor shards on the ``tp`` axis and
   inserts the all-reduces inside each block. It must see the plain modules (``up``, ``down``) to do so.
3. **Activation checkpointing**: each block's forward is recomputed during backward. After TP, so the
   recomputation includes TP's collectives; before data parallelism, so that FSDP's gathers wrap the
   checkpointed block and are redone with it.
4. **Data parallelism** (``dp``) last: it needs the final parameters — FSDP2 shards the (possibly
   already TP-sharded) parameters once more along ``dp``; DDP averages each parameter's (local) gradient
   over the ``dp`` group.
5. The **pipeline schedule** wraps the finished stage: it only calls the stage's forward and backward.

Every strategy receives the group (or 1-D mesh) of its own axis from the topology and nothing else.
The data-parallel choices are PyTorch's (``"fsdp"``: FSDP2 ``fully_shard``; ``"ddp"``:
``DistributedDataParallel``) or the course's own DDP (``"course-ddp"``, chapter 03), so that chapter 07 can
compose the from-scratch strategies and PyTorch's through the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from parlab import runtime
from parlab.checks import positive_int
from parlab.parallel.topology import Topology

DATA_PARALLEL = ("fsdp", "ddp", "course-ddp", "none")
SCHEDULES = ("gpipe", "1f1b")


class Checkpointed(nn.Module):
    """Runs ``block`` without keeping its activations; backward recomputes them (Chen et al. 2016)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


def blocks_tp_plan(model: nn.Module) -> dict:
    """Megatron's plan for ``parlab.models.ResidualBlock`` stacks: ``up`` split by columns, ``down`` by
    rows, so each block needs one all-reduce in forward and one in backward (chapter 05)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for name, module in model.named_modules():
        if hasattr(module, "up") and hasattr(module, "down"):
            prefix = f"{name}." if name else ""
            plan[f"{prefix}up"] = ColwiseParallel()  # (batch, 4 hidden / tp) on each rank
            plan[f"{prefix}down"] = RowwiseParallel()  # partial sums, all-reduced to (batch, hidden)
    if not plan:
        raise ValueError("no block with `up` and `down` linears to split: pass tp_plan={module name: "
                         "ColwiseParallel() | RowwiseParallel() ...} for this model")
    return plan


@dataclass
class Parallelized:
    """What one rank runs: its ``model`` (the whole model or its pipeline stage, wrapped), the pipeline
    ``schedule`` when ``pp > 1``, and what must run after each backward (the course's DDP syncs then)."""

    topology: Topology
    model: nn.Module
    loss_fn: Callable
    schedule: object = None
    after_backward: list = field(default_factory=list)

    def forward_backward(self, x, y):
        """One step's forward and backward on this rank's share of the batch; returns the loss on the
        ranks that compute it (every rank without a pipeline, the last stage with one), else ``None``."""
        topo = self.topology
        loss = None
        if self.schedule is None:
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
        else:
            losses: list = []
            if topo.is_first_stage:
                self.schedule.step(x, target=y if topo.is_last_stage else None, losses=losses)
            elif topo.is_last_stage:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
            if topo.is_last_stage:  # the mean of equal-sized micro-batch losses = the batch's loss
                loss = torch.stack(losses).mean()
        for fn in self.after_backward:
            fn()
        return loss

    def global_loss(self, loss) -> float:
        """The loss over the global batch, the same on every rank: from the last pipeline stage to the
        others, then averaged over the data-parallel replicas (each had an equal shard)."""
        topo = self.topology
        value = loss.detach().clone() if loss is not None else torch.zeros((), device=runtime.device())
        if topo.pp > 1:
            last = dist.get_global_rank(topo.group("pp"), topo.pp - 1)
            dist.broadcast(value, src=last, group=topo.group("pp"))
        if topo.dp > 1:
            dist.all_reduce(value, group=topo.group("dp"))
        return value.item() / topo.dp


def parallelize(model: nn.Module, topology: Topology, *, data_parallel: str = "fsdp", tp_plan: dict | None = None,
                checkpointing: bool = False, schedule: str = "gpipe", num_micro_batches: int = 4,
                loss_fn: Callable = F.mse_loss, on_collective=None) -> Parallelized:
    """Apply the axes of ``topology`` to ``model`` in the order of the module docstring; run on every rank.

    data_parallel: ``"fsdp"`` (FSDP2, ZeRO-3), ``"ddp"`` (PyTorch's DDP), ``"course-ddp"`` (chapter 03's),
    or ``"none"``; used when ``topology.dp > 1``. tp_plan: DTensor plan (default :func:`blocks_tp_plan`).
    schedule, num_micro_batches: the pipeline's, when ``topology.pp > 1``. on_collective: passed to the
    course's strategies, which report each collective to it.
    """
    if data_parallel not in DATA_PARALLEL:
        raise ValueError(f"data_parallel={data_parallel!r}; choose one of {', '.join(map(repr, DATA_PARALLEL))}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}; choose one of {', '.join(map(repr, SCHEDULES))}")
    positive_int("num_micro_batches", num_micro_batches, "micro-batches per pipeline step")
    if topology.mesh is None:
        raise ValueError("topology has no DeviceMesh: build it on the ranks with Topology.build(...) or "
                         "topology.built()")
    device = runtime.device()
    model = model.to(device)
    after_backward = []

    # 1. pipeline split: this rank keeps its stage's blocks
    if topology.pp > 1:
        if not isinstance(model, nn.Sequential) or len(model) % topology.pp:
            raise ValueError(f"a pipeline of pp={topology.pp} stages splits an nn.Sequential into equal runs of "
                             f"blocks; got {type(model).__name__} with "
                             f"{len(model) if isinstance(model, nn.Sequential) else '?'} blocks")
        per_stage = len(model) // topology.pp
        model = model[topology.pp_stage * per_stage:(topology.pp_stage + 1) * per_stage]

    # 2. tensor parallelism inside each block
    if topology.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, topology.submesh("tp"), tp_plan if tp_plan is not None else blocks_tp_plan(model))

    # 3. activation checkpointing, block by block
    if checkpointing:
        if not isinstance(model, nn.Sequential):
            raise ValueError("checkpointing=True wraps each block of an nn.Sequential")
        model = nn.Sequential(*[Checkpointed(block) for block in model])

    # 4. data parallelism over the dp axis
    if topology.dp > 1 and data_parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # Within a pipeline step, a stage runs several micro-batches: keep its weights gathered between
        # forward and backward instead of gathering them again for every micro-batch.
        reshard = topology.pp == 1
        for block in model.children() if isinstance(model, nn.Sequential) else ():
            fully_shard(block, mesh=topology.submesh("dp"), reshard_after_forward=reshard)
        fully_shard(model, mesh=topology.submesh("dp"), reshard_after_forward=reshard)
    elif topology.dp > 1 and data_parallel == "ddp":
        if topology.tp > 1:
            raise ValueError("PyTorch's DDP does not take the DTensor parameters that tensor parallelism makes: "
                             "with tp > 1 use data_parallel='fsdp' or 'course-ddp'")
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, process_group=topology.group("dp"),
                                        device_ids=[device.index] if device.type == "cuda" else None)
    elif topology.dp > 1 and data_parallel == "course-ddp":
        from parlab.parallel.ddp import DDPBuckets, DDPOverlap

        # A pipeline runs one backward per micro-batch: v2 waits for sync_gradients() after the last one,
        # where v3's hooks would send every micro-batch's gradients.
        wrapper = DDPBuckets if topology.pp > 1 else DDPOverlap
        model = wrapper(model, process_group=topology.group("dp"), on_collective=on_collective)
        after_backward.append(model.sync_gradients)

    # 5. the pipeline schedule drives the finished stage
    pipeline = None
    if topology.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage = PipelineStage(model, topology.pp_stage, topology.pp, device, group=topology.group("pp"))
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        pipeline = kind(stage, num_micro_batches, loss_fn=loss_fn)
    return Parallelized(topology, model, loss_fn, pipeline, after_backward)
