"""Run a script or module under ``torchrun --standalone`` from a notebook cell (chapters 00, 03 and 08).

torchrun is ``python -m torch.distributed.run``: the same thing, from the same Python. Each rank's output
goes to its own file (torchrun's ``--log-dir`` with ``--redirects 3``), so that a failure names its rank and
shows where that rank started and where it stopped, not only the end of a shared stream.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

import parlab
import parlab.lab.runtime
from parlab.lab.launch import lease
from parlab.lab.launch.plan import record_launch

HEAD, TAIL = 15, 40  # lines of each rank's output kept in an error: where it started, where it stopped


def torchrun(target: str, nproc: int, *args: str, module: bool = False, timeout: float = 600,
             env: dict | None = None) -> str:
    """``torchrun --standalone --nproc-per-node nproc [-m] target args...``; returns what the ranks printed.

    The ranks run on the CPU (gloo) unless this machine has a GPU for each of them. A failed run raises
    ``RuntimeError`` naming the failing rank (torchrun's summary), with the first and last lines of every
    rank's output."""
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int (ranks to start), got {nproc!r}")
    logs = tempfile.mkdtemp(prefix="parlab-torchrun-")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--log-dir={logs}", "--redirects=3", *(["-m"] if module else []), target, *args]
    src = os.path.dirname(os.path.dirname(parlab.__file__))  # so `-m parlab.lab.job.hf` imports this parlab
    path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    for name in ("PARLAB_IN_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(name, None)
    full_env.update(env or {})
    # The course's one decision (parlab.lab.runtime.choose): GPU mode when every process gets a GPU of its own,
    # on GPUs leased from the workshop's pool (launch/lease.py); CPU mode sees none.
    gpus = lease.pool_size(full_env)
    mode = parlab.lab.runtime.choose(nproc, 0, gpus)
    record_launch(nproc, "auto", mode.device.type, mode.note, gpus, "torchrun")  # for `parlab run --require-gpu`
    with lease.acquire(nproc, env=full_env, what=f"torchrun {target}") if mode.gpu else lease.Lease() as held:
        full_env.update(held.env if mode.gpu else {"CUDA_VISIBLE_DEVICES": parlab.lab.runtime.NO_GPUS})
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              stdin=subprocess.DEVNULL)
    ranks = rank_outputs(logs)
    shutil.rmtree(logs, ignore_errors=True)
    printed = "".join(text for _, text in sorted(ranks.items()))
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed (exit {done.returncode}):\n"
                           f"{_summary(done.stderr)}\n{_excerpts(ranks)}")
    return printed + done.stdout


def rank_outputs(log_dir: str) -> dict[tuple[int, str], str]:
    """What each rank wrote, from torchrun's log folder: ``{(rank, "stdout" | "stderr"): text}``."""
    out = {}
    for file in glob.glob(os.path.join(log_dir, "*", "attempt_*", "*", "std*.log")):
        rank, stream = int(os.path.basename(os.path.dirname(file))), os.path.basename(file)[:-4]
        with open(file, errors="replace") as f:
            out[(rank, stream)] = f.read()
    return out


def _summary(agent_stderr: str) -> str:
    """torchrun's own report: from its "Failures:" table to the end (its earlier lines are warnings)."""
    lines = [line for line in agent_stderr.splitlines() if line.strip() and not line.startswith("*")]
    start = next((i for i, line in enumerate(lines) if "FAILED" in line or "Failures:" in line), max(0, len(lines) - 30))
    return "\n".join(lines[max(0, start - 1):])


def _excerpts(ranks: dict[tuple[int, str], str]) -> str:
    parts = []
    for (rank, stream), text in sorted(ranks.items()):
        lines = text.splitlines()
        if not lines:
            continue
        shown = lines if len(lines) <= HEAD + TAIL else [*lines[:HEAD], f"[... {len(lines) - HEAD - TAIL} lines ...]",
                                                         *lines[-TAIL:]]
        parts.append(f"--- rank {rank} {stream} ({len(lines)} lines)\n" + "\n".join(shown))
    return "\n".join(parts) or "(no rank wrote anything)"
