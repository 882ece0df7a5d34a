"""Shared test fixtures: GPU detection, and a check that no rank outlives a test."""

from __future__ import annotations

import os
import pathlib
import time

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    for item in items:  # under pytest-xdist (./lab test): a chapter's tests share its runs, so one worker has them all
        path = item.callspec.params.get("path") if hasattr(item, "callspec") else None
        if item.nodeid.startswith("tests/test_notebooks.py") and isinstance(path, pathlib.Path):
            item.add_marker(pytest.mark.xdist_group(path.stem))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA GPUs")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def zygote_children() -> list[int]:
    """PIDs of rank processes that the launcher's zygote still has."""
    from parlab.lab.launch import _zygote

    z = _zygote._the_zygote
    if z is None or not z.alive():
        return []
    try:
        with open(f"/proc/{z.proc.pid}/task/{z.proc.pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def wait_gone(pids, seconds: float = 5.0) -> list[int]:
    """Wait until the processes are gone (or zombies); return those still alive after ``seconds``."""
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


@pytest.fixture(autouse=True)
def environment_restored():
    """Every test leaves the process environment as it found it. Code that joins a job in-process
    (``parlab.launch`` under torchrun or SLURM) sets ``LOCAL_RANK``, ``PARLAB_DEVICE`` and
    ``CUDA_VISIBLE_DEVICES`` for the rest of its process; in a test process that leaked into every later
    test and into the kernels they start (accelerate then took a plain process for a distributed one)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def no_leftover_ranks():
    yield
    assert wait_gone(zygote_children()) == [], "rank processes outlived the launch"


def pytest_sessionfinish(session, exitstatus):
    from parlab.lab.launch import shutdown

    shutdown()
    os.environ.pop("PARLAB_TEST", None)
