"""Shared test fixtures: GPU detection, and a check that no rank outlives a test."""

from __future__ import annotations

import os
import time

import pytest
import torch


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``./lab test`` (pytest-xdist, ``--dist loadgroup``): the tests of one chapter, named
    ``tests/test_notebooks.py::…[NN_name]``, go to one worker, where they share its runs; the other tests
    go to one worker per file, where they share its module-scoped fixtures (split over two workers, the
    own-job test trained its three architectures twice); the rest of ``test_notebooks.py`` goes where a
    worker is free. (xdist's own ``xdist_group`` marks did not group with pytest 9 here.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByChapter(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if file != "tests/test_notebooks.py":
                return file
            return "chapter " + nodeid.rsplit("[", 1)[1][:-1] if nodeid.endswith("]") else nodeid

    return ByChapter(config, log)


def pytest_collection_modifyitems(config, items):
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
