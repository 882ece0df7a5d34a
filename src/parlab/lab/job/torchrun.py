"""Run a script or module under ``torchrun --standalone`` from a notebook cell (chapters 00, 03 and 08).

torchrun is ``python -m torch.distributed.run``: the same thing, from the same Python. Each rank's output
goes to its own file (torchrun's ``--log-dir`` with ``--redirects 3``), so that a failure names its rank and
shows where that rank started and where it stopped, not only the end of a shared stream. A job that runs
longer than ``stream_after`` seconds shows what its ranks print as they print it.

A job that outlives its ``timeout``, or a cell that is interrupted, stops the whole job (``_processes.py``:
the agent and every worker, SIGTERM then SIGKILL), waits until none is left, and only then releases its
GPU lease, so that the next learner never gets GPUs that a stopped job's workers still use.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import parlab
import parlab.lab.runtime
from parlab.lab.job import _processes
from parlab.lab.launch import lease
from parlab.lab.launch.plan import record_launch

HEAD, TAIL = 15, 40  # lines of each rank's output kept in an error: where it started, where it stopped


class TorchrunTimeout(RuntimeError):
    """A torchrun job ran past its timeout; it was stopped, every process of it, before this was raised."""


def _decide(nproc: int, env: dict, device_count=None):
    """The course's one decision (parlab.lab.runtime.choose) for a job of ``nproc`` ranks: GPU mode when every
    process gets a GPU of its own, on GPUs leased from the workshop's pool (launch/lease.py); CPU mode sees none.
    ``(GPUs the job may use, the Mode)``."""
    gpus = lease.pool_size(env, device_count)
    return gpus, parlab.lab.runtime.choose(nproc, 0, gpus)


def tolerance(*nprocs: int, env: dict | None = None, device_count=None) -> dict:
    """``assert_close``'s keyword arguments for torchrun jobs of ``nprocs`` ranks each, against one CPU process
    or against each other (``runtime.tolerance``): the GPU's where any of them runs on GPUs, as
    :func:`torchrun` decides it (``device_count``: injectable, for tests)."""
    if not nprocs or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in nprocs):
        raise ValueError(f"nprocs must be one or more positive ints (each job's ranks), got {nprocs!r}")
    env = dict(os.environ if env is None else env)
    gpu = any(_decide(n, env, device_count)[1].gpu for n in nprocs)
    return parlab.lab.runtime.tolerance("cuda" if gpu else "cpu")


def torchrun(target: str, nproc: int, *args: str, module: bool = False, timeout: float = 600,
             env: dict | None = None, stream_after: float | None = 10.0) -> str:
    """``torchrun --standalone --nproc-per-node nproc [-m] target args...``; returns what the ranks printed.

    The ranks run on the CPU (gloo) unless this machine has a GPU for each of them. A failed run raises
    ``RuntimeError`` naming the failing rank (torchrun's summary), with the first and last lines of every
    rank's output; a run past ``timeout`` seconds raises :class:`TorchrunTimeout` with the same excerpts,
    once every process of the job has exited. After ``stream_after`` seconds (None: never) the ranks'
    lines are also printed as they come, prefixed ``[rank N]``."""
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
    full_env[_processes.TAG] = uuid.uuid4().hex  # every process of this job carries it: found, stopped
    gpus, mode = _decide(nproc, full_env)
    record_launch(nproc, "auto", mode.device.type, mode.note, gpus, "torchrun")  # for `parlab run --require-gpu`
    try:
        with lease.acquire(nproc, env=full_env, what=f"torchrun {target}") if mode.gpu else lease.Lease() as held:
            full_env.update(held.env if mode.gpu else {"CUDA_VISIBLE_DEVICES": parlab.lab.runtime.NO_GPUS})
            code, out, err = _run(cmd, full_env, timeout, logs, stream_after)  # returns once all have exited
        ranks = rank_outputs(logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    printed = "".join(text for _, text in sorted(ranks.items()))
    if code is None:
        raise TorchrunTimeout(f"{' '.join(cmd[2:])} did not finish in {timeout:g} s. parlab stopped torchrun and "
                              f"its workers (SIGTERM, then SIGKILL), waited until none was left, then released its "
                              f"GPUs. What each rank printed:\n{_excerpts(ranks)}")
    if code:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed (exit {code}):\n{_summary(err)}\n{_excerpts(ranks)}")
    return printed + out


def _run(cmd: list[str], env: dict, timeout: float, logs: str, stream_after: float | None):
    """Run torchrun in a session of its own; ``(exit code or None on timeout, its stdout, its stderr)``.
    Every process of the job has exited when this returns or raises (an interrupt too)."""
    paths = os.path.join(logs, "agent.out"), os.path.join(logs, "agent.err")
    with open(paths[0], "w") as out, open(paths[1], "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)  # its own group: a Ctrl-C to the kernel is ours to pass on
    tail, start, code = _Tail(logs), time.monotonic(), None
    try:
        while (code := proc.poll()) is None and time.monotonic() - start < timeout:
            if stream_after is not None and time.monotonic() - start >= stream_after:
                tail.show()
            time.sleep(0.1)
    finally:
        _processes.stop(proc, env[_processes.TAG])  # on success: stragglers; on timeout or interrupt: all
        if stream_after is not None and time.monotonic() - start >= stream_after:
            tail.show()
    texts = []
    for path in paths:
        with open(path, errors="replace") as f:
            texts.append(f.read())
    return code, texts[0], texts[1]


class _Tail:
    """The ranks' log files, read as they grow: each new whole line printed once, ``[rank N] line``."""

    def __init__(self, logs: str):
        self.logs, self.read, self.started = logs, {}, False

    def show(self) -> None:
        if not self.started:
            self.started = True
            print("parlab: torchrun is still running; what its ranks print follows as they print it", flush=True)
        for file in sorted(glob.glob(os.path.join(self.logs, "*", "attempt_*", "*", "std*.log"))):
            rank, stream = int(os.path.basename(os.path.dirname(file))), os.path.basename(file)[:-4]
            with open(file, "rb") as f:
                f.seek(self.read.get(file, 0))
                chunk = f.read()
            whole = chunk[:chunk.rfind(b"\n") + 1]
            self.read[file] = self.read.get(file, 0) + len(whole)
            for line in whole.decode(errors="replace").splitlines():
                print(f"[rank {rank}] {line}", file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)


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
