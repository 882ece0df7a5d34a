"""Compose strategies on a mesh: ``parallelize(model, topology)`` turns a single-device model into what one
rank runs (chapter 07; chapters 03–06 each use one axis of it).

The order matters, and it is the one torchtitan uses:

1. **Pipeline split** (``pp``) first: a stage is then an ordinary, smaller model, and everything below
   applies to it alone: a rank never splits, wraps or shards the layers other stages hold.
2. **Tensor parallelism** (``tp``) next: it replaces weights by shards on the ``tp`` axis and inserts the
   all-reduces inside each block. It must see the plain modules (``up``, ``down``; ``c_attn``, ``q_proj``)
   to find them by name, before any wrapper hides them.
3. **Activation checkpointing**: each block's forward is recomputed during backward. After TP, so the
   recomputation includes TP's collectives; before data parallelism, so that FSDP's gathers wrap the
   checkpointed block and are redone with it.
4. **Data parallelism** (``dp``) last: it needs the final parameters — FSDP2 shards the (possibly
   already TP-sharded) parameters once more along ``dp``; DDP averages each parameter's (local) gradient
   over the ``dp`` group; the course's ZeRO-1 lays this rank's (stage's, TP shard's) parameters in one
   flat buffer and shards the optimizer state over ``dp``. The optimizer is made here too, since ZeRO-1
   *is* the optimizer.
5. The **pipeline schedule** wraps the finished stage: it only calls the stage's forward and backward.

Every strategy receives the group (or 1-D mesh) of its own axis from the topology and nothing else. Each
axis has PyTorch's implementation and the course's own (:data:`PYTORCH`, :data:`COURSE`); any choice per
axis composes, except that PyTorch's DDP and the course's ZeRO-1 cannot take DTensor parameters.
What parallelize must know of a model (its stages, TP plan, loss) is in ``parlab.lab.compose_models``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from parlab.lab import runtime
from parlab.lab.checks import positive_int
from parlab.lab.compose_models import TENSOR_PARALLEL, Checkpointed, blocks_tp_plan, model_kind  # noqa: F401
from parlab.lab.parallel.pipeline import record_stage
from parlab.lab.topology import AXES, Topology

DATA_PARALLEL = ("fsdp", "ddp", "course-ddp", "course-zero1", "none")
PIPELINES = ("torch", "course")
SCHEDULES = ("gpipe", "1f1b")
#: PyTorch's strategy on every axis: FSDP2, DTensor TP, torch.distributed.pipelining.
PYTORCH = {"data_parallel": "fsdp", "tensor_parallel": "dtensor", "pipeline": "torch"}
#: The course's own: ZeRO-1 (chapter 04), Megatron TP (05), the pipeline executor (06).
COURSE = {"data_parallel": "course-zero1", "tensor_parallel": "course", "pipeline": "course"}


@dataclass
class Parallelized:
    """What one rank runs: its ``model`` (the whole model or its pipeline stage, wrapped), the
    ``optimizer`` over its parameters (for ZeRO-1 the ZeRO object itself: it owns the optimizer), the
    pipeline when ``pp > 1``, and what must run after each backward (the course's DDP syncs then)."""

    topology: Topology
    model: nn.Module
    loss_fn: Callable
    optimizer: object
    pipeline: object = None
    stage: object = None  # torch.distributed.pipelining's PipelineStage, to record its operations
    after_backward: list = field(default_factory=list)

    def forward_backward(self, x, y):
        """One step's forward and backward on this rank's share of the batch; returns the loss on the
        ranks that compute it (every rank without a pipeline, the last stage with one), else ``None``.
        An attached ``parlab.lab.measure.Timeline`` (``with Timeline() as tl:``) receives the pipeline's
        operations."""
        topo = self.topology
        loss = None
        if self.pipeline is None:
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
        else:
            first, last = topo.is_first_stage, topo.is_last_stage
            if self.stage is None:  # the course's executor: it takes what its stages need of x and y
                losses = self.pipeline.step(x, y)
            else:
                losses = []
                self.pipeline.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
            if last:  # the mean of equal-sized micro-batch losses = the batch's loss
                loss = torch.stack(losses).mean()
        for fn in self.after_backward:
            fn()
        return loss

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def memory(self):
        """The bytes of weights, gradients and optimizer state this rank holds (``measure_memory``); call
        after a step, before ``zero_grad``."""
        from parlab.lab.measure import measure_memory

        return measure_memory(self.model, getattr(self.optimizer, "optimizer", self.optimizer))

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


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; choose one of {', '.join(map(repr, allowed))}")


def parallelize(model: nn.Module, topology: Topology, *, data_parallel: str = "fsdp",
                tensor_parallel: str = "dtensor", pipeline: str = "torch", tp_plan: dict | None = None,
                checkpointing: bool = False, schedule: str = "gpipe", num_micro_batches: int = 4,
                loss_fn: Callable | None = None, optimizer=torch.optim.SGD,
                optimizer_kwargs: dict | None = None, reshard_after_forward: bool | None = None) -> Parallelized:
    """Apply the axes of ``topology`` to ``model`` in the order of the module docstring; run on every rank.

    model: an ``nn.Sequential`` of blocks, or a transformers GPT-2 or Llama (no pipeline for Llama).
    data_parallel (when ``topology.dp > 1``): ``"fsdp"`` (FSDP2, ZeRO-3), ``"ddp"`` (PyTorch's DDP),
    ``"course-ddp"`` (chapter 03), ``"course-zero1"`` (chapter 04's ZeRO-1) or ``"none"``.
    tensor_parallel: ``"dtensor"`` or ``"course"`` (chapter 05); tp_plan: a plan for the stage instead of
    the model's own. pipeline: ``"torch"`` (``torch.distributed.pipelining``) or ``"course"`` (chapter 06's
    executor); schedule, num_micro_batches: its schedule. loss_fn: default the model's (mean squared
    error; next-token cross-entropy, vocabulary-parallel under the course's TP). optimizer,
    optimizer_kwargs: the optimizer class and its arguments (default ``{"lr": 0.05}``).
    reshard_after_forward: FSDP2's flag (``data_parallel="fsdp"``); None: False with a pipeline, whose
    micro-batches then reuse the gathered weights, True (FSDP2's default) without one. The course's
    strategies record each collective into any attached ``CommLog`` (``with CommLog() as log:``).
    """
    _check(topology, data_parallel, tensor_parallel, pipeline, schedule, num_micro_batches, reshard_after_forward)
    device = runtime.device()
    kind = model_kind(model.to(device))
    optimizer_kwargs = {"lr": 0.05} if optimizer_kwargs is None else optimizer_kwargs

    # 1. pipeline split: this rank keeps its stage's layers (the whole model without a pipeline)
    part = kind.stage(topology.pp, topology.pp_stage) if topology.pp > 1 else kind.whole()

    # 2. tensor parallelism inside each block
    tp_group = topology.group("tp")
    if topology.tp > 1:
        kind.tensor_parallel(part, tensor_parallel, topology.submesh("tp"), tp_plan)
    loss_fn = loss_fn or kind.loss_fn(tensor_parallel if topology.tp > 1 else None, tp_group)

    # 3. activation checkpointing, block by block
    if checkpointing:
        kind.checkpoint(part)

    # 4. data parallelism over the dp axis, and the optimizer
    part, opt, after_backward = _data_parallel(part, kind, topology, data_parallel, device, optimizer,
                                               optimizer_kwargs, pipelined=topology.pp > 1,
                                               reshard_after_forward=reshard_after_forward)

    # 5. the pipeline schedule drives the finished stage
    runner, stage = None, None
    if topology.pp > 1 and pipeline == "course":
        from parlab.lab.parallel import pipeline_schedule as ps

        order = {"gpipe": ps.gpipe, "1f1b": ps.one_f_one_b}[schedule](topology.pp, num_micro_batches)
        runner = _LazyPipeline(part, order, kind.boundary_shape, loss_fn=loss_fn, group=topology.group("pp"))
    elif topology.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        # The schedule divides the gradients of the module it is given by the number of micro-batches;
        # ZeRO-1's master shards alias its module's gradients, so it gets the module (same forward).
        module = part.module if data_parallel == "course-zero1" and topology.dp > 1 else part
        # its operations become spans on an attached Timeline, as the course's executor's do
        stage = record_stage(PipelineStage(module, topology.pp_stage, topology.pp, device, group=topology.group("pp")))
        runner = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule](stage, num_micro_batches, loss_fn=loss_fn)
    return Parallelized(topology, part, loss_fn, opt, runner, stage, after_backward)


