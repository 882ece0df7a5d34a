"""The chapters' torchrun jobs: the helper that runs them names a failing rank and shows where every rank started
and stopped, and every script torchrun starts leaves without the interpreter's teardown.

Why the last: on gloo, a collective issued during backward keeps backward's Python context in its work item,
and gloo's worker thread frees that item just after the collective completes. When the main thread has begun
shutting the interpreter down by then, the rank aborts ("terminate called without an active exception"; see
``parlab.lab.launch.cluster.exit_without_teardown``). It happened in 1 of 10 to 3 of 5 runs; it is a race, so no
fast test can show it: ``benchmarks/torchrun_aborts.py`` runs each job 100 times (``--unfixed`` without the fix).
"""

from __future__ import annotations

import _thread
import ast
import inspect
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import pytest

from parlab.lab import training
from parlab.lab.job import hf, train_fsdp
from parlab.lab.job.torchrun import TorchrunTimeout, torchrun
from parlab.lab.launch import lease

ROOT = Path(__file__).parents[1]

FAILING = textwrap.dedent("""
    import os, sys
    rank = int(os.environ["RANK"])
    print(f"rank {rank} starts: first line")
    for i in range(100):
        print(f"rank {rank} step {i}")
    if rank == 1:
        raise ValueError("rank 1 stops here on purpose")
    print(f"rank {rank} done")
""")


@pytest.mark.slow
def test_a_failure_names_the_rank_and_shows_each_ranks_first_and_last_lines(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    with pytest.raises(RuntimeError) as caught:
        torchrun(str(script), 2, timeout=120)
    text = str(caught.value)
    assert "rank      : 1" in text  # torchrun's own summary: the failing rank
    for rank in (0, 1):
        assert f"rank {rank} starts: first line" in text  # the head of each rank's output survives
        assert f"--- rank {rank} stdout" in text
    assert "rank 1 step 99" in text and "ValueError: rank 1 stops here on purpose" in text  # and its tail
    assert "rank 0 done" in text
    assert "[... " in text  # 101 lines: the middle is cut, not the start


@pytest.mark.slow
def test_a_run_returns_what_the_ranks_printed(tmp_path):
    script = tmp_path / "ok.py"
    # leaves as the course's scripts do, by os._exit, which skips the flush: the lines must still arrive
    script.write_text("import os\nprint('hello from', os.environ['RANK'])\nos._exit(0)\n")
    printed = torchrun(str(script), 2, timeout=120)
    assert "hello from 0" in printed and "hello from 1" in printed


def test_bad_rank_count_is_refused():
    with pytest.raises(ValueError, match="nproc must be a positive int"):
        torchrun("x.py", 0)


def _calls_os_exit_after_destroy(source: str) -> bool:
    """True when, in the code, ``destroy_process_group()`` is followed (later in the same body) by ``os._exit``."""
    names = [n.func.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute)]
    return "destroy_process_group" in names and "_exit" in names[names.index("destroy_process_group"):]


def test_every_script_torchrun_starts_leaves_without_the_teardown():
    nb = nbformat.read(ROOT / "notebooks" / "03_dp_vs_ddp.ipynb", as_version=4)
    ddp = next(c.source for c in nb.cells if c.source.startswith("%%writefile") and "ddp_train.py" in c.source)
    assert _calls_os_exit_after_destroy(ddp.split("\n", 1)[1]), "chapter 03's DDP script"
    assert _calls_os_exit_after_destroy(inspect.getsource(train_fsdp.main)), "chapter 08's train_fsdp.py"
    nb = nbformat.read(ROOT / "notebooks" / "08_your_own_job.ipynb", as_version=4)
    parts = [c.source.split("\n", 1)[1] for c in nb.cells if c.source.startswith("%%writefile") and "train.py" in c.source]
    assert len(parts) > 1 and _calls_os_exit_after_destroy("\n".join(parts)), "chapter 08's train.py, written in parts"
    for fn in (hf.main, training.script_main):  # the package's own entry points call the one helper
        assert "exit_without_teardown()" in inspect.getsource(fn), fn.__qualname__
    assert not _calls_os_exit_after_destroy("dist.destroy_process_group()\n")  # the check can fail


HANGS = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ["RANK"])
    open(os.path.join(sys.argv[1], f"pid.{rank}"), "w").write(str(os.getpid()))
    print(f"rank {rank} waits for a peer that never comes", flush=True)
    time.sleep(1000)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")  # a zombie has ended
    except OSError:
        return False


def _hanging_job(tmp_path, monkeypatch):
    """A 2-rank job that hangs, on 2 faked GPUs leased from a workshop pool; returns the script and a list
    that records, at the lease's release, which workers were still alive."""
    monkeypatch.setenv("PARLAB_GPUS", "auto")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("PARLAB_GPU_LOCKS", str(tmp_path / "locks"))
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    at_release = []
    release = lease.Lease.release

    def noted(self):
        if self.gpus:
            at_release.append([p for p in _worker_pids(tmp_path) if _alive(p)])
        release(self)

    monkeypatch.setattr(lease.Lease, "release", noted)
    return script, at_release


def _worker_pids(tmp_path):
    return [int((tmp_path / f"pid.{r}").read_text()) for r in range(2) if (tmp_path / f"pid.{r}").exists()]


def _gpus_free(tmp_path):
    return all(h is None for h in lease.holders_of(["0", "1"], str(tmp_path / "locks")).values())


@pytest.mark.slow
def test_a_timeout_stops_every_worker_before_the_gpus_are_released(tmp_path, monkeypatch, capsys):
    script, at_release = _hanging_job(tmp_path, monkeypatch)
    with pytest.raises(TorchrunTimeout) as caught:
        torchrun(str(script), 2, str(tmp_path), timeout=20, stream_after=0)
    pids = _worker_pids(tmp_path)
    assert len(pids) == 2 and not [p for p in pids if _alive(p)]  # no worker left under PID 1
    assert at_release == [[]] and _gpus_free(tmp_path)  # released once, after every worker had exited
    text = str(caught.value)
    assert "did not finish in 20 s" in text and "rank 1 waits for a peer that never comes" in text
    assert "[rank 0] rank 0 waits for a peer" in capsys.readouterr().out  # shown while it ran


@pytest.mark.slow
def test_an_interrupt_stops_every_worker_too(tmp_path, monkeypatch):
    script, at_release = _hanging_job(tmp_path, monkeypatch)

    def interrupt_once_both_run():
        for _ in range(600):
            if len(_worker_pids(tmp_path)) == 2:
                break
            time.sleep(0.1)
        _thread.interrupt_main()  # what the kernel's interrupt button does to a running cell

    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        torchrun(str(script), 2, str(tmp_path), timeout=120)
    pids = _worker_pids(tmp_path)
    assert len(pids) == 2 and not [p for p in pids if _alive(p)]
    assert at_release == [[]] and _gpus_free(tmp_path)
