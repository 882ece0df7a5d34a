"""One door for every byte a strategy sends: issue a collective on a group, and record it (chapters 03–07).

Every from-scratch strategy in ``parlab.parallel`` (DDP in chapter 03, ZeRO in 04, tensor parallelism in
05, pipelines in 06) communicates through :func:`communicate`. It takes the *group* the strategy was
given (a strategy never assumes the whole world: chapter 07 runs DDP on the ``dp`` axis of a mesh), runs
the op, and, if the strategy was given an ``on_collective`` callback, hands it one
:class:`~parlab.measure.comm.CommRecord` when the op completes: op, bytes (nccl-tests' size), the group's
size, this rank's global and in-group rank, start and end times, and a label (bucket, layer …).
A :class:`~parlab.measure.comm.CommLog` is such a callback, so one log can count what every strategy sent.

For an asynchronous collective the record is made when its future completes (exact with gloo on CPU;
with NCCL the host learns of completion only approximately, so time GPU work with CUDA events), and the
waitable returned here completes only after the callback has run. The callback may run on another thread,
so it should only record.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from parlab.measure.comm import CommRecord, describe_group

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv", "scatter", "gather", "reduce")
OnCollective = Callable[[CommRecord], None]


def check_callback(on_collective) -> None:
    """A strategy's constructor calls this, so a wrong callback fails at once, not in the middle of backward."""
    if on_collective is not None and not callable(on_collective):
        raise TypeError(f"on_collective must be a callable taking a CommRecord (e.g. a parlab.measure.CommLog), "
                        f"or None; got {on_collective!r}")


def communicate(op: str, tensor: torch.Tensor, group=None, *, output: torch.Tensor | None = None,
                src: int | None = None, peer: int | None = None, dst: int | None = None,
                chunks: list | None = None, async_op: bool = False,
                on_collective: OnCollective | None = None, label=None):
    """Run one op on ``group`` (``None``: the default group) and report it to ``on_collective``.

    - ``all_reduce``: sums ``tensor`` over the group, in place.
    - ``broadcast``: ``tensor`` from the group's rank ``src`` (an in-group rank), in place.
    - ``all_gather``: ``output`` (group size × ``tensor``'s numel) ← every rank's ``tensor``, in group order.
    - ``reduce_scatter``: ``output`` ← this rank's slice of the sum of every rank's ``tensor``.
    - ``send`` / ``recv``: ``tensor`` to / from the group's rank ``peer`` (in-group).
    - ``scatter``: ``tensor`` ← chunk r of ``chunks``, the list of group-size tensors that only rank ``src``
      gives (chapter 03: DataParallel's inputs leaving GPU 0).
    - ``gather``: ``chunks`` (given on rank ``dst`` only) ← every rank's ``tensor``, in group order.
    - ``reduce``: the sum of every rank's ``tensor`` lands in ``tensor`` on rank ``dst`` (other ranks'
      buffers are left unspecified, as ``dist.reduce`` says).

    Bytes recorded follow nccl-tests' "size" on every rank: the whole buffer (all-reduce, broadcast,
    reduce, send/recv), the gathered output (all-gather, gather: group size × ``tensor``) or the input
    before it is split (reduce-scatter, scatter: group size × ``tensor``).

    Returns ``None`` when synchronous; otherwise an object whose ``wait()`` returns once the op and its
    report are done.
    """
    group = group if group is not None else dist.group.WORLD
    start = time.perf_counter()
    if op in ("scatter", "gather", "reduce"):
        root = dist.get_global_rank(group, _need(src if op == "scatter" else dst,
                                                 "src" if op == "scatter" else "dst", op))
        mine = dist.get_rank() == root
        if op == "scatter":
            work = dist.scatter(tensor, chunks if mine else None, src=root, group=group, async_op=async_op)
        elif op == "gather":
            work = dist.gather(tensor, chunks if mine else None, dst=root, group=group, async_op=async_op)
        else:
            work = dist.reduce(tensor, root, group=group, async_op=async_op)
    elif op == "all_reduce":
        work = dist.all_reduce(tensor, group=group, async_op=async_op)
    elif op == "broadcast":
        work = dist.broadcast(tensor, src=dist.get_global_rank(group, _need(src, "src", op)), group=group,
                              async_op=async_op)
    elif op == "all_gather":
        work = dist.all_gather_into_tensor(_need(output, "output", op), tensor, group=group, async_op=async_op)
    elif op == "reduce_scatter":
        work = dist.reduce_scatter_tensor(_need(output, "output", op), tensor, group=group, async_op=async_op)
    elif op in ("send", "recv"):
        other = dist.get_global_rank(group, _need(peer, "peer", op))
        p2p = dist.isend if op == "send" else dist.irecv
        work = p2p(tensor, other, group=group)
        if not async_op:
            work.wait()
            work = None
    else:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    if on_collective is None:
        return work
    # nccl-tests' size: the whole buffer; the gathered output for all-gather, the input for reduce-scatter
    nbytes = (output if op == "all_gather" else tensor)
    nbytes = nbytes.numel() * nbytes.element_size()
    rank, group_rank, size = describe_group(group)
    if op in ("scatter", "gather"):  # every rank holds one chunk; the buffer is all of them
        nbytes *= size

    def report(_=None):
        on_collective(CommRecord(op, nbytes, size, start, time.perf_counter(), rank, group_rank, label))

    if work is None:
        report()
        return None
    if op in ("send", "recv"):  # gloo's point-to-point work has no future: report when waited for
        return _ReportOnWait(work, report)
    return work.get_future().then(report)  # runs when the collective completes


class _ReportOnWait:
    def __init__(self, work, report):
        self.work, self.report, self.done = work, report, False

    def wait(self):
        self.work.wait()
        if not self.done:
            self.done = True
            self.report()
        return True


def _need(value, name, op):
    if value is None:
        raise ValueError(f"communicate({op!r}) needs {name}=")
    return value
