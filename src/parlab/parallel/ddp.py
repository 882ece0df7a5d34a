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

Observing communication: every collective goes through one method, ``_communicate``. Pass
``on_collective=callback`` and the callback receives one :class:`CommEvent` per collective (operation,
bucket index, bytes, start and end times from ``time.perf_counter()``, rank). For an asynchronous
collective the end time is taken when its future completes (exact with gloo on CPU; with NCCL the host
learns of completion only approximately, so time GPU work with CUDA events), and ``sync_gradients``
returns only after every callback has run. The callback may run on another
thread, so it should only record (e.g. ``events.append``). ``parlab.measure`` builds on this hook.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb=25


@dataclass(frozen=True)
class CommEvent:
    """One collective issued by a DDP wrapper, as reported to ``on_collective``."""

    op: str  # "broadcast" (initial parameters) or "all_reduce" (gradients)
    bucket: int | None  # bucket index (v1: parameter index); None for the initial broadcast
    nbytes: int  # size of the tensor communicated, on this rank
    start: float  # time.perf_counter() when issued
    end: float  # time.perf_counter() when complete
    rank: int

    @property
    def duration(self) -> float:
        return self.end - self.start


class DDPNaive(nn.Module):
    """DDP v1: broadcast initial parameters, then all-reduce and average each gradient (chapter 03).

    ``module`` is ordinary single-device code; ``process_group`` defaults to the initialised default
    group. Call :meth:`sync_gradients` after ``backward()`` and before ``optimizer.step()``.
    Li et al. 2020, section 3.2, "a naive solution".
    """

    def __init__(self, module: nn.Module, process_group=None,
                 on_collective: Callable[[CommEvent], None] | None = None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        if on_collective is not None and not callable(on_collective):
            raise TypeError(f"on_collective must be a callable taking a CommEvent, or None; got {on_collective!r}")
        if not dist.is_initialized():
            raise RuntimeError("DDP needs an initialised process group: run inside parlab.launch (or torchrun "
                               "after dist.init_process_group), or pass process_group=...")
        self.module = module
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        self.on_collective = on_collective
        # Parameters that train; a tied weight appears once in parameters(), so it is reduced once.
        self._params = [p for p in module.parameters() if p.requires_grad]
        # Same starting point everywhere: rank 0's values overwrite the others' (buffers too, e.g.
        # running statistics). Without this each rank would train its own, differently initialised model.
        source = dist.get_global_rank(self.process_group, 0)
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                self._communicate("broadcast", t, None, src=source)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _communicate(self, op: str, tensor: torch.Tensor, bucket: int | None, *, src: int = 0,
                     async_op: bool = False):
        """Issue one collective on ``tensor`` in place; the single place a measurement layer watches.

        Returns ``None`` when synchronous, else an object whose ``wait()`` returns once the collective
        and its ``on_collective`` report are done.
        """
        start = time.perf_counter()
        if op == "all_reduce":
            work = dist.all_reduce(tensor, group=self.process_group, async_op=async_op)
        elif op == "broadcast":
            work = dist.broadcast(tensor, src=src, group=self.process_group, async_op=async_op)
        else:
            raise ValueError(f"op must be 'all_reduce' or 'broadcast'; got {op!r}")
        if self.on_collective is None:
            return work
        nbytes = tensor.numel() * tensor.element_size()

        def report(_=None):
            self.on_collective(CommEvent(op, bucket, nbytes, start, time.perf_counter(), self.rank))

        if not async_op:
            report()
            return None
        return work.get_future().then(report)  # runs when the collective completes

    def sync_gradients(self) -> None:
        """Replace every gradient by its average over the ranks: Ψ numbers all-reduced per step."""
        for i, p in enumerate(self._params):
            if p.grad is None:  # unused this step: contribute zeros so every rank issues the same calls
                p.grad = torch.zeros_like(p)
            self._communicate("all_reduce", p.grad, i)  # sum over ranks, in place
            p.grad.div_(self.world_size)  # the sum of shard-mean gradients / n = the global mean


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

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, process_group=None,
                 on_collective: Callable[[CommEvent], None] | None = None):
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive int (bytes per bucket, e.g. "
                             f"{DEFAULT_BUCKET_BYTES} as in PyTorch's DDP); got {bucket_bytes!r}")
        super().__init__(module, process_group, on_collective)
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
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:  # full: close it (PyTorch's DDP uses the same rule)
                self._add_bucket(group, names)
                group, size = [], 0
        if group:
            self._add_bucket(group, names)

    def _add_bucket(self, params: list, names: dict) -> None:
        buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        views, offset = [], 0
        for p in params:
            views.append(buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.buckets.append(Bucket(len(self.buckets), params, [names[id(p)] for p in params], buffer, views))

    @staticmethod
    def _pack(p, view) -> None:
        if p.grad is None:
            view.zero_()
        else:
            view.copy_(p.grad)

    def _unpack(self, bucket: Bucket) -> None:
        for p, view in zip(bucket.params, bucket.views):
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)

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

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, process_group=None,
                 on_collective: Callable[[CommEvent], None] | None = None):
        super().__init__(module, bucket_bytes, process_group, on_collective)
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
        bucket.views[i].copy_(p.grad)
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
