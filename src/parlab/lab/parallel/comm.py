"""One door for every byte a strategy sends: issue a collective on a group, and record it (chapters 03–07).

Every from-scratch strategy in ``parlab.lab.parallel`` (DDP in chapter 03, ZeRO in 04, tensor parallelism in
05, pipelines in 06, context and expert parallelism in 09) communicates through :func:`communicate`. It
takes the *group* the strategy was given (a strategy never assumes the whole world: chapter 07 runs DDP
on the ``dp`` axis of a mesh), runs the op, and hands one :class:`~parlab.lab.measure.comm.CommRecord` to
every :class:`~parlab.lab.measure.comm.CommLog` attached when the op was issued (``with CommLog() as log:``,
``parlab.lab.measure.attach``): op, bytes (nccl-tests' size), the group's size, this rank's global and
in-group rank, start and end times, and a label (bucket, layer …). The strategies carry no instrument.

For an asynchronous collective on CPU tensors the record is made when its future completes (exact with
gloo), and the waitable returned here completes only after the logs have it. On CUDA tensors NCCL only
queues the op, so its record carries CUDA events (``GpuTiming``) and is placed on the GPU's clock when the
log is read (``parlab.lab.measure.gpu_clock``): the host never waits for the record, overlap survives being
recorded, and a record starts when NCCL ran the op, on the axis of the timeline's compute spans. Messages of
:func:`communicate_batch` too: NCCL's ``wait()`` returns at enqueue, so host times would end them there. A
log may be handed a record on another thread, so it should only record.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import torch
import torch.distributed as dist

from parlab.lab.measure.attach import attached
from parlab.lab.measure.comm import CommRecord, GpuTiming, PendingRecord, describe_group

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv", "scatter", "gather", "reduce",
       "all_to_all")
# PyTorch 2.13 renamed the tensor forms (the old names warn); older releases have only the old ones.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
def communicate(op: str, tensor: torch.Tensor, group=None, *, output: torch.Tensor | None = None,
                src: int | None = None, peer: int | None = None, dst: int | None = None,
                chunks: list | None = None, splits: tuple | None = None, async_op: bool = False,
                label=None, reduce_op=dist.ReduceOp.SUM):
    """Run one op on ``group`` (``None``: the default group) and hand its record to every attached log.

    - ``all_reduce``: sums ``tensor`` over the group, in place (``reduce_op=dist.ReduceOp.MAX``: the largest).
    - ``broadcast``: ``tensor`` from the group's rank ``src`` (an in-group rank), in place.
    - ``all_gather``: ``output`` (group size × ``tensor``'s numel) ← every rank's ``tensor``, in group order.
    - ``reduce_scatter``: ``output`` ← this rank's slice of the sum of every rank's ``tensor``.
    - ``send`` / ``recv``: ``tensor`` to / from the group's rank ``peer`` (in-group).
    - ``scatter``: ``tensor`` ← chunk r of ``chunks``, the list of group-size tensors that only rank ``src``
      gives (chapter 03: DataParallel's inputs leaving GPU 0).
    - ``gather``: ``chunks`` (given on rank ``dst`` only) ← every rank's ``tensor``, in group order.
    - ``reduce``: the sum of every rank's ``tensor`` lands in ``tensor`` on rank ``dst`` (other ranks'
      buffers are left unspecified, as ``dist.reduce`` says).
    - ``all_to_all``: ``output`` ← the chunk every rank addressed to this one, in group order; ``tensor``'s
      dim 0 is cut into one chunk per rank, evenly or by ``splits=(input_splits, output_splits)`` (rows
      sent to, and received from, each rank), as ``dist.all_to_all_single`` does (chapter 10's experts).

    Bytes recorded follow nccl-tests' "size" on every rank: the whole buffer (all-reduce, broadcast,
    reduce, send/recv), the gathered output (all-gather, gather: group size × ``tensor``) or the input
    before it is split (reduce-scatter, scatter: group size × ``tensor``; all-to-all: ``tensor``, which
    holds this rank's own chunk too).

    ``reduce_op`` (all-reduce, reduce-scatter): ``dist.ReduceOp.SUM`` by default; ``AVG`` divides the sum by
    the group's size (ZeRO averages gradients so, as FSDP2 does). Returns ``None`` when synchronous;
    otherwise something whose ``wait()`` returns once op and report are done.
    """
    group = group if group is not None else dist.group.WORLD
    start = time.perf_counter()
    logs = attached("comm")  # fixed now: a record completing later still goes where the op was issued
    timing = GpuTiming(tensor.device, start, group) if logs and _on_cuda(tensor) else None
    # On a GPU the op is issued async even when the caller waits: its Work carries NCCL's own timing
    work = _issue(op, tensor, group, output=output, src=src, peer=peer, dst=dst, chunks=chunks, splits=splits,
                  async_op=async_op or timing is not None, reduce_op=reduce_op)
    if not logs:
        return work
    rank, group_rank, size = describe_group(group)
    issued = CommRecord(op, _recorded_bytes(op, tensor, output, group), size, start, start, rank, group_rank,
                        label, dist.get_global_rank(group, peer) if op in ("send", "recv") else None)

    def report(_=None):
        for log in logs:  # the end is now, or (on a GPU) the events' when the log is read
            log(dataclasses.replace(issued, end=time.perf_counter()) if timing is None
                else PendingRecord(issued, timing))

    if timing is not None:  # NCCL returns once the op is queued: CUDA events time it, read when a log is read
        return _timed_on_gpu(work, timing, report, async_op)
    if work is None:
        report()
        return None
    if op in ("send", "recv"):  # gloo's point-to-point work has no future: report when waited for
        return _ReportOnWait(work, report)
    try:
        future = work.get_future()
    except RuntimeError:  # gloo's reduce-scatter has none either: a thread waits, so the end time is exact
        return _ReportFromThread(work, report)
    return future.then(report)  # runs when the collective completes


def _on_cuda(tensor) -> bool:
    """Whether ``tensor``'s op runs on a GPU (NCCL), so that it is timed by CUDA events."""
    return tensor.is_cuda


def _issue(op, tensor, group, *, output, src, peer, dst, chunks, splits, async_op, reduce_op):
    """Run ``op`` on ``group``; its Work when ``async_op`` (send/recv: always waited unless async), else None."""
    if op in ("scatter", "gather", "reduce"):
        root = dist.get_global_rank(group, _need(src if op == "scatter" else dst,
                                                 "src" if op == "scatter" else "dst", op))
        mine = dist.get_rank() == root
        if op == "scatter":
            return dist.scatter(tensor, chunks if mine else None, src=root, group=group, async_op=async_op)
        if op == "gather":
            return dist.gather(tensor, chunks if mine else None, dst=root, group=group, async_op=async_op)
        return dist.reduce(tensor, root, op=reduce_op, group=group, async_op=async_op)
    if op == "all_reduce":
        return dist.all_reduce(tensor, op=reduce_op, group=group, async_op=async_op)
    if op == "broadcast":
        return dist.broadcast(tensor, src=dist.get_global_rank(group, _need(src, "src", op)), group=group,
                              async_op=async_op)
    if op == "all_gather":
        return _all_gather(_need(output, "output", op), tensor, group=group, async_op=async_op)
    if op == "reduce_scatter":
        return _reduce_scatter(_need(output, "output", op), tensor, op=reduce_op, group=group, async_op=async_op)
    if op == "all_to_all":
        ins, outs = splits if splits is not None else (None, None)
        return dist.all_to_all_single(_need(output, "output", op), tensor, outs, ins, group=group,
                                      async_op=async_op)
    if op in ("send", "recv"):
        other = dist.get_global_rank(group, _need(peer, "peer", op))
        work = (dist.isend if op == "send" else dist.irecv)(tensor, other, group=group)
        if async_op:
            return work
        work.wait()
        return None
    raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")


def _recorded_bytes(op, tensor, output, group) -> int:
    """nccl-tests' size: the whole buffer; the gathered output for all-gather, the input for reduce-scatter;
    for scatter and gather every rank holds one chunk, and the buffer is all of them."""
    buffer = output if op == "all_gather" else tensor
    nbytes = buffer.numel() * buffer.element_size()
    return nbytes * describe_group(group)[2] if op in ("scatter", "gather") else nbytes


def _timed_on_gpu(work, timing, report, async_op: bool):
    """Report an op timed by CUDA events (issued async), then return as the caller asked."""
    timing.end_after(work)
    report()
    if async_op:
        return work
    if work is not None:
        work.wait()  # what the synchronous call does: the current stream waits for the op
    return None


def communicate_batch(messages, group=None) -> list:
    """Issue several sends and receives at once (``dist.batch_isend_irecv``) and report each, like
    :func:`communicate`. Pipelines need this (chapter 06): a rank that sends its output and receives its
    next input *in one batch* cannot wait for a neighbour that is doing the same the other way round.

    ``messages``: ``(op, tensor, peer, label)`` tuples, ``op`` ``"send"`` or ``"recv"``, ``peer`` the
    other rank's rank within ``group``. Returns one waitable per message, in order; each hands its record,
    once waited for, to the logs attached when it was issued. Between two ranks, messages in one direction
    are matched in the order they are issued. NCCL runs the batch as one group (one request for all of it); gloo
    issues the messages one by one.
    """
    group = group if group is not None else dist.group.WORLD
    if not messages:
        return []
    ops = []
    for op, tensor, peer, _ in messages:
        if op not in ("send", "recv"):
            raise ValueError(f"a batch holds only 'send' and 'recv'; got {op!r}")
        ops.append(dist.P2POp(dist.isend if op == "send" else dist.irecv, tensor, dist.get_global_rank(group, peer),
                              group=group))
    start = time.perf_counter()
    logs = attached("comm")
    # On a GPU NCCL's wait() returns at once (it only orders streams): the messages are timed by CUDA events
    timing = GpuTiming(messages[0][1].device, start, group) if logs and _on_cuda(messages[0][1]) else None
    works = dist.batch_isend_irecv(ops)
    if len(works) != len(ops):  # NCCL coalesces the batch into one request; waiting for it again is allowed
        works = [works[-1]] * len(ops)
    rank, group_rank, size = describe_group(group)
    if timing is not None:
        timing.end_after(works[-1])  # the batch runs as one NCCL group: its messages start and end together

    def reporter(op, tensor, peer, label):
        def report():
            record = CommRecord(op, tensor.numel() * tensor.element_size(), size, start, time.perf_counter(),
                                rank, group_rank, label, dist.get_global_rank(group, peer))
            for log in logs:
                log(record if timing is None else PendingRecord(record, timing))
        return report

    return [_ReportOnWait(w, reporter(op, tensor, peer, label))
            for w, (op, tensor, peer, label) in zip(works, messages)]


class _ReportOnWait:
    def __init__(self, work, report):
        self.work, self.report, self.done = work, report, False

    def wait(self):
        self.work.wait()
        if not self.done:
            self.done = True
            self.report()
        return True


class _ReportFromThread:
    def __init__(self, work, report):
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(work, report), daemon=True)
        self.thread.start()

    def _run(self, work, report):
        try:
            work.wait()
            report()
        except BaseException as exc:  # handed to whoever waits, on their own thread
            self.error = exc

    def wait(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return True


def _need(value, name, op):
    if value is None:
        raise ValueError(f"communicate({op!r}) needs {name}=")
    return value
