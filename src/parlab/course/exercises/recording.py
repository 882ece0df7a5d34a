"""What the learner's code sent, recorded on the process group itself (the exercise checks of chapters 02
and 04 read it: each op, its bytes and each send's partner)."""

from __future__ import annotations

import contextlib

import torch.distributed as dist


# -- what the learner's code sent: recorded on the process group itself ------------------------------------------
#
# Every ``torch.distributed`` call on a group (``dist.all_reduce``, ``dist.isend``, ``batch_isend_irecv`` …) ends
# in a method of ``dist.ProcessGroup``; ``record_group`` records each call there, whichever thread issues it and
# under whatever dispatch mode (``record_comm``, a dispatch mode, sees only its own thread, and not code run under
# ``_disable_current_modes``). Not seen: ops issued from C++ (DDP's reducer) or straight through
# ``torch.ops.c10d``.

#: ProcessGroup method -> the op it runs
_GROUP_OPS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "broadcast": "broadcast",
              "reduce": "reduce", "allgather": "all_gather", "_allgather_base": "all_gather",
              "allgather_into_tensor_coalesced": "all_gather", "allgather_coalesced": "all_gather",
              "all_gather_single": "all_gather", "all_gather_single_coalesced": "all_gather",
              "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
              "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
              "reduce_scatter_single_coalesced": "reduce_scatter", "alltoall": "all_to_all",
              "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all", "gather": "gather",
              "scatter": "scatter", "send": "send", "recv": "recv", "recv_anysource": "recv", "barrier": "barrier",
              "monitored_barrier": "barrier"}


class GroupLog:
    """What :func:`record_group` saw: ``records`` (``CommRecord``, ``peer`` set for sends and receives (the
    other side) and reduces (the root), in the
    order issued), and ``early``: the records of sends whose buffer was written before the send was waited on."""

    def __init__(self):
        self.records, self.early = [], []


class _WatchedSend:
    """A send's ``Work``, which notes whether the buffer sent was written (its ``_version`` moved) before the
    send was waited on."""

    def __init__(self, work, tensors, record, log):
        self._work, self._record, self._log, self._waited = work, record, log, False
        self._versions = [(t, t._version) for t in tensors]

    def _note(self):
        if not self._waited:
            self._waited = True
            if any(t._version != v for t, v in self._versions):
                self._log.early.append(self._record)

    def wait(self, *args, **kwargs):
        self._note()
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def record_group():
    """Record every op issued on any process group while the body runs (yields a :class:`GroupLog`)."""
    import time

    from parlab.lab.measure.comm import CommRecord
    from parlab.lab.measure.comm import _tensor_bytes as _nbytes

    log = GroupLog()
    cls = dist.ProcessGroup
    kept = {name: vars(cls)[name] for name in _GROUP_OPS if name in vars(cls)}

    def recorded(name, method):
        op = _GROUP_OPS[name]

        def call(group, *args, **kwargs):
            start = time.perf_counter()
            work = method(group, *args, **kwargs)
            peer = None  # the other side of a send or receive, the root of a reduce: as a global rank
            other = args[1] if op in ("send", "recv") and len(args) > 1 else getattr(
                args[1] if len(args) > 1 else None, "rootRank", None) if op == "reduce" else None
            if isinstance(other, int):
                try:
                    peer = dist.get_global_rank(group, other)
                except (ValueError, RuntimeError):  # a group the registry does not know: its own numbering
                    peer = other
            nbytes = _nbytes(args[0]) if op in ("send", "recv") else max((_nbytes(a) for a in args), default=0)
            record = CommRecord(op, nbytes, group.size(), start, time.perf_counter(), dist.get_rank(),
                                group.rank(), None, peer)
            log.records.append(record)
            if op == "send":
                return _WatchedSend(work, list(args[0]), record, log)
            return work
        return call

    try:
        for name, method in kept.items():
            setattr(cls, name, recorded(name, method))
        yield log
    finally:
        for name, method in kept.items():
            setattr(cls, name, method)
