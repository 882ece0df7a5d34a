"""Distributed data parallelism (DDP) from scratch, in three steps. Taught in chapter 03.

Every rank holds a whole copy of the model and computes gradients on its own shard of the global batch.
If all ranks start from the same parameters and, before every optimizer step, replace their gradients
by the average over ranks, all ranks take the same step, and that step is the one a single process
would take on the whole global batch (for a loss that is a mean over equally sized shards).

- :class:`DDPNaive` (v1): broadcast the initial parameters from rank 0; after backward, all-reduce and
  average every gradient, one collective per parameter.
- :class:`DDPBuckets` (v2): pack gradients into flat buckets of about ``bucket_bytes`` (in reverse
  parameter order, roughly the order backward produces them) and run one collective per bucket: a few
  large messages pay the fixed cost of a collective far fewer times than many small ones.
- :class:`DDPOverlap` (v3): launch each bucket's all-reduce *during* backward, as soon as all of its
  gradients exist, so that communication for the last layers overlaps the computation of the first
  layers' gradients; :meth:`DDPOverlap.no_sync` accumulates gradients locally without communicating.

The design follows ``torch.nn.parallel.DistributedDataParallel`` as described in S. Li et al.,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020 (arXiv:2006.15704),
section 3.2: the naive solution, gradient bucketing, overlapping computation with communication, and
gradient accumulation.

The three share one usage, so chapter 03 can swap them and compare with PyTorch's DDP::

    model = DDPOverlap(single_device_model)      # inside a rank; the process group is initialised
    loss_fn(model(x_shard), y_shard).backward()
    model.sync_gradients()                        # every .grad is now the average over ranks
    optimizer.step(); optimizer.zero_grad()

Where it runs: on ``process_group`` (default: every rank). Chapter 07 passes the ``dp`` group of a mesh
(``Topology.group("dp")``); parameters that tensor parallelism has turned into DTensors are handled by
their local shards, so the same code averages each shard over its data-parallel replicas.

Observing communication: every collective goes through ``parlab.lab.parallel.comm.communicate``, the door all
the course's strategies share, so it records into any attached ``parlab.lab.measure.CommLog`` (``with CommLog()
as log:`` around the step): one ``CommRecord`` per collective (op, bytes, group size, global and in-group
rank, start and end times, and the bucket index as ``label``); ``sync_gradients`` returns only after every
record is in.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parlab.lab.checks import positive_int
from parlab.lab.parallel.comm import communicate

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb=25 (MiB)


def _local(t: torch.Tensor) -> torch.Tensor:
    """What this rank stores of ``t``: a DTensor's local shard (tensor parallelism), else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _set_grad(p: nn.Parameter, value: torch.Tensor) -> None:
    """Give ``p`` the gradient ``value`` (this rank's part of it); a DTensor parameter gets a DTensor."""
    if hasattr(p, "to_local"):
        from torch.distributed.tensor import DTensor

        value = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False)
    p.grad = value


