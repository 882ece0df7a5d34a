"""Chapter 00's exercise: the mean of a tensor over all ranks."""

from __future__ import annotations

import torch.distributed as dist

from parlab.exercises.core import Passed, _name, check_ranks


def _mean_over_ranks(t):
    dist.all_reduce(t)
    t.div_(dist.get_world_size())


def check_mean_over_ranks(fn, world_size: int = 4, timeout: float = 30) -> Passed:
    """Chapter 00: ``fn(t)`` must leave in ``t``, on every rank, the mean of ``t`` over all ranks."""
    check_ranks(fn, _mean_over_ranks, world_size, timeout=timeout)
    return Passed(f"{_name(fn)} leaves the mean over {world_size} ranks on every rank")
