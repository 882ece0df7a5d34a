"""The launcher and the %%ranks magic driven from a real Jupyter kernel, as a learner drives them."""

from __future__ import annotations

import os
import queue
import time

import pytest
from conftest import wait_gone
from jupyter_client.manager import start_new_kernel


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply, *_ = run(kc, "import parlab, torch, torch.distributed as dist\n%load_ext parlab")
        assert reply["status"] == "ok"
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run(kc, code: str, timeout: float = 60.0):
    """Execute ``code``; return (reply content, stdout text, stderr text, error traceback text, results)."""
    msg_id = kc.execute(code)
    out, err, tb, results = [], [], [], []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no idle status within {timeout} s for: {code[:80]}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            (out if content["name"] == "stdout" else err).append(content["text"])
        elif kind == "error":
            tb.append("\n".join(content["traceback"]))
        elif kind == "execute_result":
            results.append(content["data"].get("text/plain", ""))
        elif kind == "status" and content["execution_state"] == "idle":
            break
    return _reply(kc, msg_id), "".join(out), "".join(err), "\n".join(tb), results


def _reply(kc, msg_id: str) -> dict:
    """The shell reply to ``msg_id`` (skipping replies to earlier requests)."""
    while True:
        msg = kc.get_shell_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]


def test_magic_runs_the_cell_on_ranks(kernel):
    _, kc = kernel
    reply, out, _, tb, _ = run(kc, "scale = 3\ndef helper(x):\n    return x * scale\n")
    assert reply["status"] == "ok", tb
    reply, out, _, tb, results = run(kc, "%%ranks -n 4\nt = torch.ones(1) * parlab.rank()\n"
                                         "dist.all_reduce(t)\nprint('total', t.item())\nhelper(t.item())")
    assert reply["status"] == "ok", tb
    assert out.splitlines()[0].startswith("parlab: 4 ranks")
    for r in range(4):
        assert f"[rank {r}] total 6.0" in out.splitlines()
    assert results == ["[18.0, 18.0, 18.0, 18.0]"]


def test_magic_out_variable_and_rank0(kernel):
    _, kc = kernel
    reply, out, _, tb, results = run(kc, "%%ranks -n 2 --rank0 --out values\nprint('hi')\nparlab.rank() * 10")
    assert reply["status"] == "ok", tb
    assert "[rank 0] hi" in out and "[rank 1]" not in out
    reply, out, _, tb, _ = run(kc, "print(values)")
    assert out.strip() == "[0, 10]"


def test_error_in_cell_shows_rank_and_cell_line(kernel):
    _, kc = kernel
    code = "%%ranks -n 2\nx = 1\nif parlab.rank() == 1:\n    raise KeyError('missing-key')\ndist.barrier()"
    reply, _, _, tb, _ = run(kc, code)
    assert reply["status"] == "error" and reply["ename"] == "RankError"
    assert "rank 1 of 2 raised KeyError: 'missing-key'" in tb
    assert "raise KeyError('missing-key')" in tb  # the cell's own line, from the rank's traceback
    assert "Cell In[" in tb and "ipykernel_" not in tb  # cells named as IPython names them
    assert "magic.py" not in tb and "launcher.py" not in tb
    reply, *_ = run(kc, "1 + 1")
    assert reply["status"] == "ok"  # the kernel survived


def test_launch_of_function_defined_in_cell_shows_its_line(kernel):
    _, kc = kernel
    reply, _, _, tb, _ = run(kc, "def work():\n    return 1 / (parlab.rank() - 1)\nparlab.launch(work, 2)")
    assert reply["ename"] == "RankError"
    assert "ZeroDivisionError" in tb and "return 1 / (parlab.rank() - 1)" in tb


