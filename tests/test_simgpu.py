"""GPUs simulated on the CPU (``PARLAB_SIMULATE_GPUS``): what they present, NCCL's ways where NCCL differs
from gloo, and the GPU workflow's own tests run under them at 2 and 4 GPUs.

The simulation changes torch for the whole process, so each check that needs it runs in a subprocess; this
process stays a plain CPU machine for the rest of the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parlab.lab.launch import simgpu

ROOT = Path(__file__).resolve().parent.parent


def _env(gpus: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", simgpu.ENV)}
    env.update({simgpu.ENV: str(gpus), "PYTHONPATH": str(ROOT / "src"), **extra})
    return env


def _run(script: str, gpus: int, timeout: float = 240, **extra) -> dict:
    """Run ``script`` under ``gpus`` simulated GPUs; it prints one JSON object last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=_env(gpus, **extra), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_simulated_gpus_a_process_sees():
    assert simgpu.visible({}) == [] and simgpu.visible({simgpu.ENV: "4"}) == [0, 1, 2, 3]
    assert simgpu.visible({simgpu.ENV: "4", "CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert simgpu.visible({simgpu.ENV: "4", "CUDA_VISIBLE_DEVICES": ""}) == []
    assert simgpu.visible({simgpu.ENV: "4", "CUDA_VISIBLE_DEVICES": "GPU-sim-3,GPU-sim-1"}) == [3, 1]
    assert simgpu.visible({simgpu.ENV: "4", "CUDA_VISIBLE_DEVICES": "1,7,2"}) == [1]  # CUDA stops at a bad entry
    with pytest.raises(ValueError, match="PARLAB_SIMULATE_GPUS must be a number of GPUs from 1 to 64 .*got 'two'"):
        simgpu.requested({simgpu.ENV: "two"})
    assert not simgpu.active()  # this process is a plain CPU machine


# One launch on 2 simulated GPUs checks each way NCCL differs from gloo, timed on the ranks.
NCCL_WAYS = """
    import datetime, json, os, time
    import torch, torch.distributed as dist
    import parlab
    from parlab.lab.launch import make_plan

    def ranks():
        out = {"backend": dist.get_backend(), "device": str(parlab.device()), "cuda": torch.cuda.is_initialized()}
        t = torch.full((4,), parlab.rank() + 1.0, device=parlab.device())
        if parlab.rank() == 1:
            time.sleep(1.0)  # rank 0 reaches the collective a second before its peer
        start = time.monotonic()
        dist.all_reduce(t)
        out["returned_after"] = time.monotonic() - start  # NCCL: at once, the peer not there yet
        out["sum"] = (t * 1).tolist()  # reads t: waits for the collective, as the GPU's stream does
        out["read_after"] = time.monotonic() - start
        host = torch.ones(1)  # made on the CPU: GPU mode's gloo half carries it, and gloo blocks
        if parlab.rank() == 1:
            time.sleep(1.0)
        start = time.monotonic()
        dist.all_reduce(host)
        out["host_returned_after"] = time.monotonic() - start
        group = dist.new_group(timeout=datetime.timedelta(seconds=2))
        start = time.monotonic()
        wrong = torch.ones(2, device=parlab.device())
        if parlab.rank() == 0:  # peers that call different collectives
            dist.all_reduce(wrong, group=group)
        else:
            dist.broadcast(wrong, 0, group=group)
        out["mismatch_returned_after"] = time.monotonic() - start
        try:
            wrong.sum().item()
            out["mismatch"] = "no error"
        except RuntimeError as exc:
            out["mismatch"] = str(exc)
        out["mismatch_after"] = time.monotonic() - start
        return out

    fresh = torch.cuda.is_initialized()
    torch.cuda.set_device(0)
    print(json.dumps({"plan": make_plan(2).describe(), "before": fresh, "after": torch.cuda.is_initialized(),
                      "ranks": parlab.launch(ranks, 2, timeout=60, announce=False),
                      "props": torch.cuda.get_device_properties(1).uuid,
                      "swapped": str(torch.ones(2, device="cuda:1").device)}))
"""


def test_the_simulation_behaves_as_nccl_where_nccl_differs_from_gloo():
    got = _run(NCCL_WAYS, 2)
    assert "2 ranks · nccl · 2 GPUs" in got["plan"]
    assert (got["before"], got["after"]) == (False, True)  # set_device starts CUDA in the process
    assert got["props"] == "GPU-sim-1" and got["swapped"] == "cpu"
    for rank, r in enumerate(got["ranks"]):
        assert r["backend"] == "cpu:gloo,cuda:nccl" and r["device"] == f"cuda:{rank}" and r["cuda"]
        assert r["sum"] == [3.0] * 4  # the data is right where it is read
    early = got["ranks"][0]
    assert early["returned_after"] < 0.3 < 0.7 < early["read_after"]  # queued, then waited where it was read
    assert early["host_returned_after"] > 0.7  # a CPU tensor's collective blocks, as gloo's does
    for r in got["ranks"]:  # a mismatch waits for the group's watchdog (2 s), then fails as NCCL's does
        assert "[simulated NCCL] Watchdog caught collective operation timeout" in r["mismatch"]
        assert r["mismatch_returned_after"] < 0.5 and r["mismatch_after"] >= 1.9


def test_the_zygote_refuses_a_preload_that_starts_cuda_on_a_simulated_gpu(tmp_path):
    (tmp_path / "parlab_set_device.py").write_text("import torch\ntorch.cuda.set_device(0)\n")
    got = _run("""
        import json, parlab
        from parlab.lab.launch import LaunchError, _zygote
        try:
            _zygote.preload("parlab_set_device")
            print(json.dumps({"refused": ""}))
        except LaunchError as exc:
            print(json.dumps({"refused": str(exc)}))
    """, 2, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{tmp_path}")
    assert "importing parlab_set_device initialised CUDA in the rank server" in got["refused"]


def test_the_gpu_workflows_gpu_tests_pass_on_simulated_gpus(gpus=2):
    """The GPU tests of tests/test_gpu.py (NCCL hang, leases, GPU mode), under the simulation at 2 GPUs. The
    `gpu-simulated` CI job runs the gpu job's whole test commands (`pytest -m gpu tests`, and test_gpu_mode,
    test_lease, test_launcher: minutes each) at 2 and at 4."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "-n", "0", "-q", "tests/test_gpu.py"], env=_env(gpus), cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_a_figure_only_a_real_gpu_has_can_be_carried_and_computed_with_but_not_read():
    import pickle

    peak = pickle.loads(pickle.dumps(simgpu.Unmeasured("a GPU memory figure")))  # from a rank, as a result
    held = {"peak": peak, "step_s": 0.1}  # carried: fine
    grown = (peak - 1024) / 2**20 * 2  # computed with: unmeasured too, as a NaN would be
    assert isinstance(grown, simgpu.Unmeasured)
    for use in (lambda: f"{held['peak'] / 2**20:.1f} MiB", lambda: held["peak"] > 0, lambda: f"{peak:,}",
                lambda: max(1.0, grown), lambda: bool(peak), lambda: float(peak), lambda: print(grown)):
        with pytest.raises(simgpu.NeedsRealGPU, match=r"\[simulated GPU\] needs a real GPU: a GPU memory figure"):
            use()
    err = pickle.loads(pickle.dumps(simgpu.NeedsRealGPU("NCCL's own log")))
    assert str(err).count("needs a real GPU") == 1 and err.what == "NCCL's own log"


def test_parlab_run_goes_on_past_a_cell_that_needs_a_real_gpu(tmp_path):
    import nbformat

    from parlab.course import chapters

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("peak"), nbformat.v4.new_code_cell("x"), nbformat.v4.new_code_cell("y")]
    nb.cells[0].execution_count, nb.cells[1].execution_count = 3, 4
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="NeedsRealGPU", evalue="…", traceback=[])]
    nbformat.write(nb, tmp_path / "run.ipynb")
    assert chapters.needs_real_gpu(tmp_path / "run.ipynb") == "needs a real GPU: In [3]"
    assert chapters._errors_other_than(tmp_path / "run.ipynb", "NeedsRealGPU") == []
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="x", traceback=[])]
    nbformat.write(nb, tmp_path / "run.ipynb")
    assert chapters._errors_other_than(tmp_path / "run.ipynb", "NeedsRealGPU") == ["NameError"]  # a real failure
