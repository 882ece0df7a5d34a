"""The chapters' parameters, checked where a learner sets them: the first code cell after the Parameters
cell of every chapter calls :func:`check_world_size`, so a world size the chapter cannot run stops there,
with one sentence saying why and what to set, instead of a gloo "pair is not connected" or a
``ZeroDivisionError`` minutes later.

A learner with one GPU may be tempted by ``world_size = 1``. Every chapter splits work across ranks and
compares them, so one rank has nothing to show; two or more ranks run anyway, on the CPU, one process each
(GPU mode needs a GPU per rank: chapter 00).
"""

from __future__ import annotations


class WorldSizeError(ValueError):
    """A chapter's ``world_size`` it cannot run, said in one sentence."""


def check_world_size(world_size, least: int = 2) -> int:
    """``world_size`` if this chapter can run it (an int, at least ``least``), else :class:`WorldSizeError`
    (``TypeError`` for a value that is not an int)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (the number of ranks, e.g. 2 or 4); got "
                        f"{type(world_size).__name__} {world_size!r}")
    if world_size < least:
        rank = "no second rank" if world_size == 1 else "no ranks"
        raise WorldSizeError(
            f"world_size={world_size} has {rank} to share the work or compare with, and this chapter needs "
            f"{least} or more; set world_size = {max(least, 2)} in the Parameters cell: with one GPU, or none, "
            f"the ranks run on the CPU, one process each")
    return world_size
