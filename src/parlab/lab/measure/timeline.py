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
On CUDA, pass ``sync=True`` so a span ends when the GPU has finished, not when the CPU has queued work.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
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

    ``sync``: wait for this rank's GPU at each span's end, so that the end is the work's and not the moment
    it was queued; default (None): in GPU mode. On a CPU rank it never touches CUDA (a CPU-mode rank on a
    GPU machine would create a context on a GPU it was not given)."""

    _attach_as = "timeline"

    def __init__(self, sync: bool | None = None):
        from parlab.lab import runtime
        if dist.is_initialized():
            dist.barrier()
        self.zero = time.perf_counter()
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.device = runtime.device()
        self.sync = (sync is None or sync) and self.device.type == "cuda"
        self._events: list[Event] = []
        self._feeds: list = []  # CommLogs that add spans to this timeline: read before the events are

    @property
    def events(self) -> list[Event]:
        for log in self._feeds:
            log.records  # noqa: B018 - reading a log times its GPU ops, and their spans land here
        return self._events

    def fed_by(self, log) -> None:
        """``log`` (a CommLog) adds spans here; on GPUs some only once read, so reading ``events`` reads it."""
        self._feeds.append(log)

    def add(self, name: str, kind: str, start: float, end: float) -> None:
        """Add an event whose ``start`` and ``end`` are ``time.perf_counter()`` readings."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not a timeline kind; choose one of {', '.join(KINDS)}")
        self._events.append(Event(self.rank, name, kind, start - self.zero, end - self.zero))

    @contextmanager
    def span(self, name: str, kind: str = "compute"):
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize(self.device)
            self.add(name, kind, start, time.perf_counter())


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
