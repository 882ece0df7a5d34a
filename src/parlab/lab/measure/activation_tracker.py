"""Activations over time: the bytes autograd holds for backward right now, and the most it held (chapter 06).

:func:`parlab.lab.measure.memory.measure_activations` counts what one forward saves; a pipeline keeps several
micro-batches' activations at once and frees each after its backward, so :class:`ActivationTracker`
follows the count as it rises and falls.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class ActivationTracker:
    """Bytes autograd holds for backward *right now*, and the most it held: for schedules that keep several
    micro-batches' activations at once (pipelines, chapter 06).

    Inside ``with tracker:`` every tensor an op saves for backward is counted (each storage once, weights
    in ``exclude`` never) and wrapped in a small holder; when autograd lets go of it (after the backward
    that used it) the holder is freed and its bytes leave the count. So ``live`` and ``peak`` follow what
    is really kept, and ``samples`` holds ``(time.perf_counter(), live bytes)`` at every change, for a plot.
    The context may be entered and left many times (around each forward, say); what was saved stays
    counted until released.
    """

    def __init__(self, exclude=()):
        params = exclude.parameters() if isinstance(exclude, nn.Module) else exclude
        self._weights = {p.untyped_storage().data_ptr() for p in params}
        self._held: dict[int, list[int]] = {}  # storage address -> [holders, bytes]
        self.live = 0
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self._hooks = None

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack_held)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None

    def _pack(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._weights or storage.nbytes() == 0:
            return t
        entry = self._held.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self._change(entry[1])
        entry[0] += 1
        # an alias without autograd history: holding `t` itself would let an op that saves its own output
        # (ReLU) keep its graph alive in a cycle (node -> holder -> t -> t.grad_fn), so a graph dropped
        # without a backward through it (retain_graph, or a split backward) would never be freed
        return _Held(self, key, t.detach())

    def _release(self, key: int) -> None:
        entry = self._held[key]
        entry[0] -= 1
        if entry[0] == 0:  # the last holder of this storage is gone: autograd no longer keeps it
            del self._held[key]
            self._change(-entry[1])

    def _change(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.samples.append((time.perf_counter(), self.live))


class _Held:
    """One saved tensor as autograd keeps it; tells its tracker when autograd drops it."""

    __slots__ = ("tracker", "key", "tensor")

    def __init__(self, tracker, key, tensor):
        self.tracker, self.key, self.tensor = tracker, key, tensor

    def __del__(self):
        self.tracker._release(self.key)


def _unpack_held(held):
    return held.tensor if isinstance(held, _Held) else held