def test_hang_in_cell_times_out(kernel):
    _, kc = kernel
    # The barrier first: on a loaded machine a rank may take seconds to reach the line that hangs.
    code = "%%ranks -n 2 --timeout 2\ndist.barrier()\nif parlab.rank() == 0:\n    dist.all_reduce(torch.ones(1))"
    start = time.monotonic()
    reply, _, _, tb, _ = run(kc, code, timeout=30)
    assert reply["ename"] == "RankTimeoutError"
    assert "dist.all_reduce(torch.ones(1))" in tb
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("start_method", ["zygote", "spawn"])
def test_interrupt_stops_every_rank(kernel, tmp_path, start_method):
    km, kc = kernel
    code = (f"import os, time\ndef sleeper():\n    open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w')"
            f".close()\n    time.sleep(600)\nparlab.launch(sleeper, 3, start_method={start_method!r})")
    msg_id = kc.execute(code)
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p) for p in os.listdir(tmp_path)]
    assert len(pids) == 3
    start = time.monotonic()
    km.interrupt_kernel()
    reply = _reply(kc, msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert wait_gone(pids, 5.0) == []
    assert time.monotonic() - start < 5
    while True:  # drain this cell's messages
        msg = kc.get_iopub_msg(timeout=10)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                and msg["content"]["execution_state"] == "idle":
            break
    reply, out, _, tb, results = run(kc, "parlab.launch(lambda: parlab.rank(), 2)")
    assert reply["status"] == "ok", tb
    assert results == ["[0, 1]"]


def test_ranks_import_nothing_from_ipython(kernel):
    # The kernel's warning filters name a class from IPython; %%ranks cells were pickled with a class from
    # the magic's module. Either made every rank import IPython (94 modules) on every launch.
    _, kc = kernel
    check = "__import__('sys').modules.keys() & {'IPython', 'ipykernel', 'parlab.course.magic'}"
    reply, _, _, tb, results = run(kc, f"parlab.launch(lambda: {check}, 2, announce=False)")
    assert reply["status"] == "ok", tb
    assert results == ["[set(), set()]"]
    reply, _, _, tb, results = run(kc, f"%%ranks -n 2 --quiet\n{check}")
    assert reply["status"] == "ok", tb
    assert results == ["[set(), set()]"]


def test_warning_class_defined_in_a_cell_filters_on_the_ranks(kernel):
    _, kc = kernel
    reply, *_ = run(kc, "import warnings\nclass CellWarning(UserWarning):\n    pass\n"
                        "warnings.filterwarnings('error', category=CellWarning)")
    assert reply["status"] == "ok"
    reply, _, _, tb, _ = run(kc, "%%ranks -n 2\nwarnings.warn('made an error by the notebook', CellWarning)")
    assert reply["ename"] == "RankError" and "CellWarning: made an error by the notebook" in tb
    reply, *_ = run(kc, "warnings.resetwarnings()")
    assert reply["status"] == "ok"


SPAWN_CELL = """
class Accumulator:
    def __init__(self, start):
        self.total = start
def make_work(scale):
    def work():
        t = torch.ones(1) * (parlab.rank() + 1)
        dist.all_reduce(t)
        return Accumulator(t.item() * scale)
    return work
results = parlab.launch(make_work(10), 2, start_method="spawn")
print([a.total for a in results], type(results[0]).__name__)
"""


def test_spawn_runs_cell_functions_closures_and_classes(kernel):
    _, kc = kernel
    reply, out, _, tb, _ = run(kc, SPAWN_CELL, timeout=120)
    assert reply["status"] == "ok", tb
    first, *rest = out.splitlines()
    assert first.startswith("parlab: 2 ranks") and "spawn: the ranks took" in first
    assert rest == ["[30.0, 30.0] Accumulator"]
    code = "%%ranks -n 2 --start-method spawn\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(Accumulator(t.item()).total)"
    reply, out, _, tb, _ = run(kc, code, timeout=120)
    assert reply["status"] == "ok", tb
    assert sorted(out.splitlines()[1:]) == ["[rank 0] 2.0", "[rank 1] 2.0"]


def test_spawn_error_in_cell_shows_rank_and_cell_line(kernel):
    _, kc = kernel
    code = ("%%ranks -n 2 --start-method spawn\nif parlab.rank() == 1:\n    raise KeyError('spawned-missing')\n"
            "dist.barrier()")
    reply, _, _, tb, _ = run(kc, code, timeout=120)
    assert reply["status"] == "error" and reply["ename"] == "RankError"
    assert "rank 1 of 2 raised KeyError: 'spawned-missing'" in tb
    assert "raise KeyError('spawned-missing')" in tb and "Cell In[" in tb
