"""Chapter 02's exercises: all-reduce by recursive doubling, built from point-to-point messages, and when
it beats the ring under the α-β model; the "think" questions beside them are checked by :func:`parlab.course.exercises.core.check_choice`.

The checks draw fresh inputs on every call, so a number printed by a failed check cannot be copied into a
passing answer."""

from __future__ import annotations

import math
import random

import torch
import torch.distributed as dist

from parlab.course.exercises.core import (ExerciseFailed, Passed, _name, check_choice, check_function, check_ranks,
                                         later)
from parlab.lab.language import say
from parlab.lab.launch.errors import RankError


def check_recursive_doubling(fn, world_size: int = 4, numel: int = 12, timeout: float = 30) -> Passed:
    """Chapter 02: ``fn(tensor)`` must sum ``tensor`` over all ranks in place like ``dist.all_reduce``, by
    recursive doubling: log₂ n steps, in step k each rank swaps its whole buffer with rank ``rank XOR 2^k``
    and adds. Only send/recv (isend/irecv) are allowed; each rank must send log₂ n × the buffer."""
    if world_size < 2 or world_size & (world_size - 1):
        raise ValueError(say("world_size={world_size}: recursive doubling needs a power of two (2, 4, 8 ranks)",
                             world_size=world_size))

    offset = float(random.randrange(1, 1000))  # new every call: printed sums cannot be copied

    def make_input(rank, n):
        return torch.arange(numel, dtype=torch.float32) + 100 * rank + offset

    try:
        results = check_ranks(fn, _all_reduce, world_size, make_input, timeout, _record=True)
    except RankError as error:  # the learner's function raised on a rank: say so, not the launcher's traceback
        if error.type_name == "NotImplementedError":
            raise ExerciseFailed(say("{fn} is not written yet (it raises NotImplementedError)", fn=_name(fn))
                                 ) from None
        raise ExerciseFailed(say("{fn} raised {error_type} on rank {rank} of {world_size}: {message}", fn=_name(fn),
                                 error_type=error.type_name, rank=error.rank, world_size=world_size,
                                 message=error.remote_message)) from None
    buffer = numel * 4
    steps = int(math.log2(world_size))
    for rank, r in enumerate(results):
        others = sorted({rec.op for rec in r["records"]} - {"send", "recv"})
        if others:
            raise ExerciseFailed(say("{fn} on rank {rank} called {ops}: build the all-reduce from point-to-point "
                                     "messages (send/recv, isend/irecv)", fn=_name(fn), rank=rank,
                                     ops=", ".join(others)))
        sends = [rec for rec in r["records"] if rec.op == "send"]
        partners = sorted(rank ^ (1 << k) for k in range(steps))
        if sorted(rec.peer for rec in sends) != partners:
            raise ExerciseFailed(say("{fn} gives the right sums, but rank {rank} sent to ranks {peers}; in "
                                     "recursive doubling's step k rank r swaps with rank r XOR 2^k, so rank {rank} "
                                     "sends once to each of {partners}", fn=_name(fn), rank=rank,
                                     peers=[rec.peer for rec in sends], partners=partners))
        wrong = [rec for rec in sends if rec.bytes != buffer]
        if wrong:
            raise ExerciseFailed(say("{fn} gives the right sums, but rank {rank} sent {sent} bytes to rank {peer}; "
                                     "recursive doubling sends the whole {buffer}-byte buffer in every step, "
                                     "log₂ {world_size} = {steps} steps: {total} bytes", fn=_name(fn), rank=rank,
                                     sent=wrong[0].bytes, peer=wrong[0].peer, buffer=buffer, world_size=world_size,
                                     steps=steps, total=steps * buffer))
        if r["early"]:
            raise ExerciseFailed(say("{fn} gives the right sums here, but rank {rank} wrote into the buffer it was "
                                     "sending to rank {peer} before that isend was waited on: the send may still be "
                                     "reading it (gloo copied it in time on this machine; NCCL reads it while it "
                                     "runs). Send a copy, or wait for the send before adding.", fn=_name(fn),
                                     rank=rank, peer=r["early"][0].peer))
    return Passed(say("{fn} matches dist.all_reduce on {world_size} ranks, each rank swapping its whole buffer with "
                      "rank XOR 2^k in step k: log₂ n × buffer = {total} bytes per rank", fn=_name(fn),
                      world_size=world_size, total=steps * buffer))


def _all_reduce(t):
    dist.all_reduce(t)


def _crossover_bytes(n, alpha, bandwidth):
    steps = math.log2(n)
    # ring: 2(n-1)·(α + m/(n·B)); recursive doubling: log2(n)·(α + m/B); equal at m*
    return alpha * bandwidth * (2 * (n - 1) - steps) / (steps - 2 * (n - 1) / n)


def check_crossover_bytes(fn) -> Passed:
    """Chapter 02: ``fn(n, alpha, bandwidth)`` → the message size in bytes at which a ring all-reduce and
    recursive doubling take the same time on ``n`` ranks, when every message costs ``alpha`` seconds plus
    its bytes over ``bandwidth`` bytes/s (below it recursive doubling wins, above it the ring)."""
    draw = random.Random()  # new cases every call: an expected value printed once cannot be reused
    cases = [dict(n=n, alpha=round(a * draw.uniform(0.5, 2), 9), bandwidth=round(b * draw.uniform(0.5, 2), -6))
             for n in (4, 8, 64) for a in (5e-6, 2e-5) for b in (1e9, 2.5e10)]
    return check_function(fn, _crossover_bytes, cases, refuse=("ch02.2", say("the exercise asks for the crossover "
                          "worked out from the two algorithms' costs, not the check's own answer")))


#: Exercise 1's question: why the buffer sent must not be added into while its isend is in flight.
SEND_BUFFER = {
    "a": (later.say("isend may still be reading the buffer when you add into it, so the partner could receive "
                    "a partly summed buffer"), ""),
    "b": (later.say("gloo and NCCL cannot send the same tensor twice"),
          later.say("They can: a tensor may be sent any number of times; what matters is when it is read.")),
    "c": (later.say("the partner's sum would count your values twice, because tensors are shared between ranks"),
          later.say("Ranks are separate processes: a send copies bytes, nothing is shared between them.")),
}
#: Exercise 2's question: which algorithm wins for buffers below the crossover.
BELOW_CROSSOVER = {
    "ring": (later.say("the ring"), later.say("Below the crossover latency dominates: the ring pays 2(n−1) "
                                              "latencies, recursive doubling only log₂ n.")),
    "recursive doubling": (later.say("recursive doubling: log₂ n latencies instead of 2(n−1)"), ""),
}


def check_send_buffer(answer) -> Passed:
    """Chapter 02, exercise 1: why must the buffer you send not be the one you add into before its ``isend``
    is waited on? (After the wait it may be: the send has read it.)"""
    return check_choice(say("Why send a copy"), answer, SEND_BUFFER, "a")


def check_below_crossover(answer) -> Passed:
    """Chapter 02, exercise 2: which algorithm wins for buffers smaller than the crossover?"""
    return check_choice(say("Below the crossover"), answer, BELOW_CROSSOVER, "recursive doubling")
