"""Ring all-reduce from scratch: a reduce-scatter, then an all-gather, each n−1 steps round a ring (chapter 02).

The ranks stand in a ring; at every step each rank sends one chunk to its right neighbour and receives
one from its left. After n−1 reduce-scatter steps rank r holds the full sum of chunk (r+1) mod n; after
n−1 all-gather steps every rank holds every summed chunk. Each rank sends 2(n−1) chunks of size
buffer/n, so ``2(n−1)/n × buffer`` bytes: the bound Patarasuk & Yuan (2009) prove optimal for
bandwidth, and the reason nccl-tests define all-reduce bus bandwidth with that factor.

Only ``isend``/``recv`` are used, so :func:`parlab.lab.measure.record_comm` counts exactly the bytes sent.
``numel`` need not divide by n: chunks come from ``tensor_split`` and may differ by one element.
``before_step(step)``, if given, runs on this rank before each of its steps (chapter 02 makes one rank
slow with it, to show that every step waits for the slowest neighbour).

Which chunk a rank sends and receives at each step is :func:`ring_chunks`, the one schedule both phases
run; :func:`ring_schedule` lists it for every rank and step, and chapter 02 draws it
(:func:`parlab.lab.plots.ring.ring_frame`) before running the ring, so the picture cannot drift from the code.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> None:
    # isend first: if every rank did a blocking send first, all would wait for a receiver (deadlock).
    request = dist.isend(send.contiguous(), right)
    dist.recv(recv, left)
    request.wait()


def ring_chunks(first: int, step: int, n: int) -> tuple[int, int]:
    """``(send, receive)``: the chunk indices a rank sends right and receives from the left at ``step`` of a
    phase. ``first`` is the chunk it sends at step 0: its own rank in the reduce-scatter, the chunk it
    then owns (:func:`owned_chunk`) in the all-gather. What it receives it sends on at the next step."""
    return (first - step) % n, (first - step - 1) % n


def owned_chunk(rank: int, n: int) -> int:
    """The chunk rank ``rank`` of ``n`` holds fully summed after the reduce-scatter."""
    return (rank + 1) % n


def ring_schedule(n: int) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """Every step of a ring all-reduce on ``n`` ranks, in order: ``(phase, step, [(send, receive) per rank])``,
    n−1 ``"reduce-scatter"`` steps then n−1 ``"all-gather"`` steps, from :func:`ring_chunks`."""
    steps = []
    for phase, first in (("reduce-scatter", lambda r: r), ("all-gather", lambda r: owned_chunk(r, n))):
        for step in range(n - 1):
            steps.append((phase, step, [ring_chunks(first(r), step, n) for r in range(n)]))
    return steps


def ring_reduce_scatter(chunks: list[torch.Tensor], before_step=None) -> int:
    """Sum ``chunks`` (views of one buffer) over the ring, in place; returns the chunk index this rank
    now holds fully summed: ``(rank + 1) % n``."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        if before_step is not None:
            before_step(step)
        # send: the partial sum I received last step (my own chunk at step 0); receive: my left neighbour's
        send_idx, recv_idx = ring_chunks(rank, step, n)
        incoming = torch.empty_like(chunks[recv_idx])
        _exchange(chunks[send_idx], incoming, right, left)
        chunks[recv_idx] += incoming
    return owned_chunk(rank, n)


def ring_all_gather(chunks: list[torch.Tensor], owned: int, before_step=None) -> None:
    """Pass complete chunks round the ring until every rank has all of them; ``owned``: the chunk index
    this rank starts with."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        if before_step is not None:
            before_step(step)
        send_idx, recv_idx = ring_chunks(owned, step, n)
        _exchange(chunks[send_idx], chunks[recv_idx], right, left)


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place, as ``dist.all_reduce`` does; returns it."""
    flat = tensor.view(-1)  # (numel,): chunks are views, so writing them writes the tensor
    chunks = list(torch.tensor_split(flat, dist.get_world_size()))  # n × (≈numel/n,)
    owned = ring_reduce_scatter(chunks)
    ring_all_gather(chunks, owned)
    return tensor
