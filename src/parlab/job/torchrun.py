"""Run a script or module under ``torchrun --standalone`` from a notebook cell, and read what rank 0 wrote
(chapter 08). torchrun is ``python -m torch.distributed.run``: the same thing, from the same Python."""

from __future__ import annotations

import os
import subprocess
import sys

import parlab
import parlab.runtime
from parlab.launch import lease
from parlab.launch.plan import record_launch


def torchrun(target: str, nproc: int, *args: str, module: bool = False, timeout: float = 600,
             env: dict | None = None) -> str:
    """``torchrun --standalone --nproc-per-node nproc [-m] target args...``; returns what it printed.

    A failed run raises ``RuntimeError`` with the end of its output (torchrun names the failing rank)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *(["-m"] if module else []), target, *args]
    src = os.path.dirname(os.path.dirname(parlab.__file__))  # so `-m parlab.job.hf` imports this parlab
    path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **(env or {}))
    for name in ("PARLAB_IN_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(name, None)
    # The course's one decision (parlab.runtime.choose): GPU mode when every process gets a GPU of its own,
    # on GPUs leased from the workshop's pool (launch/lease.py); CPU mode sees none.
    gpus = lease.pool_size(full_env)
    mode = parlab.runtime.choose(nproc, 0, gpus)
    record_launch(nproc, "auto", mode.device.type, mode.note, gpus, "torchrun")  # for `parlab run --require-gpu`
    with lease.acquire(nproc, env=full_env, what=f"torchrun {target}") if mode.gpu else lease.Lease() as held:
        full_env.update(held.env if mode.gpu else {"CUDA_VISIBLE_DEVICES": parlab.runtime.NO_GPUS})
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed (exit {done.returncode}):\n{done.stdout[-2000:]}"
                           f"{done.stderr[-3000:]}")
    return done.stdout + done.stderr
