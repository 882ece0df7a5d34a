"""Times on a GPU's own clock: CUDA events read against one reference event (chapters 03, 04, 06 on GPUs).

On a GPU the host only queues work. A collective issued at host time t may start on the GPU much later
(behind the kernels queued before it, or behind the group's previous collective), and NCCL's ``wait()``
returns at once. Host times would put every op where the host issued it, so a Gantt chart would show
overlap whether the GPU overlapped or not. A :class:`GpuClock` places everything on the GPU's clock
instead: it records one reference event when a timeline (or a log) starts, after the device has drained,
and a point in time is an event recorded on a stream; :meth:`GpuClock.at` reads ``reference.elapsed_time``
of it. Compute spans and communication records on one clock share the same axis, so "did the op start
before backward ended" is a question about the GPU, which a serialised run answers with no.

The reading is expressed on the host's axis (``host_zero + elapsed``): ``host_zero`` is the host's
``time.perf_counter()`` when the reference was recorded on an idle device, so host times (a memory trace)
and GPU times stay comparable to within a launch's latency.

``cuda`` is the one door to ``torch.cuda`` for the instruments (events, streams, synchronize); tests on CPU
replace it with a simulated GPU (``tests/test_comm.py``).
"""

from __future__ import annotations

import time

import torch

cuda = torch.cuda  # events, streams and synchronize: replaced by a fake GPU in tests on CPU


class GpuClock:
    """One device's clock: a reference event recorded once, after the device has drained; every later event
    is read as seconds on the host's ``perf_counter`` axis (:meth:`at`). ``drain=False``: no waiting (made in
    the middle of a step); times keep their order and their differences, the axis may be offset."""

    def __init__(self, device, drain: bool = True):
        self.device = device
        if drain:  # idle: the reference fires as the host reads host_zero (else it may fire later: an offset)
            cuda.synchronize(device)
        self.reference = cuda.Event(enable_timing=True)
        self.reference.record(cuda.current_stream(device))
        self.host_zero = time.perf_counter()

    def mark(self, stream=None):
        """Now, on ``stream`` (default: the current one): an event that fires when the GPU gets there."""
        event = cuda.Event(enable_timing=True)
        event.record(stream if stream is not None else cuda.current_stream(self.device))
        return event

    def at(self, event) -> float:
        """When ``event`` fired, on the host's axis (waits for it: read a clock after the work is queued)."""
        event.synchronize()
        return self.host_zero + self.reference.elapsed_time(event) / 1e3


def time_collectives(group) -> None:
    """Ask ``group``'s backends to time each collective on its own stream (NCCL records a start event just
    before the kernel: ``Work._get_duration()``), so a record's start is when NCCL ran it, not when its
    inputs were ready. A backend that cannot is left as it is."""
    enable = getattr(group, "_enable_collectives_timing", None)
    if enable is None:
        return
    try:
        enable()
    except RuntimeError:  # a backend without timing: the start falls back to the issuing stream's event
        pass


def nccl_seconds(work) -> float | None:
    """The op's own duration on the backend's stream (start event to end event), or None where the backend
    did not time it (timing off, a Future rather than a Work, a CPU backend)."""
    duration = getattr(work, "_get_duration", None)
    if duration is None:
        return None
    try:
        ms = duration()
    except RuntimeError:
        return None
    return ms / 1e3 if ms >= 0 else None


class GpuTiming:
    """When an op on CUDA tensors ran on the GPU, as CUDA events, read only when asked (:meth:`span`).

    NCCL queues a collective and returns; its future completes at once. Timing it on the host (waiting,
    or synchronising the device) would block the host exactly where the strategy overlaps communication
    with compute, so the overlap would vanish while it is being recorded. Instead ``ready`` is an event on
    the issuing stream (the op's inputs are ready there), and ``end`` an event recorded on a side stream
    made to wait for the op: neither the host nor the compute stream waits. The op's start on the GPU is
    when NCCL ran it: ``end`` less the duration NCCL measured on its own stream (``Work._get_duration``,
    switched on for ``group`` here), and never before ``ready``; without NCCL's timing, ``ready``.
    Both are read on a :class:`~parlab.lab.measure.gpu_clock.GpuClock`, the axis of the compute spans."""

    def __init__(self, device, host_start: float, group=None):
        self.device, self.host_start, self.work = device, host_start, None
        if group is not None:
            time_collectives(group)  # before the op is issued: its Work then carries NCCL's events
        self.ready = cuda.Event(enable_timing=True)
        self.end = cuda.Event(enable_timing=True)
        self.ready.record(cuda.current_stream(device))

    def end_after(self, waitable=None) -> None:
        """Record the end once ``waitable`` (a ``Work`` or a CUDA future; None: the op was synchronous and the
        current stream already follows it) is done."""
        self.work = waitable
        if waitable is None:
            self.end.record(cuda.current_stream(self.device))
            return
        side = cuda.Stream(self.device)  # from PyTorch's pool: one op's end does not queue behind another's
        with cuda.stream(side):
            waitable.wait()  # for NCCL: the side stream waits on the op's end; the host does not
            self.end.record(side)

    def span(self, clock) -> tuple[float, float]:
        """(start, end) of the op on ``clock`` (a GpuClock): seconds on the host's ``perf_counter`` axis."""
        end, ready = clock.at(self.end), clock.at(self.ready)
        ran = nccl_seconds(self.work)
        return (ready if ran is None else min(end, max(ready, end - ran))), end