def _check(topology: Topology, data_parallel: str, tensor_parallel: str, pipeline: str, schedule: str,
           num_micro_batches: int, reshard_after_forward: bool | None = None) -> None:
    """:func:`parallelize`'s choices, each one of its kind, and the pairs of them that cannot work together."""
    if reshard_after_forward not in (None, True, False):
        raise ValueError(f"reshard_after_forward={reshard_after_forward!r}; choose True, False or None "
                         "(None: False with a pipeline, True without)")
    _choice("data_parallel", data_parallel, DATA_PARALLEL)
    _choice("tensor_parallel", tensor_parallel, TENSOR_PARALLEL)
    _choice("pipeline", pipeline, PIPELINES)
    _choice("schedule", schedule, SCHEDULES)
    positive_int("num_micro_batches", num_micro_batches, "micro-batches per pipeline step")
    if topology.mesh is None:
        raise ValueError("topology has no DeviceMesh: build it on the ranks with Topology.build(...) or "
                         "topology.built()")
    if topology.tp > 1 and tensor_parallel == "dtensor" and topology.dp > 1:
        if data_parallel == "ddp":
            raise ValueError("PyTorch's DDP does not take the DTensor parameters that tensor parallelism makes: "
                             "with tp > 1 use data_parallel='fsdp' or 'course-ddp'")
        if data_parallel == "course-zero1":
            raise ValueError("the course's ZeRO-1 lays parameters into one flat buffer, which DTensor parameters "
                             "cannot join: with tensor_parallel='dtensor' use data_parallel='fsdp'")


