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
``record_ddp(ddp_model, log)``
    ``DistributedDataParallel`` launches its bucket all-reduces from C++, below the dispatcher; this
    registers a comm hook that records each bucket.
``with CommLog() as log:``
    Every strategy the course builds (``parlab.lab.parallel``, chapters 03–10) issues its collectives through
    ``parlab.lab.parallel.comm.communicate``, which hands one record per op to every log attached while the
    op was issued (``parlab.lab.measure.attach``): ``with CommLog() as log: DDPOverlap(model)(x).sum().backward()``.
``CommLog.add(...)``
    For anything else, record by hand.

On GPUs the last three place each op on the GPU's clock (CUDA events read against one reference event,
``parlab.lab.measure.gpu_clock``), where the host only queued it; ``record_comm`` waits for each op instead
(with ``wait=True``), and its times are the host's.

A :class:`CommRecord` holds ``op`` (``all_reduce``, ``all_gather`` …), ``bytes`` (the nccl-tests "size":
the whole buffer; for all-gather the gathered output, for reduce-scatter the input before scattering; for
send and recv the message), ``group_size``, ``start`` and ``end`` (``time.perf_counter()``), the global
``rank`` and the ``group_rank`` within the op's group, and an optional ``label``.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): ``algbw = bytes / seconds``, and ``busbw = algbw ×
factor`` where the factor (``bus_factor``) makes numbers comparable to the hardware's link speed:
``2(n−1)/n`` for all-reduce, ``(n−1)/n`` for all-gather, reduce-scatter and all-to-all, 1 for broadcast,
reduce and send/recv. nccl-tests has no scatter or gather; for them the course records the whole buffer
(all chunks) and uses ``(n−1)/n``, the share of it that crosses the root's link.

Usage on a rank (inside ``parlab.launch``)::

    with record_comm() as log:
        dist.all_reduce(t)
    return log.records          # plain dataclasses: they travel back to the notebook
    # in the notebook: comm_table(results) → per-rank totals; totals(records) → bytes per op
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from parlab.lab.checks import positive_int
from parlab.lab.measure.attach import Attached
from parlab.lab.measure.gpu_clock import GpuClock, GpuTiming

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
               "recv": lambda n: 1.0, "scatter": lambda n: (n - 1) / n, "gather": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class CommRecord:
    """One collective (or point-to-point message) one rank took part in: the course's single record of
    communication, whoever issued it (``record_comm``, a DDP comm hook, or a strategy in ``parlab.lab.parallel``).

    ``bytes`` follows nccl-tests' "size" (see the module docstring). ``rank`` is the *global* rank that
    recorded it; ``group_rank`` its rank *within* the group the op ran on, of ``group_size`` ranks (equal
    to ``rank`` and the world size on the default group). ``label`` says what the op carried, when the
    issuer knows (a bucket index, a layer name); ``None`` otherwise.
    """

    op: str
    bytes: int
    group_size: int
    start: float  # time.perf_counter() when issued; on a GPU, when it ran there (the same axis: gpu_clock)
    end: float  # time.perf_counter() when complete (issued, for send/recv seen by record_comm)
    rank: int = 0
    group_rank: int = 0
    label: object = None
    peer: int | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start



def bytes_written():
    """Bytes this process has written so far (``/proc/self/io``, its ``wchar`` line; Linux, else ``None``): on
    CPU ranks, gloo's traffic on the wire, which a difference around a collective measures (chapters 03–05)."""
    try:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("wchar")).split()[1])
    except (OSError, StopIteration):
        return None


def describe_group(group=None) -> tuple[int, int, int]:
    """(global rank, rank in ``group``, size of ``group``) for this process; (0, 0, 1) without a
    process group. ``group=None`` is the default (world) group."""
    if not dist.is_initialized():
        return 0, 0, 1
    return dist.get_rank(), dist.get_rank(group), dist.get_world_size(group)


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests' busbw/algbw ratio: the share of the buffer each rank must move over its own link."""
    if op not in BUS_FACTORS:
        raise ValueError(f"op={op!r} has no bus bandwidth factor; known: {', '.join(BUS_FACTORS)}")
    return BUS_FACTORS[op](positive_int("group_size", group_size, "ranks in the collective's group"))


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size over the time the collective took."""
    if seconds <= 0:
        raise ValueError(f"seconds={seconds!r} must be positive")
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, group_size: int) -> float:
    """Bus bandwidth in bytes/s (nccl-tests): algbw × :func:`bus_factor`."""
    return algbw(nbytes, seconds) * bus_factor(op, group_size)


@dataclass(frozen=True)
class PendingRecord:
    """A :class:`CommRecord` whose times are on the GPU: :meth:`resolve` reads its events (when a log is read).
    ``record.start`` holds the host's issue time until then."""

    record: CommRecord
    timing: GpuTiming

    def resolve(self, clock) -> CommRecord:
        start, end = self.timing.span(clock)
        return dataclasses.replace(self.record, start=start, end=end)


