"""Count the bytes and time of every collective a rank issues (chapter 02; DDP in 03, ZeRO in 04).

Three ways in, for three kinds of code:

``record_comm()``
    A context manager (a ``TorchDispatchMode``) that sees every ``torch.distributed`` call made on this
    thread: ``dist.all_reduce``, ``dist.send`` … and whatever calls them from Python, which includes
    FSDP2's ``fully_shard`` (it calls ``all_gather_into_tensor``/``reduce_scatter_tensor``) and DTensor's
    functional collectives. No monkeypatching: PyTorch routes every c10d op through the dispatcher, and a
    dispatch mode is the supported way to watch it. Limits: only the thread that entered the context is
    seen (DDP's C++ reducer and FSDP's background streams are not); with ``wait=True`` (the default) each
    op is waited for, so ``seconds`` is its real duration, at the cost of serialising async ops
    (send/recv are not waited for: their ``seconds`` covers issuing only).
``ddp_recorder(log)``
    ``DistributedDataParallel`` launches its bucket all-reduces from C++, below the dispatcher; register
    this as its comm hook (``ddp.register_comm_hook(log, ddp_recorder)``) to record each bucket.
``DDPOverlap(model, on_collective=log)``
    The course's own DDP (``parlab.parallel.ddp``, chapter 03) reports each collective to a callback;
    a :class:`CommLog` is one.
``CommLog.add(...)``
    For anything else, record by hand.

A record holds ``op`` (``all_reduce``, ``all_gather`` …), ``bytes`` (the nccl-tests "size": the whole
buffer; for all-gather the gathered output, for reduce-scatter the input before scattering; for send
and recv the message), ``group_size``, ``seconds`` and ``start`` (``time.perf_counter()``).

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): ``algbw = bytes / seconds``, and ``busbw = algbw ×
factor`` where the factor (``bus_factor``) makes numbers comparable to the hardware's link speed:
``2(n−1)/n`` for all-reduce, ``(n−1)/n`` for all-gather, reduce-scatter and all-to-all, 1 for broadcast,
reduce and send/recv.

Usage on a rank (inside ``parlab.launch``)::

    with record_comm() as log:
        dist.all_reduce(t)
    return log.records          # plain dataclasses: they travel back to the notebook
    # in the notebook: comm_table(results) → per-rank totals; totals(records) → bytes per op
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# c10d op name (as the dispatcher sees it) -> the name the course uses
OP_NAMES = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "broadcast_": "broadcast",
    "reduce_": "reduce", "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather", "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "gather_": "gather", "scatter_": "scatter",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv", "barrier": "barrier",
    # functional collectives (DTensor, torch.compile)
    "all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast",
}
BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send": lambda n: 1.0,
               "recv": lambda n: 1.0}


@dataclass(frozen=True)
class CommRecord:
    op: str
    bytes: int
    group_size: int
    seconds: float
    start: float  # time.perf_counter() when issued
    rank: int = 0


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests' busbw/algbw ratio: the share of the buffer each rank must move over its own link."""
    if op not in BUS_FACTORS:
        raise ValueError(f"op={op!r} has no bus bandwidth factor; known: {', '.join(BUS_FACTORS)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r} must be a positive integer")
    return BUS_FACTORS[op](group_size)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size over the time the collective took."""
    if seconds <= 0:
        raise ValueError(f"seconds={seconds!r} must be positive")
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, group_size: int) -> float:
    """Bus bandwidth in bytes/s (nccl-tests): algbw × :func:`bus_factor`."""
    return algbw(nbytes, seconds) * bus_factor(op, group_size)


class CommLog:
    """The collectives one rank issued, in order. ``records`` is a list of :class:`CommRecord`."""

    def __init__(self, timeline=None):
        self.records: list[CommRecord] = []
        self.timeline = timeline  # optional parlab.measure.timeline.Timeline: comm spans go there too

    def add(self, op: str, nbytes: int, group_size: int, seconds: float, start: float) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.records.append(CommRecord(op, int(nbytes), group_size, seconds, start, rank))
        if self.timeline is not None:
            self.timeline.add(op, "comm", start, start + seconds)

    def __call__(self, event) -> None:
        """Take a report from the course's own DDP (``parlab.parallel.ddp``, chapter 03):
        ``DDPOverlap(model, on_collective=log)``. Any object with ``op``, ``nbytes``, ``start`` and
        ``end`` (``time.perf_counter()`` readings) will do; it may arrive on another thread, and a
        ``list.append`` is atomic in CPython, so no lock is needed."""
        size = getattr(event, "group_size", None) or (dist.get_world_size() if dist.is_initialized() else 1)
        self.add(event.op, event.nbytes, size, event.end - event.start, event.start)

    def totals(self) -> dict[str, dict]:
        return totals(self.records)


def totals(records) -> dict[str, dict]:
    """Per op: number of calls, bytes and seconds, summed over ``records`` (one rank's, or any list)."""
    out: dict[str, dict] = defaultdict(lambda: {"calls": 0, "bytes": 0, "seconds": 0.0})
    for r in records:
        out[r.op]["calls"] += 1
        out[r.op]["bytes"] += r.bytes
        out[r.op]["seconds"] += r.seconds
    return dict(out)


def comm_table(records_by_rank) -> str:
    """A text table, one row per (rank, op): calls, bytes and time. Give it what the ranks returned."""
    lines = [f"{'rank':>4}  {'op':<15}{'calls':>6}{'bytes':>14}{'ms':>10}"]
    for rank, records in enumerate(records_by_rank):
        for op, t in sorted(totals(records).items()):
            lines.append(f"{rank:>4}  {op:<15}{t['calls']:>6}{t['bytes']:>14,}{t['seconds'] * 1e3:>10.2f}")
    return "\n".join(lines)


def _tensor_bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(y) for y in x)
    return 0


