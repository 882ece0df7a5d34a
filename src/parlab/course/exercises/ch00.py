"""Chapter 00's exercises: a rank's share of the work, and which ranks a hang leaves waiting."""

from __future__ import annotations

import torch.distributed as dist

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, _name
from parlab.lab.language import say

#: Item counts the share check tries: fewer items than ranks, a multiple, and remainders.
SLICE_CASES = (0, 1, 3, 8, 10, 13, 101)


def _slice_on_rank(fn, cases):
    return [fn(n_items) for n_items in cases]


def check_my_slice(fn, world_size: int = 4, timeout: float = 30) -> Passed:
    """Chapter 00: ``fn(n_items)``, called on every rank, returns ``(start, stop)``: this rank's contiguous
    share of items ``0 … n_items - 1``. Together the shares must cover every item once, in rank order, and
    differ in size by at most one item."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote, my_slice(n_items) -> (start, stop)", fn=fn))
    per_rank = parlab.launch(_slice_on_rank, world_size=world_size, args=(fn, SLICE_CASES), timeout=timeout,
                             output="all", announce=False)
    for k, n_items in enumerate(SLICE_CASES):
        shares = [per_rank[r][k] for r in range(world_size)]
        for r, share in enumerate(shares):
            if not (isinstance(share, tuple) and len(share) == 2 and all(isinstance(v, int) for v in share)):
                raise ExerciseFailed(say("{fn}({n_items}) on rank {rank} returned {share!r}: return a tuple of "
                                         "two ints, (start, stop)", fn=_name(fn), n_items=n_items, rank=r,
                                         share=share))
        expected_start = 0
        for r, (start, stop) in enumerate(shares):
            if start != expected_start:
                said = dict(fn=_name(fn), n_items=n_items, world_size=world_size, rank=r, start=start,
                            next=expected_start, shares=shares)
                raise ExerciseFailed(
                    say("{fn}({n_items}) with {world_size} ranks: rank {rank} starts at {start}, which overlaps the "
                        "previous rank's share (items {next}… should be next); shares: {shares}", **said)
                    if start < expected_start else
                    say("{fn}({n_items}) with {world_size} ranks: rank {rank} starts at {start}, which leaves a gap "
                        "after share (items {next}… should be next); shares: {shares}", **said))
            if stop < start:
                raise ExerciseFailed(say("{fn}({n_items}): rank {rank} returned stop {stop} < start {start}",
                                         fn=_name(fn), n_items=n_items, rank=r, stop=stop, start=start))
            expected_start = stop
        if expected_start != n_items:
            raise ExerciseFailed(say("{fn}({n_items}) with {world_size} ranks: the shares end at item {end}, not "
                                     "{n_items}: {shares}", fn=_name(fn), n_items=n_items, world_size=world_size,
                                     end=expected_start, shares=shares))
        sizes = [stop - start for start, stop in shares]
        if max(sizes) - min(sizes) > 1:
            raise ExerciseFailed(say("{fn}({n_items}) with {world_size} ranks: shares of {sizes} items; they may "
                                     "differ by one at most ({why})", fn=_name(fn), n_items=n_items,
                                     world_size=world_size, sizes=sizes, why=_uneven_why(sizes)))
    return Passed(say("{fn} splits {cases} items over {world_size} ranks evenly, without gaps or overlaps",
                      fn=_name(fn), cases=", ".join(map(str, SLICE_CASES)), world_size=world_size))


def _uneven_why(sizes: list[int]) -> str:
    """What an uneven split did, as the learner's shares show it."""
    if sizes[-1] == max(sizes) and sizes.count(max(sizes)) == 1:
        return say("the last rank took all the remainder: give one extra item to each of the first ranks instead")
    if sizes[-1] == min(sizes):
        return say("the last rank is left short: rounding every share up gives the others one item too many each; "
                   "give one extra item to each of the first n_items % world_size ranks only")
    return say("give every rank n_items // world_size items, and one more to each of the first n_items % world_size")


def _only_even_ranks_wait():
    if dist.get_rank() % 2 == 0:
        dist.barrier()


def check_hang_prediction(waiting_ranks, world_size: int = 4, timeout: float = 2) -> Passed:
    """Chapter 00: predict which ranks the launcher will report as waiting when only the even ranks call
    ``dist.barrier()``; the check runs it (a hang of ``timeout`` seconds) and compares."""
    try:
        predicted = sorted(set(waiting_ranks))
    except TypeError:
        raise TypeError(say("waiting_ranks={waiting_ranks!r} must be a list of rank numbers, e.g. [1, 3]",
                            waiting_ranks=waiting_ranks)) from None
    try:
        parlab.launch(_only_even_ranks_wait, world_size=world_size, timeout=timeout, output="none", announce=False)
    except parlab.RankTimeoutError as hang:
        waiting = sorted(r for r, where in hang.stacks.items() if "barrier" in where)
    else:
        raise ExerciseFailed(say("the launch did not hang: with an odd number of ranks in a barrier it should"))
    if predicted != waiting:
        raise ExerciseFailed(say("you predicted ranks {predicted} would be left waiting, but the launcher found "
                                 "{waiting} rank(s) waiting in the barrier, and not those. A collective completes "
                                 "only when every rank of the group has called it: which ranks called it, and which "
                                 "had already returned?", predicted=predicted, waiting=len(waiting)))
    return Passed(say("ranks {waiting} waited in the barrier for ranks that never came, as you predicted",
                      waiting=waiting))