class CommLog(Attached):
    """The collectives one rank took part in, in order: ``records`` is a list of :class:`CommRecord`.

    ``with CommLog() as log:`` attaches it (``parlab.lab.measure.attach``): every op a strategy from
    ``parlab.lab.parallel`` issues inside the block is handed to it as it completes (possibly from another
    thread; ``list.append`` is atomic in CPython). It is also a plain callback, for code that records by hand.

    ``timeline``: a :class:`~parlab.lab.measure.timeline.Timeline` that each op is drawn on too (as a ``comm``
    span); it may be replaced between steps (``log.timeline = Timeline()``), and an op goes to the timeline
    set when it was handed over.

    An op on CUDA tensors arrives as a :class:`PendingRecord` and is placed on the GPU's clock when ``records``
    is read (reading its timeline's ``events`` reads it too): its start and end are CUDA events read against
    the reference event of its timeline's clock (the log's own, recorded when the log was made, without a
    timeline), the axis of the timeline's compute spans. Read it on the rank, before returning records.
    """

    _attach_as = "comm"

    def __init__(self, timeline=None):
        from parlab.lab import runtime

        self._records: list[CommRecord] = []
        self._pending: list[tuple[PendingRecord, object]] = []  # (record, the timeline it goes to)
        self._timeline = None
        device = runtime.device()
        self._clock = GpuClock(device) if device.type == "cuda" else None  # GPU mode: this log's reference
        self.timeline = timeline

    @property
    def timeline(self):
        """The :class:`~parlab.lab.measure.timeline.Timeline` ops are drawn on (None: none)."""
        return self._timeline

    @timeline.setter
    def timeline(self, timeline) -> None:
        self._timeline = timeline
        if timeline is not None:
            timeline.fed_by(self)  # on GPUs some spans arrive only once read: reading its events reads this log

    @property
    def records(self) -> list[CommRecord]:
        while self._pending:
            pending, timeline = self._pending.pop(0)
            self._add(pending.resolve(self._clock_for(pending, timeline)), timeline)
        return self._records

    def _clock_for(self, pending: PendingRecord, timeline):
        clock = getattr(timeline, "clock", None)
        if clock is None:
            if self._clock is None:  # made outside GPU mode, handed a GPU op: a reference from now on, not
                self._clock = GpuClock(pending.timing.device, drain=False)  # waiting for the device mid-step
            clock = self._clock
        return clock

    def __call__(self, record) -> None:
        if isinstance(record, PendingRecord):
            if self._clock is None and getattr(self._timeline, "clock", None) is None:
                self._clock_for(record, None)  # the reference before the op's events are read
            self._pending.append((record, self._timeline))
        else:
            self._add(record, self._timeline)

    def _add(self, record: CommRecord, timeline=None) -> None:
        self._records.append(record)
        if timeline is not None:
            name = record.op if record.label is None else f"{record.op} {record.label}"
            timeline.add(name, "comm", record.start, record.end)

    def add(self, op: str, nbytes: int, start: float, end: float, group=None, label=None) -> CommRecord:
        """Record an op that ran on ``group`` (None: the default group) from ``start`` to ``end``."""
        rank, group_rank, size = describe_group(group)
        record = CommRecord(op, int(nbytes), size, start, end, rank, group_rank, label)
        self(record)
        return record

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


def _group(args):
    """The process group a c10d op was called with (``None``: the default group)."""
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a)
            except Exception:  # not a process group (a ReduceOp, a Work)
                continue
        if isinstance(a, str) and dist.is_initialized():  # functional collectives name their group
            try:
                return dist.distributed_c10d._resolve_process_group(a)
            except Exception:
                continue
    return None


def _wait(out) -> None:
    works = out if isinstance(out, (list, tuple)) else (out,)
    for w in works:
        if isinstance(w, torch.ScriptObject) and hasattr(w, "wait"):
            w.wait()


class record_comm(TorchDispatchMode):
    """Record every collective issued on this thread while the context is open. Yields a :class:`CommLog`.

    wait: wait for each op to finish so that ``seconds`` measures it (on CUDA also synchronise).
    timeline: a :class:`~parlab.lab.measure.timeline.Timeline` to add a ``comm`` span to for each op.
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
        end = time.perf_counter()
        group = _group(args)
        # The nccl-tests "size" is the larger side: gathered output, or input before the scatter.
        nbytes = max((_tensor_bytes(a) for a in args), default=0)
        if OP_NAMES[name] == "all_gather" and namespace == "_c10d_functional":
            nbytes *= describe_group(group)[2]  # functional all-gather gets only the local shard
        self.log.add(OP_NAMES[name], nbytes, start, end, group)
        return out


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


def record_ddp(ddp_model, log: CommLog) -> None:
    """Record every gradient bucket a ``DistributedDataParallel`` model all-reduces into ``log``.

    DDP launches its bucket all-reduces from C++, below the dispatcher that :class:`record_comm` watches,
    so this registers a comm hook that does what DDP's default does (average each bucket over the
    model's process group) and records it. Call it once, before the first backward.
    """
    ddp_model.register_comm_hook((log, ddp_model.process_group), _ddp_hook)


def _ddp_hook(state, bucket):
    log, group = state
    buffer = bucket.buffer()  # the bucket's gradients, flattened: (bucket_numel,)
    start = time.perf_counter()
    buffer.div_(dist.get_world_size(group))
    on = group if group is not None else dist.group.WORLD
    timing = GpuTiming(buffer.device, start, on) if buffer.is_cuda else None
    work = dist.all_reduce(buffer, group=group, async_op=True)
    fut = work.get_future()
    if timing is not None:  # NCCL's future completes at enqueue: the record is placed by CUDA events
        timing.end_after(work)
        rank, group_rank, size = describe_group(group)
        log(PendingRecord(CommRecord("all_reduce", buffer.numel() * buffer.element_size(), size, start, start,
                                     rank, group_rank, bucket.index()), timing))
        return fut.then(lambda f: f.value()[0])

    def done(f):
        log.add("all_reduce", buffer.numel() * buffer.element_size(), start, time.perf_counter(), group,
                label=bucket.index())
        return f.value()[0]

    return fut.then(done)
