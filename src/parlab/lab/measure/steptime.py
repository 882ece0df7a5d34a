"""Step time of several implementations of one thing, measured side by side (chapter 03 on; benchmarks/).

A busy machine (a laptop, a shared box, CI) makes any single timing wander. Timing each implementation in
its own block of time would charge one of them for whatever else happened then. So :func:`time_alternating`
runs on every rank and times the implementations in *alternating rounds*, rotating which one goes first,
and :func:`summarize` compares them *round by round*: the ratio of two step times measured a moment apart
is far steadier than either time. Every timed block starts behind a barrier and lasts until the slowest
rank is done, since a data- or model-parallel step is over only when every rank has finished it.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from parlab.lab import runtime
from parlab.lab.checks import positive_int


def time_alternating(step_fns: dict[str, Callable[[], object]], rounds: int = 4, steps: int = 3,
                     warmup: int = 1, group=None) -> dict[str, list[float]]:
    """On every rank: seconds per step of each ``step_fns[name]()``, one number per round.

    Each function runs one training step. ``warmup`` steps of each come first, untimed; then ``rounds``
    rounds, each timing ``steps`` consecutive steps of every function, in an order rotated each round.
    The result is the same on every rank of ``group``: the slowest rank's time.
    """
    if not step_fns:
        raise ValueError("step_fns must name at least one step function")
    for name, value in (("rounds", rounds), ("steps", steps)):
        positive_int(name, value, "timed blocks per function" if name == "rounds" else "steps per block")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (untimed steps of each function); got {warmup!r}")
    device = runtime.device()
    names = list(step_fns)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if dist.is_initialized():
            dist.barrier(group=group)

    for name in names:
        for _ in range(warmup):
            step_fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # none always goes first
        for name in order:
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                step_fns[name]()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = torch.tensor([time.perf_counter() - start], device=device)
            if dist.is_initialized():
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
            times[name].append(elapsed.item() / steps)
    return times


def summarize(times: dict[str, list[float]], reference: str) -> tuple[dict[str, float], dict[str, float]]:
    """Median step time of each, and throughput relative to ``reference``: the median over rounds of
    ``t_reference / t_name`` within the same round (above 1: faster than the reference)."""
    if reference not in times:
        raise ValueError(f"reference={reference!r} is not among the timed names: {', '.join(times)}")
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(t / s for t, s in zip(times[reference], v)) for k, v in times.items()}
    return median, ratio