def _group_size(args) -> int:
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a).size()
            except Exception:  # not a process group (a ReduceOp, a Work)
                continue
        if isinstance(a, str) and dist.is_initialized():  # functional collectives name their group
            try:
                return dist.get_world_size(dist.distributed_c10d._resolve_process_group(a))
            except Exception:
                continue
    return dist.get_world_size() if dist.is_initialized() else 1


def _wait(out) -> None:
    works = out if isinstance(out, (list, tuple)) else (out,)
    for w in works:
        if isinstance(w, torch.ScriptObject) and hasattr(w, "wait"):
            w.wait()


class record_comm(TorchDispatchMode):
    """Record every collective issued on this thread while the context is open. Yields a :class:`CommLog`.

    wait: wait for each op to finish so that ``seconds`` measures it (on CUDA also synchronise).
    timeline: a :class:`~parlab.measure.timeline.Timeline` to add a ``comm`` span to for each op.
    """

    def __init__(self, wait: bool = True, timeline=None):
        super().__init__()
        self.wait = wait
        self.log = CommLog(timeline)

    def __enter__(self):
        super().__enter__()
        return self.log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        namespace = func.namespace
        if namespace not in ("c10d", "_c10d_functional") or name not in OP_NAMES:
            return func(*args, **kwargs)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        # Not send/recv: gloo's point-to-point Work waits for the *next* completion on each wait(), so a
        # second wait (ours, then dist.send's own) would block forever. Their seconds cover issuing only.
        if self.wait and OP_NAMES[name] not in ("send", "recv"):
            _wait(out)
            if any(isinstance(t, torch.Tensor) and t.is_cuda for t in _flat(args)):
                torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        # The nccl-tests "size" is the larger side: gathered output, or input before the scatter.
        nbytes = max((_tensor_bytes(a) for a in args), default=0)
        if OP_NAMES[name] == "all_gather" and namespace == "_c10d_functional":
            nbytes *= _group_size(args)  # functional all-gather gets only the local shard
        self.log.add(OP_NAMES[name], nbytes, _group_size(args), seconds, start)
        return out


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


def ddp_recorder(log: CommLog, bucket):
    """A DDP comm hook that all-reduces (averages) each gradient bucket, as DDP's default does, and
    records it in ``log``: ``ddp_model.register_comm_hook(log, ddp_recorder)``."""
    buffer = bucket.buffer()  # the bucket's gradients, flattened: (bucket_numel,)
    group_size = dist.get_world_size()
    start = time.perf_counter()
    buffer.div_(group_size)
    fut = dist.all_reduce(buffer, async_op=True).get_future()

    def done(f):
        log.add("all_reduce", buffer.numel() * buffer.element_size(), group_size,
                time.perf_counter() - start, start)
        return f.value()[0]

    return fut.then(done)
