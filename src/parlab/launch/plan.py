"""Planning a launch: check the request and choose the mode, before any process starts (chapter 00).

GPU mode: NCCL, one GPU per rank, when at least ``world_size`` GPUs are visible. CPU mode otherwise:
gloo, with the machine's cores shared out among the ranks. NCCL refuses two ranks on one GPU, so with
fewer GPUs than ranks ``backend="auto"`` runs on CPU and says why, and ``backend="nccl"`` is an error
that says what to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl")
# The backend argument of init_process_group in GPU mode: one backend per device type. NCCL moves CUDA
# tensors, gloo any CPU tensor a cell still has (made without device=parlab.device()), which NCCL alone
# would refuse.
GPU_MODE_BACKEND = "cpu:gloo,cuda:nccl"


@dataclass(frozen=True)
class Plan:
    world_size: int
    backend: str  # "gloo" or "nccl"
    device_type: str  # "cpu" or "cuda"
    threads: int  # CPU threads per rank
    timeout: float
    note: str = ""

    def describe(self) -> str:
        where = "CPU" if self.device_type == "cpu" else f"{self.world_size} GPU{'s' * (self.world_size > 1)}"
        ranks = f"{self.world_size} rank{'s' * (self.world_size > 1)}"
        threads = f"{self.threads} CPU thread{'s' * (self.threads > 1)} per rank"
        line = f"parlab: {ranks} · {self.backend} · {where} · {threads}"
        return f"{line} ({self.note})" if self.note else line


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def max_cpu_ranks() -> int:
    """Each rank is a process with its own copy of the model; past this many per core they only thrash."""
    return int(os.environ.get("PARLAB_MAX_RANKS", max(8, 2 * cpu_count())))


def visible_gpus() -> int:
    """GPUs a launch may use: those this process sees (respects CUDA_VISIBLE_DEVICES), or on a shared
    machine the pool PARLAB_GPUS names (see lease.py). torch counts them through NVML where it can, so
    asking does not create a CUDA context (and take GPU memory) in the kernel."""
    from parlab.launch import lease

    return lease.pool_size()


def make_plan(world_size, backend="auto", timeout=30.0, threads=None) -> Plan:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (the number of ranks, e.g. 2 or 4); got "
                        f"{type(world_size).__name__} {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1 (the number of ranks, e.g. 2 or 4); got {world_size}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int (CPU threads per rank) or None; got {threads!r}")
    gpus = visible_gpus() if backend in ("auto", "nccl") else 0
    note = ""
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) are visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). NCCL refuses two "
            f"ranks on one GPU. Use world_size <= {gpus}, or backend='gloo' to run the ranks on CPU, or "
            f"backend='auto' to choose for you." if gpus else
            "backend='nccl' needs CUDA GPUs and none is visible; use backend='gloo' or 'auto' (CPU)."
        )
    if backend == "nccl" or (backend == "auto" and gpus >= world_size):
        name, device_type = "nccl", "cuda"
    else:
        name, device_type = "gloo", "cpu"
        if backend == "auto" and 0 < gpus < world_size:
            note = f"{gpus} GPU(s) visible, NCCL needs one per rank: running on CPU instead"
        if world_size > max_cpu_ranks():
            raise ValueError(
                f"world_size={world_size} would start {world_size} processes on a machine with "
                f"{cpu_count()} CPU core(s); parlab allows at most {max_cpu_ranks()} CPU ranks here, since "
                f"each rank holds its own copy of the model and they would only fight for the cores. Use "
                f"a smaller world_size, or set the environment variable PARLAB_MAX_RANKS to raise the limit."
            )
    if threads is None:
        threads = max(1, cpu_count() // world_size)
    return Plan(world_size, name, device_type, threads, float(timeout), note)
