"""Who and where am I? Rank, world size and device for code that runs on a rank (chapter 00).

These read the initialised process group (or, before one exists, the environment that ``parlab.launch``
or torchrun set), so the same function answers correctly in a notebook launch, under torchrun, and in a
plain single process (rank 0 of 1).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank() -> int:
    """This process's rank, 0 … world_size-1."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    """How many ranks take part."""
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    """This rank's index among the ranks on its machine (its GPU index in GPU mode)."""
    return int(os.environ.get("LOCAL_RANK", rank()))


def device() -> torch.device:
    """The device this rank computes on: its own GPU in NCCL mode, else the CPU."""
    if "PARLAB_DEVICE" in os.environ:
        return torch.device(os.environ["PARLAB_DEVICE"])
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", local_rank())
    return torch.device("cpu")
