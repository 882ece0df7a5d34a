"""From the notebook to a cluster: ``parlab.launch`` inside a job that torchrun or SLURM started.

In a notebook, ``parlab.launch(fn, 4)`` starts 4 ranks. In a script run by
``torchrun --nnodes 2 --nproc-per-node 2 script.py`` the ranks already exist: each process is one of them,
and its environment says which (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``; under plain ``srun``, ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``). Then
``launch`` joins that job's process group, runs ``fn`` on this process's rank only, and returns this
rank's result. So a function written in a notebook cell runs unchanged on many nodes. Chapter 00,
"From notebook to cluster".
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    source: str  # "torchrun", "slurm" or "environment"


def current_job() -> Job | None:
    """The distributed job this process already belongs to, or None (then launch starts its own ranks)."""
    env = os.environ
    if env.get("PARLAB_IN_RANK"):
        return None
    if all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return Job(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                   int(env.get("LOCAL_WORLD_SIZE", 1)),
                   "torchrun" if "TORCHELASTIC_RUN_ID" in env else "environment")
    if all(k in env for k in ("SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT")):
        per_node = env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
        return Job(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                   int(per_node) if per_node.isdigit() else 1, "slurm")
    return None


def run_in_job(job: Job, fn, args, kwargs, world_size, backend, timeout, announce):
    """Run ``fn`` on this process's rank of ``job``; returns this rank's result. Errors propagate as they
    are: torchrun and SLURM report a failing rank themselves."""
    import torch
    import torch.distributed as dist

    from parlab.lab.runtime import NO_GPUS, choose

    if world_size != job.world_size:
        raise ValueError(
            f"launch(world_size={world_size}) was called in a job of {job.world_size} ranks started by "
            f"{job.source}; pass world_size={job.world_size} (e.g. int(os.environ['WORLD_SIZE'])) or start "
            f"the job with {world_size} ranks.")
    # GPU mode only when every process on this node has a GPU of its own: never some ranks on CUDA and
    # others on CPU in one group.
    mode = choose(max(job.local_world_size, job.local_rank + 1), job.local_rank, backend=backend)
    name, device = mode.name, str(mode.device)
    if not mode.gpu and not torch.cuda.is_initialized():  # CPU mode sees no GPU (read when CUDA starts)
        os.environ["CUDA_VISIBLE_DEVICES"] = NO_GPUS
    # parlab.rank()/device() read these; SLURM does not set the torchrun names.
    os.environ.update(RANK=str(job.rank), WORLD_SIZE=str(job.world_size), LOCAL_RANK=str(job.local_rank),
                      PARLAB_DEVICE=device)
    owned = not dist.is_initialized()
    if owned:
        if mode.gpu:
            torch.cuda.set_device(mode.device)
        dist.init_process_group(mode.backend, init_method="env://", rank=job.rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=timeout), device_id=mode.device if mode.gpu else None)
    if announce and job.rank == 0:
        print(f"parlab: {job.world_size} ranks · {name} · {'CPU' if name == 'gloo' else 'GPU'} · "
              f"started by {job.source} ({job.local_world_size} per node)" + (f" ({mode.note})" if mode.note else ""),
              flush=True)
    try:
        return fn(*args, **(kwargs or {}))
    finally:
        if owned:
            dist.destroy_process_group()


def exit_without_teardown(code: int = 0) -> None:
    """End a rank that torchrun or SLURM started, after ``destroy_process_group``, skipping the interpreter's
    teardown (what ``parlab.launch``'s own ranks always do).

    Why: every ``backward()`` stashes a Python object (its ``contextvars`` context) in the thread's state,
    and a collective issued during backward (DDP's bucket all-reduces, FSDP2's reduce-scatters) copies that
    state into its work item. gloo's worker thread frees the item a moment after the collective completes;
    freeing it takes the GIL. If the main thread has meanwhile begun to shut the interpreter down, the
    worker's wait for the GIL ends its thread (``take_gil`` calls ``pthread_exit`` on Python 3.11-3.13), the
    unwind meets a ``noexcept`` destructor, and the rank aborts with "terminate called without an active
    exception" (PyTorch issue 117762). ``destroy_process_group`` does not join those threads while a DDP or
    FSDP model still holds the group. ``os._exit`` skips the teardown; output is flushed first.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