class DDPNaive(nn.Module):
    """DDP v1: broadcast initial parameters, then all-reduce and average each gradient (chapter 03).

    ``module`` is ordinary single-device code; ``process_group`` defaults to the initialised default
    group. Call :meth:`sync_gradients` after ``backward()`` and before ``optimizer.step()``.
    Li et al. 2020, section 3.2, "a naive solution".
    """

    def __init__(self, module: nn.Module, process_group=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("DDP needs an initialised process group: run inside parlab.launch (or torchrun "
                               "after dist.init_process_group), or pass process_group=...")
        self.module = module
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        # Parameters that train; a tied weight appears once in parameters(), so it is reduced once.
        self._params = [p for p in module.parameters() if p.requires_grad]
        # Same starting point everywhere: rank 0's values overwrite the others' (buffers too, e.g.
        # running statistics). Without this each rank would train its own, differently initialised model.
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                self._communicate("broadcast", _local(t), None, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _communicate(self, op: str, tensor: torch.Tensor, label, *, src: int | None = None,
                     async_op: bool = False):
        """Every collective of this wrapper, on its group, recorded with ``label`` (the bucket index; v1:
        the parameter index; ``None`` for the initial broadcast)."""
        return communicate(op, tensor, self.process_group, src=src, async_op=async_op, label=label)

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Replace every gradient by its average over the ranks: Ψ numbers all-reduced per step."""
        for i, p in enumerate(self._params):
            if p.grad is None:  # unused this step: contribute zeros so every rank issues the same calls
                _set_grad(p, torch.zeros_like(_local(p)))
            grad = _local(p.grad)
            self._communicate("all_reduce", grad, i)  # sum over ranks, in place
            grad.div_(self.world_size)  # the sum of shard-mean gradients / n = the global mean


@dataclass(eq=False)
class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""

    index: int
    params: list
    names: list[str]
    buffer: torch.Tensor  # (sum of the params' numel,) one flat tensor, reused every step
    views: list  # views[i]: the slice of buffer shaped like params[i]

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class DDPBuckets(DDPNaive):
    """DDP v2: gradients packed into buckets of about ``bucket_bytes``, one all-reduce per bucket.

    Buckets are filled in reverse parameter order, the order in which backward roughly produces
    gradients (v3 relies on that). A bucket is closed as soon as it holds ``bucket_bytes`` or more, so
    it may exceed that by up to one parameter; a parameter larger than ``bucket_bytes`` fills a bucket
    on its own.
    Li et al. 2020, section 3.2, "gradient bucketing".
    """

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, process_group=None):
        positive_int("bucket_bytes", bucket_bytes, f"bytes per bucket, e.g. {DEFAULT_BUCKET_BYTES} as in "
                     f"PyTorch's DDP")
        super().__init__(module, process_group)
        self.bucket_bytes = bucket_bytes
        names = {id(p): n for n, p in module.named_parameters()}
        self.buckets: list[Bucket] = []
        group: list = []
        size = 0
        for p in reversed(self._params):
            # One buffer has one dtype and device: a change of either starts a new bucket.
            if group and (p.dtype != group[0].dtype or p.device != group[0].device):
                self._add_bucket(group, names)
                group, size = [], 0
            group.append(p)
            size += _local(p).numel() * p.element_size()
            if size >= bucket_bytes:  # full: close it (PyTorch's DDP uses the same rule)
                self._add_bucket(group, names)
                group, size = [], 0
        if group:
            self._add_bucket(group, names)

    def _add_bucket(self, params: list, names: dict) -> None:
        local = [_local(p) for p in params]  # a DTensor parameter contributes its local shard
        buffer = torch.zeros(sum(t.numel() for t in local), dtype=params[0].dtype, device=local[0].device)
        views, offset = [], 0
        for t in local:
            views.append(buffer[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        self.buckets.append(Bucket(len(self.buckets), params, [names[id(p)] for p in params], buffer, views))

    @staticmethod
    def _pack(p, view) -> None:
        if p.grad is None:
            view.zero_()
        else:
            view.copy_(_local(p.grad))

    @torch.no_grad()
    def _unpack(self, bucket: Bucket) -> None:
        for p, view in zip(bucket.params, bucket.views):
            if p.grad is None:
                _set_grad(p, view.clone())
            else:
                _local(p.grad).copy_(view)

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Per bucket: copy grads in, divide by n, all-reduce (sum), copy the averages back out."""
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                self._pack(p, view)
            # Dividing before summing (as PyTorch's DDP does) keeps the sum from growing with n.
            b.buffer.div_(self.world_size)
            self._communicate("all_reduce", b.buffer, b.index)
            self._unpack(b)


class DDPOverlap(DDPBuckets):
    """DDP v3: each bucket's all-reduce starts during backward, once all its gradients are ready.

    A hook on every parameter (``register_post_accumulate_grad_hook``, run after autograd has written
    ``.grad``) copies the gradient into its bucket. When a bucket is complete it is all-reduced
    asynchronously while backward goes on computing earlier layers' gradients. Buckets are launched
    strictly in index order, so every rank issues the same collectives in the same order even if
    autograd finishes gradients in a different order. :meth:`sync_gradients` waits for them all.
    Inside :meth:`no_sync` the hooks do nothing: gradients accumulate in ``.grad`` and the first
    backward outside reduces the accumulated sum. Wrap a model once: the hooks stay on its parameters.
    Li et al. 2020, section 3.2, "overlapping computation with communication" and "gradient accumulation".
    """

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, process_group=None):
        super().__init__(module, bucket_bytes, process_group)
        self._where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._sync = True
        self._reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self._params]

    def _reset(self) -> None:
        self._missing = [len(b.params) for b in self.buckets]  # grads not yet in each bucket
        self._ready: set[int] = set()  # ids of parameters whose grad is in its bucket this step
        self._next = 0  # index of the next bucket to launch
        self._pending: list = []  # one waitable per launched bucket

    def _grad_ready(self, p) -> None:
        if not self._sync:
            return
        if id(p) in self._ready:
            raise RuntimeError("a second backward reached a parameter before sync_gradients(); to "
                               "accumulate gradients over several backwards, run all but the last "
                               "inside `with model.no_sync():`")
        bucket, i = self._where[id(p)]
        bucket.views[i].copy_(_local(p.grad))
        self._ready.add(id(p))
        self._missing[bucket.index] -= 1
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._launch(self.buckets[self._next])

    def _launch(self, b: Bucket) -> None:
        b.buffer.div_(self.world_size)
        self._pending.append(self._communicate("all_reduce", b.buffer, b.index, async_op=True))
        self._next += 1

    def forward(self, *args, **kwargs):
        if self._pending:
            raise RuntimeError("the previous backward's gradients are still being reduced: call "
                               "sync_gradients() before the optimizer step and the next forward")
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside this block accumulate into ``.grad`` without any communication."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Launch any bucket still incomplete (unused parameters count as zeros), wait, unpack."""
        if not self._sync:
            return  # inside no_sync(): nothing was launched, gradients stay local
        for b in self.buckets[self._next:]:
            for p, view in zip(b.params, b.views):
                if id(p) not in self._ready:
                    self._pack(p, view)
            self._launch(b)
        for waitable in self._pending:
            waitable.wait()
        for b in self.buckets:
            self._unpack(b)
        self._reset()
