"""Instruments attach from outside: ``with CommLog() as log:`` records whatever runs inside it.

A strategy says what it does (issue a collective, run a forward); it does not carry the instruments that
watch it. An instrument is entered as a context on the rank, and the places every strategy passes through
read what is attached there:

- :func:`parlab.lab.parallel.comm.communicate` (the one door for every byte a strategy sends) hands one
  :class:`~parlab.lab.measure.comm.CommRecord` to every attached :class:`~parlab.lab.measure.comm.CommLog`;
- :func:`span` (what a strategy calls around a step it names: ``forward``, ``F3``, ``optimizer``) adds an
  event to every attached :class:`~parlab.lab.measure.timeline.Timeline`; :func:`mark` and :func:`span_since`
  do the same for a span begun in one hook and ended in another, on each timeline's clock (the GPU's in
  GPU mode);
- an :class:`~parlab.lab.measure.activation_tracker.ActivationTracker` is a saved-tensors hook, so it already
  counts whatever is saved inside ``with tracker:``; :func:`not_activations` is what a strategy wraps
  around work that saves tensors but is not the activations a lesson counts (a pipeline's loss).

This is the shape of PyTorch's own instrument, ``with CommDebugMode() as mode:``.

Attachment is per process, not per thread: a rank's backward hooks, gloo's completion callbacks and the
threads a strategy starts all report to what the rank attached. Nested contexts all receive (an outer
log sees what an inner one sees). What a collective reports to is fixed when it is issued, so a record
that completes after its ``with`` block has ended still lands in the log that was open when it started.
"""

from __future__ import annotations

import contextlib
import threading

import torch

KINDS = ("comm", "timeline")
_lock = threading.Lock()
_active: dict[str, list] = {kind: [] for kind in KINDS}


def attach(kind: str, instrument) -> None:
    """Attach ``instrument`` (a ``"comm"`` sink: a callable taking a CommRecord; or a ``"timeline"``)."""
    with _lock:
        _need_kind(kind).append(instrument)


def detach(kind: str, instrument) -> None:
    """Detach ``instrument``; detaching one that is not attached is an error (a ``with`` block left twice)."""
    with _lock:
        instruments = _need_kind(kind)
        for i in range(len(instruments) - 1, -1, -1):
            if instruments[i] is instrument:
                del instruments[i]
                return
    raise RuntimeError(f"{instrument!r} is not attached as a {kind!r} instrument")


def attached(kind: str) -> tuple:
    """What is attached now, outermost first: a snapshot, so a report made later goes where it was issued."""
    with _lock:
        return tuple(_need_kind(kind))


class Attached:
    """Mixin: ``with instrument:`` attaches it for the block and returns it."""

    _attach_as = ""

    def __enter__(self):
        attach(self._attach_as, self)
        return self

    def __exit__(self, *exc):
        detach(self._attach_as, self)
        return False


@contextlib.contextmanager
def span(name: str, kind: str = "compute"):
    """Time the block as ``name`` on every attached timeline (nothing when none is attached)."""
    timelines = attached("timeline")
    if not timelines:
        yield
        return
    with contextlib.ExitStack() as stack:
        for timeline in timelines:
            stack.enter_context(timeline.span(name, kind))
        yield


def mark() -> tuple:
    """Now, on every attached timeline's clock (the host's on CPU, a CUDA event in GPU mode): hand it to
    :func:`span_since` to add a span begun here and ended in another hook (ZeRO-3's blocks and waits)."""
    return tuple((timeline, timeline.mark()) for timeline in attached("timeline"))


def span_since(name: str, started: tuple, kind: str = "compute") -> None:
    """Add the span from ``started`` (a :func:`mark`) to now, as ``name``, on each timeline it marked."""
    for timeline, start in started:
        timeline.add_between(name, kind, start, timeline.mark())


def not_activations():
    """A block whose saved tensors an attached ActivationTracker does not count (only the innermost
    saved-tensors hooks apply, so identity hooks here hide it from any tracker outside)."""
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


def _same(t):
    return t


def _need_kind(kind: str) -> list:
    if kind not in _active:
        raise ValueError(f"kind={kind!r} is not an instrument kind; choose one of {', '.join(KINDS)}")
    return _active[kind]
