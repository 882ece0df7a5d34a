"""Chapter 02's exercise: all-reduce built from point-to-point messages (a ring)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from parlab.exercises.core import ExerciseFailed, Passed, _name, check_ranks


def check_ring_all_reduce(fn, world_size: int = 4, numel: int | None = None, timeout: float = 30) -> Passed:
    """Chapter 02's exercise: ``fn(tensor)`` must sum ``tensor`` over all ranks like ``dist.all_reduce``,
    using only send/recv (isend/irecv), sending ``2(n−1)/n`` of the buffer per rank."""
    numel = numel or 3 * world_size

    def make_input(rank, n):
        return torch.arange(numel, dtype=torch.float32) + 100 * rank

    results = check_ranks(fn, _all_reduce, world_size, make_input, timeout, _record=True)
    buffer = numel * 4
    expected_bytes = 2 * (world_size - 1) / world_size * buffer
    sent = []
    for rank, r in enumerate(results):
        others = sorted({rec.op for rec in r["records"]} - {"send", "recv"})
        if others:
            raise ExerciseFailed(f"{_name(fn)} on rank {rank} called {', '.join(others)}: the exercise is to "
                                 f"build all-reduce from point-to-point messages (send/recv, isend/irecv)")
        sent.append(sum(rec.bytes for rec in r["records"] if rec.op == "send"))
    mean_sent = sum(sent) / world_size
    # chunks may differ by one element when numel % n != 0, so compare the mean over ranks
    if not math.isclose(mean_sent, expected_bytes, rel_tol=0.01):
        raise ExerciseFailed(f"{_name(fn)} gives the right sums but ranks sent {sent} bytes "
                             f"(mean {mean_sent:g}); a ring sends 2(n−1)/n × {buffer} = {expected_bytes:g} "
                             f"bytes per rank")
    return Passed(f"{_name(fn)} matches dist.all_reduce on {world_size} ranks; each rank sent "
                  f"{mean_sent:g} bytes = 2(n−1)/n × {buffer}-byte buffer")


def _all_reduce(t):
    dist.all_reduce(t)
