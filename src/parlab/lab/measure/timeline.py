"""Per-rank timelines on a common clock: what each rank did when (chapter 03 overlap, 06 pipelines).

On a rank::

    tl = Timeline()                 # barrier, then t = 0 for every rank at (nearly) the same moment
    with tl.span("forward"):        # kind "compute" by default; "comm" and "idle" are the others
        ...
    return tl.events                # plain tuples-like dataclasses travel back to the notebook

In the notebook: ``events = merge(results)`` gives one list, ``idle_gaps(events)`` adds the waits, and
``parlab.lab.plots.gantt(events)`` draws them.

Why a barrier: each process reads its own clock. On one machine ``time.perf_counter`` is the system-wide
monotonic clock, but on several nodes clocks differ; leaving a barrier together gives every rank the
same zero to within the barrier's skew (microseconds on one host), which is what a Gantt chart needs.

On a GPU (GPU mode) the host only queues work, so host times say when work was queued, not when it ran.
There a timeline keeps the GPU's clock (``parlab.lab.measure.gpu_clock``): a reference CUDA event recorded
at its zero, once the device has drained, and each span's start and end are events on the current stream,
read against it when ``events`` is read. A ``CommLog`` feeding the timeline reads its ops on the same clock,
so compute and communication share one axis and an overlap is the GPU's, not the host's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch.distributed as dist

from parlab.lab.measure.attach import Attached

KINDS = ("compute", "comm", "idle")


@dataclass(frozen=True)
class Event:
    rank: int
    name: str
    kind: str
    start: float  # seconds since the timeline's zero
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Timeline(Attached):
    """One rank's events; ``events`` is the list. ``with Timeline() as tl:`` attaches it: every span a
    strategy names inside the block (``parlab.lab.measure.attach.span``) lands here.

    In GPU mode its spans are placed on the GPU's clock (``clock``, a
    :class:`~parlab.lab.measure.gpu_clock.GpuClock`; None on CPU): CUDA events, read when ``events`` is
    read, so nothing waits for the GPU while the step runs. ``sync=True`` also makes the host wait for
    the device at each span's end (the old way: it serialises the host with every stream, NCCL's included,
    so a wait measured after it reads about 0). On a CPU rank it never touches CUDA (a CPU-mode rank on a
    GPU machine would create a context on a GPU it was not given)."""

    _attach_as = "timeline"

    def __init__(self, sync: bool | None = None):
        from parlab.lab import runtime
        from parlab.lab.measure import gpu_clock

        self.device = runtime.device()
        if self.device.type == "cuda":  # drained before the barrier: each rank's GPU is idle at the common zero
            gpu_clock.cuda.synchronize(self.device)
        if dist.is_initialized():
            dist.barrier()
        self.zero = time.perf_counter()
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        # GPU mode: the reference event, recorded on an idle GPU at (nearly) the zero; its readings are host times
        self.clock = gpu_clock.GpuClock(self.device, drain=False) if self.device.type == "cuda" else None
        self.sync = bool(sync) and self.clock is not None
        self._events: list[Event] = []
        self._pending: list[tuple] = []  # GPU spans: (name, kind, start event, end event), read with events
        self._feeds: list = []  # CommLogs that add spans to this timeline: read before the events are

    @property
    def events(self) -> list[Event]:
        for log in self._feeds:
            log.records  # noqa: B018 - reading a log times its GPU ops, and their spans land here
        while self._pending:
            name, kind, start, end = self._pending.pop(0)
            self.add(name, kind, self.clock.at(start), self.clock.at(end))
        return self._events

    def fed_by(self, log) -> None:
        """``log`` (a CommLog) adds spans here; on GPUs some only once read, so reading ``events`` reads it."""
        if not any(fed is log for fed in self._feeds):
            self._feeds.append(log)

    def add(self, name: str, kind: str, start: float, end: float) -> None:
        """Add an event whose ``start`` and ``end`` are ``time.perf_counter()`` readings."""
        _check_kind(kind)
        self._events.append(Event(self.rank, name, kind, start - self.zero, end - self.zero))

    def mark(self):
        """Now, on this timeline's clock: the host's ``time.perf_counter()`` on CPU; in GPU mode a CUDA event on
        the current stream (when the GPU gets here). Two marks make a span: :meth:`add_between`."""
        return self.clock.mark() if self.clock is not None else time.perf_counter()

    def add_between(self, name: str, kind: str, start, end) -> None:
        """Add the span from mark ``start`` to mark ``end`` (:meth:`mark`), for a span begun in one hook and
        ended in another (ZeRO-3's blocks and waits, chapter 04)."""
        _check_kind(kind)
        if self.clock is None:
            self.add(name, kind, start, end)
        else:
            self._pending.append((name, kind, start, end))

    @contextmanager
    def span(self, name: str, kind: str = "compute"):
        _check_kind(kind)
        start = self.mark()
        try:
            yield
        finally:
            if self.sync:
                from parlab.lab.measure.gpu_clock import cuda
                cuda.synchronize(self.device)
            self.add_between(name, kind, start, self.mark())


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not a timeline kind; choose one of {', '.join(KINDS)}")


def merge(results) -> list[Event]:
    """One list from what the ranks returned: a list of event lists, or of dicts with an ``"events"`` key."""
    out = []
    for r in results:
        out.extend(r["events"] if isinstance(r, dict) else r)
    return sorted(out, key=lambda e: (e.rank, e.start))


def idle_gaps(events, min_seconds: float = 0.0) -> list[Event]:
    """``events`` plus an ``idle`` event for every gap on a rank between its first and last event."""
    out = list(events)
    by_rank: dict[int, list[Event]] = {}
    for e in events:
        by_rank.setdefault(e.rank, []).append(e)
    for rank, evs in by_rank.items():
        evs.sort(key=lambda e: e.start)
        busy_until = evs[0].end
        for e in evs[1:]:
            if e.start - busy_until > min_seconds:
                out.append(Event(rank, "idle", "idle", busy_until, e.start))
            busy_until = max(busy_until, e.end)
    return sorted(out, key=lambda e: (e.rank, e.start))
