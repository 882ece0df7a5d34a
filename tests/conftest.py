"""Shared test fixtures: GPU detection, and a check that no rank outlives a test."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import sys
import time

import pytest
import torch


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``./lab test`` (pytest-xdist, ``--dist loadgroup``): the tests of one chapter, named
    ``tests/test_notebooks.py::…[NN_name]``, go to one worker, where they share its runs; the other tests
    go to one worker per file, where they share its module-scoped fixtures (split over two workers, the
    own-job test trained its three architectures twice); the rest of ``test_notebooks.py`` goes where a
    worker is free. (xdist's own ``xdist_group`` marks did not group with pytest 9 here.) The longest scopes
    are handed out first (:data:`LONG_SCOPES`), so that no long one is left for the end."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByChapter(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if file == "tests/test_edition_runs.py":  # each chapter of an edition on a worker of its own
                return nodeid
            if file != "tests/test_notebooks.py":
                return file
            return "chapter " + nodeid.rsplit("[", 1)[1][:-1] if nodeid.endswith("]") else nodeid

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # once, before the first unit is handed out: the longest first
                self.ordered = True
                for scope in sorted(self.workqueue, key=lambda s: _expected_seconds(s, len(self.workqueue[s])),
                                    reverse=True):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return ByChapter(config, log)


#: Seconds beside another worker (docs/ci.md) of the scopes that are few tests but long; any other file is
#: counted at 1.5 s a test and a chapter at its recorded run times. Only the order depends on these: xdist
#: hands out the scopes with the most tests first, which left the longest (chapters, the own job, eight
#: kernels at once) to the end, with one worker idle while the other finished them.
LONG_SCOPES = {"tests/test_own_job.py": 130, "tests/test_notebooks.py::test_eight_headless_chapters_at_once": 80,
               "tests/test_browser.py": 50, "tests/test_cluster.py": 70, "tests/test_trainer_and_debugging.py": 130,
               "tests/test_course.py": 60, "tests/test_torchrun.py": 35, "tests/test_job.py": 50,
               "tests/test_simgpu.py": 90, "tests/test_edition.py": 15,
               "tests/test_edition_runs.py::test_chapters_in_chinese_run_headless[00_welcome]": 60,
               "tests/test_gpu_smoke.py": 90, "tests/test_world_size_one.py": 25}


def _expected_seconds(scope: str, tests: int) -> float:
    recorded = _run_times().get(scope.split(" ", 1)[1]) if scope.startswith("chapter ") else None
    if recorded:
        runs = ("defaults", "ci") if os.environ.get("PARLAB_CI_RUNS") == "1" else ("defaults",)
        return 2 * sum(recorded.get(run, 60.0) for run in runs)  # beside another worker: about twice
    return LONG_SCOPES.get(scope, 1.5 * tests)


@functools.cache
def _run_times() -> dict:
    """docs/run_times.json's chapters: seconds per chapter, with its defaults and with its CI parameters."""
    return json.loads((pathlib.Path(__file__).parents[1] / "docs" / "run_times.json").read_text())["chapters"]


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


@pytest.fixture(autouse=True)
def figures_closed():
    """Every test closes the pyplot figures it opened: they are kept until closed, so a worker's later test
    warned that more than 20 were open (which one depended on the order the tests were handed out)."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


@pytest.fixture
def no_leftover_ranks():
    yield
    assert wait_gone(zygote_children()) == [], "rank processes outlived the launch"


def pytest_sessionfinish(session, exitstatus):
    from parlab.lab.launch import shutdown

    shutdown()
    os.environ.pop("PARLAB_TEST", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On simulated GPUs (PARLAB_SIMULATE_GPUS), a test that reached what only a real GPU answers (a memory
    figure, NCCL's log: ``simgpu.NeedsRealGPU``) is skipped with that reason: the gpu job decides it."""
    outcome = yield
    report = outcome.get_result()
    from parlab.lab.launch import simgpu

    if call.excinfo is not None and simgpu.active() and call.excinfo.errisinstance(simgpu.NeedsRealGPU):
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, str(call.excinfo.value))
