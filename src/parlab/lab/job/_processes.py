"""A torchrun job's processes, found and stopped as one (``torchrun.py``).

torchrun starts each worker in a session of its own (``start_new_session``), so killing the agent's process
group misses them, and killing the agent alone leaves them running under PID 1. Every process of a job
therefore carries a tag in its environment (``PARLAB_TORCHRUN_JOB``, inherited by workers and anything they
start); :func:`stop` signals the agent's group and every tagged process, SIGTERM first (the agent then stops
its workers itself), SIGKILL after a grace period, and returns only once none is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

TAG = "PARLAB_TORCHRUN_JOB"
GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def tagged(tag: str) -> set[int]:
    """Live processes (not zombies) whose environment carries ``TAG=tag``; those this user may read."""
    needle = f"{TAG}={tag}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            if not _zombie(int(name)):
                found.add(int(name))
        except OSError:  # gone, or another user's
            continue
    return found


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _signal(proc, pids: set[int], sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the agent's session: the agent and what it started in its group
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(proc, tag: str, grace: float = GRACE) -> int:
    """Stop the job: SIGTERM, then SIGKILL what is left after ``grace`` s; returns once every process of it
    has exited. Returns how many worker processes (tagged, not the agent) were still running."""
    workers = tagged(tag) - {proc.pid}
    _signal(proc, workers | {proc.pid}, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or tagged(tag)):
        time.sleep(0.05)
    for _ in range(100):  # SIGKILL cannot be refused: a few rounds catch anything started meanwhile
        left = tagged(tag)
        if proc.poll() is not None and not left:
            break
        _signal(proc, left, signal.SIGKILL)
        time.sleep(0.05)
    proc.wait()
    return len(workers)