def _data_parallel(part, kind, topology, how, device, optimizer, optimizer_kwargs, pipelined,
                   reshard_after_forward=None):
    """(the module to run, its optimizer, what runs after each backward) for the ``dp`` axis."""
    if topology.dp == 1 or how == "none":
        return part, optimizer(part.parameters(), **optimizer_kwargs), []
    if how == "course-zero1":
        from parlab.lab.parallel.zero import ZeroStage1

        # Stage 1 keeps whole gradients, which a pipeline's micro-batches accumulate into; the one
        # reduce-scatter and all-gather come at step(), once per step however many micro-batches ran.
        zero = ZeroStage1(part, optimizer, process_group=topology.group("dp"), **optimizer_kwargs)
        return zero, zero, []
    after_backward = []
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # Within a pipeline step a stage runs several micro-batches: keep its weights gathered between
        # forward and backward instead of gathering them again for every micro-batch (unless asked).
        reshard = not pipelined if reshard_after_forward is None else reshard_after_forward
        for block in kind.blocks(part):
            fully_shard(block, mesh=topology.submesh("dp"), reshard_after_forward=reshard)
        # FSDP2 hooks backward onto the output and warns if it is a view (DTensor's logits are): hand it a copy
        part.register_forward_hook(lambda module, args, out: out.clone() if getattr(out, "_base", None) is not None
                                   else out)
        fully_shard(part, mesh=topology.submesh("dp"), reshard_after_forward=reshard)
    elif how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        part = DistributedDataParallel(part, process_group=topology.group("dp"),
                                       device_ids=[device.index] if device.type == "cuda" else None)
    else:  # course-ddp
        from parlab.lab.parallel.ddp import DDPBuckets, DDPOverlap

        # A pipeline runs one backward per micro-batch: v2 waits for sync_gradients() after the last one,
        # where v3's hooks would send every micro-batch's gradients.
        part = (DDPBuckets if pipelined else DDPOverlap)(part, process_group=topology.group("dp"))
        after_backward.append(part.sync_gradients)
    return part, optimizer(part.parameters(), **optimizer_kwargs), after_backward


class _LazyPipeline:
    """The course's executor (chapter 06), built at the first step: a receiver must know the shape of
    what it will receive before it arrives, and that shape follows from the first micro-batch."""

    def __init__(self, stage, schedule, shape_of, **kwargs):
        self.stage, self.schedule, self.shape_of, self.kwargs = stage, schedule, shape_of, kwargs
        self.executor = None

    def step(self, x, y):
        if self.executor is None:
            from parlab.lab.parallel.pipeline import Pipeline

            micro = x[: x.shape[0] // self.schedule.num_micro_batches]
            self.executor = Pipeline([self.stage], self.schedule, activation_shape=self.shape_of(micro), **self.kwargs)
        return self.executor.step(x, y)


@contextlib.contextmanager
def comm_by_axis(topology: Topology):
    """Record every collective and message this rank issues on this thread (``record_comm``) and file each
    under the axis whose ranks it ran on: yields ``{axis: [CommRecord, ...]}`` (``"world"``: any other
    group), filled as the ops run. Counts PyTorch's strategies and the course's alike. (By ranks, not by
    group object: DTensor may reuse an equal mesh's groups, the same ranks under another name.)"""
    from parlab.lab.measure import CommLog, record_comm

    rank = dist.get_rank()
    axes = {}  # group's ranks -> axis; the first axis wins among size-1 axes
    for axis in AXES:
        axes.setdefault(tuple(topology.group_ranks(axis, rank)), axis)
    by_axis: dict = {a: [] for a in (*AXES, "world")}

    class AxisLog(CommLog):
        def add(self, op, nbytes, start, end, group=None, label=None):
            record = super().add(op, nbytes, start, end, group, label)
            ranks = tuple(sorted(dist.get_process_group_ranks(group or dist.group.WORLD)))
            by_axis[axes.get(ranks, "world")].append(record)
            return record

    mode = record_comm()
    mode.log = AxisLog()  # record_comm adds each op to its log; this one also files it by axis
    with mode:
        yield by_axis
