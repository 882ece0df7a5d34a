"""Planning a launch: check the request and choose the mode, before any process starts (chapter 00).

GPU mode: NCCL, one GPU per rank, when at least ``world_size`` GPUs are visible. CPU mode otherwise:
gloo, with the machine's cores shared out among the ranks. NCCL refuses two ranks on one GPU, so with
fewer GPUs than ranks ``backend="auto"`` runs on CPU and says why, and ``backend="nccl"`` is an error
that says what to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from parlab.lab.language import say
from parlab.lab.runtime import BACKENDS, GPU_MODE_BACKEND, choose, tolerance  # the one decision (runtime.py)

__all__ = ["BACKENDS", "GPU_MODE_BACKEND", "LAUNCH_LOG", "Plan", "make_plan", "record_launch", "visible_gpus"]

# `parlab run --require-gpu` names a file here: every launch appends what it ran on (course.gpu_launches).
LAUNCH_LOG = "PARLAB_LAUNCH_LOG"


@dataclass(frozen=True)
class Plan:
    world_size: int
    backend: str  # "gloo" or "nccl"
    device_type: str  # "cpu" or "cuda"
    threads: int  # CPU threads per rank
    timeout: float
    note: str = ""
    gpus: int = 0  # GPUs visible to the launch (the lease pool's when leasing); 0 when backend="gloo" asked

    @property
    def group_backend(self) -> str:
        """``init_process_group``'s argument on the ranks: ``GPU_MODE_BACKEND`` in GPU mode (NCCL for CUDA
        tensors, gloo for CPU ones), else ``"gloo"``. ``backend`` is the short name the launcher prints."""
        return GPU_MODE_BACKEND if self.device_type == "cuda" else self.backend

    @property
    def tolerance(self) -> dict:
        """``assert_close``'s keyword arguments for this launch's results against one CPU process
        (``runtime.TOLERANCE``: the defaults on CPU ranks, a measured bound on GPU ranks)."""
        return tolerance(self.device_type)

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
    from parlab.lab.launch import lease

    return lease.pool_size()


def make_plan(world_size, backend="auto", timeout=30.0, threads=None) -> Plan:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(say("world_size must be an int (the number of ranks, e.g. 2 or 4); got {type} {value!r}",
                            type=type(world_size).__name__, value=world_size))
    if world_size < 1:
        raise ValueError(say("world_size must be at least 1 (the number of ranks, e.g. 2 or 4); got {value}",
                             value=world_size))
    if backend not in BACKENDS:
        raise ValueError(say("backend must be one of {allowed}; got {backend!r}",
                             allowed=', '.join(map(repr, BACKENDS)), backend=backend))
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(say("timeout must be a positive number of seconds; got {timeout!r}", timeout=timeout))
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(say("threads must be a positive int (CPU threads per rank) or None; got {threads!r}",
                             threads=threads))
    # All ranks of a launch are on this machine: its world is its local world. The mode is runtime's.
    gpus = visible_gpus() if backend in ("auto", "nccl") else 0
    mode = choose(world_size, 0, gpus, backend)
    name, device_type, note = mode.name, mode.device.type, mode.note
    if not mode.gpu and world_size > max_cpu_ranks():
        raise ValueError(say(
            "world_size={world_size} would start {world_size} processes on a machine with {cores} CPU core(s); "
            "parlab allows at most {most} CPU ranks here, since each rank holds its own copy of the model and they "
            "would only fight for the cores. Use a smaller world_size, or set the environment variable "
            "PARLAB_MAX_RANKS to raise the limit.", world_size=world_size, cores=cpu_count(), most=max_cpu_ranks()))
    if threads is None:
        threads = max(1, cpu_count() // world_size)
    return Plan(world_size, name, device_type, threads, float(timeout), note, gpus)


def record_launch(world_size: int, backend: str, device_type: str, note: str, gpus: int, via: str) -> None:
    """Append one launch to the file ``PARLAB_LAUNCH_LOG`` names, if any (one JSON object a line)."""
    path = os.environ.get(LAUNCH_LOG)
    if not path:
        return
    import json

    line = json.dumps({"world_size": world_size, "backend": backend, "device_type": device_type, "note": note,
                       "gpus": gpus, "via": via})
    with open(path, "a") as f:
        f.write(line + "\n")
