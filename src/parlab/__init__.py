"""Parallelism Lab: a notebook course on training one model on many GPUs.

The public face: :func:`launch` runs a function on N ranks, ``%load_ext parlab`` adds the ``%%ranks``
cell magic, and :func:`rank`, :func:`world_size`, :func:`local_rank`, :func:`device` tell code on a
rank who and where it is. The measuring instruments (chapter 01 on): :func:`estimate_memory`,
:func:`measure_memory`, :func:`count_params`, :func:`record_comm`, :class:`Timeline`.
"""

from parlab.launch import LaunchError, RankCrashedError, RankError, RankTimeoutError, launch
from parlab.measure import Timeline, count_params, estimate_memory, measure_memory, record_comm
from parlab.runtime import device, local_rank, rank, world_size

__version__ = "0.1.0"

__all__ = ["launch", "rank", "world_size", "local_rank", "device", "LaunchError", "RankError",
           "RankCrashedError", "RankTimeoutError", "estimate_memory", "measure_memory", "count_params",
           "record_comm", "Timeline", "load_ipython_extension"]


def load_ipython_extension(ipython):
    """``%load_ext parlab``: registers the ``%%ranks`` cell magic."""
    from parlab.magic import register

    register(ipython)
