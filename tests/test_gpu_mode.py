"""GPU mode simulated on CPU: every decision point of the package, as a GPU machine presents it.

No test here needs a GPU. A GPU machine differs from this one in what it reports: the backend string of a
GPU-mode group (``"cpu:gloo,cuda:nccl"``; a ``"cpu:gloo,cuda:gloo"`` group stands in, and a patched
``get_backend`` presents NCCL's), how many GPUs torch counts (0, 1, 2, 4, 8, against world sizes 1-8),
and a spawner's ``CUDA_VISIBLE_DEVICES``. Each is presented here, and each device, mesh, lease and
fallback message the package derives from it is asserted. What only a GPU can settle is listed in
docs/ci.md (the first GPU run).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.lab import runtime
from parlab.lab.job import hf, train_fsdp
from parlab.lab.job import torchrun as torchrun_module
from parlab.lab.launch import LaunchError, _worker, _zygote, lease, make_plan
from parlab.lab.launch import plan as plan_module
from parlab.lab.measure import Timeline
from parlab.lab.measure import bandwidth, gpu_clock

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
GPU_COUNTS = (0, 1, 2, 4, 8)
WORLD_SIZES = range(1, 9)


# -- the one decision, for every machine and world size -----------------------------------------------

@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_the_decision_for_every_machine_and_world_size(gpus):
    for world in WORLD_SIZES:
        for local_rank in range(world):
            mode = runtime.choose(world, local_rank, gpus)
            if gpus >= world:  # one GPU per rank: GPU mode, rank r on the r-th visible GPU
                assert (mode.backend, mode.device, mode.note) == ("cpu:gloo,cuda:nccl", torch.device("cuda", local_rank), "")
            else:  # never some ranks on a GPU and the others on the CPU
                assert (mode.backend, mode.device) == ("gloo", torch.device("cpu"))
                assert mode.note == (f"{gpus} GPU(s) visible, NCCL needs one per rank: running on CPU instead"
                                     if gpus else "")
        assert runtime.choose(world, 0, gpus, "gloo").device == torch.device("cpu")
        if gpus >= world:
            assert runtime.choose(world, world - 1, gpus, "nccl").device == torch.device("cuda", world - 1)
        else:
            with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU" if gpus else "none is visible"):
                runtime.choose(world, 0, gpus, "nccl")


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_the_launch_plan_is_the_decision(gpus, monkeypatch):
    monkeypatch.setattr(plan_module, "visible_gpus", lambda: gpus)
    for world in WORLD_SIZES:
        plan, mode = make_plan(world), runtime.choose(world, 0, gpus)
        assert (plan.backend, plan.device_type, plan.note) == (mode.name, mode.device.type, mode.note)
        if mode.note:
            assert f"({mode.note})" in plan.describe()


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_the_copyable_script_writes_the_same_rule_out(gpus, monkeypatch):
    """train_fsdp.py may not import parlab: its rule must still be runtime.choose's, and in CPU mode the
    process must see no GPU afterwards."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    for world in (1, 2, 3, 4, 8):
        for local_rank in (0, world - 1):
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"[:2 * gpus - 1])
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
            mode = runtime.choose(world, local_rank, gpus)
            assert train_fsdp.choose_device() == (mode.device, mode.backend if mode.gpu else "gloo")
            if not mode.gpu:
                assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'gloo', 'nccl'; got 'mpi'"):
        runtime.choose(2, 0, 2, "mpi")
    with pytest.raises(ValueError, match="local_rank must be below local_world_size=2; got 2"):
        runtime.choose(2, 2, 2)
    with pytest.raises(ValueError, match="local_world_size must be an int of at least 1; got 0"):
        runtime.choose(0, 0, 2)


# -- a group as GPU mode presents it -------------------------------------------------------------------

@pytest.fixture
def group_of(tmp_path, monkeypatch):
    """Start a one-rank process group in this process with the given backend string; destroyed after."""
    monkeypatch.delenv("PARLAB_DEVICE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    started = []

    def start(backend):
        if started:
            dist.destroy_process_group()
        dist.init_process_group(backend, store=dist.FileStore(str(tmp_path / f"store{len(started)}"), 1),
                                rank=0, world_size=1)
        started.append(backend)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


class _CudaCalls:
    """Stands in for torch.cuda where a GPU-mode Timeline keeps the GPU's clock (a reference event): counts calls."""

    def __init__(self):
        self.calls = 0

    def synchronize(self, device=None):
        self.calls += 1

    def current_stream(self, device=None):
        self.calls += 1

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda's name
        self.calls += 1
        return type("Event", (), {"record": lambda self, stream=None: None})()


def test_a_combined_backend_is_gpu_mode_everywhere(group_of, monkeypatch):
    group_of("cpu:gloo,cuda:gloo")  # what get_backend() says in GPU mode, but runnable without NCCL
    # so `== "nccl"` (or `== "gloo"`) is always False; simulated GPUs present NCCL's half by name
    assert dist.get_backend() in ("cpu:gloo,cuda:gloo", "cpu:gloo,cuda:nccl")
    cuda0 = torch.device("cuda", 0)
    assert runtime.gpu_mode() and runtime.device() == cuda0 and runtime.device(dist.group.WORLD) == cuda0
    assert train_fsdp.rank_device() == cuda0  # the copyable script's rule agrees
    assert hf._on_gpu()  # the Trainer and accelerate are told GPU, not use_cpu
    monkeypatch.setattr(gpu_clock, "cuda", _CudaCalls())
    timeline = Timeline()
    assert timeline.clock is not None and timeline.device == cuda0  # spans are placed on the GPU's clock


@pytest.mark.parametrize("backend, gpu", [("cpu:gloo,cuda:nccl", True), ("nccl", True), ("gloo", False),
                                          ("cpu:gloo", False), ("NCCL", True)])
def test_every_backend_string(group_of, monkeypatch, backend, gpu):
    group_of("gloo")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    want = torch.device("cuda", 0) if gpu else torch.device("cpu")
    assert runtime.gpu_mode() is gpu and runtime.device() == want and train_fsdp.rank_device() == want
    monkeypatch.setattr(gpu_clock, "cuda", cuda := _CudaCalls())
    timeline = Timeline(sync=True)
    assert timeline.sync is gpu and (timeline.clock is not None) is gpu
    assert (cuda.calls > 0) is gpu  # never a CUDA call on a CPU rank, even when asked for sync


def test_bandwidth_sweeps_the_groups_device(group_of, monkeypatch):
    """Chapters 02 and 06 time the collectives on the device the group moves: with the old
    `get_backend(group) == "nccl"` they timed gloo over loopback on a GPU machine."""
    group_of("cpu:gloo,cuda:gloo")
    seen = []

    def runner(op, size, n, device, group):
        seen.append(device)
        raise StopIteration  # the device is what this test needs; no CUDA tensor can be made here

    monkeypatch.setattr(bandwidth, "_runner", runner)
    with pytest.raises(StopIteration):
        bandwidth.sweep("all_reduce", sizes=(1024,))
    assert seen == [torch.device("cuda", 0)]
    group_of("gloo")
    with pytest.raises(StopIteration):
        bandwidth.sweep("all_reduce", sizes=(1024,))
    assert seen[-1] == torch.device("cpu")


def test_a_cpu_rank_says_use_cpu_even_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("PARLAB_DEVICE", "cpu")  # a CPU-mode rank of a 4-rank launch on a 2-GPU machine
    assert not hf._on_gpu()
    monkeypatch.delenv("PARLAB_DEVICE")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun, 4 processes, 2 GPUs: CPU mode
    assert not hf._on_gpu()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert hf._on_gpu()


def test_the_mesh_is_on_the_ranks_device(group_of):
    group_of("gloo")
    mesh = runtime.mesh()
    assert mesh.device_type == "cpu" and mesh.shape == (1,)
    assert runtime.mesh(group=dist.new_group([0])).device_type == "cpu"
    assert train_fsdp.mesh().device_type == "cpu"
    with pytest.raises(ValueError, match="give shape or group, not both"):
        runtime.mesh((1,), group=dist.new_group([0]))


# -- what a CPU-mode rank sees on a GPU machine --------------------------------------------------------

def _what_a_rank_sees():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), str(parlab.device())


@pytest.mark.usefixtures("no_leftover_ranks")
def test_cpu_mode_ranks_see_no_gpu(monkeypatch, capsys):
    monkeypatch.setattr(plan_module, "visible_gpus", lambda: 1)  # a 1-GPU machine, 2 ranks: CPU mode
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert parlab.launch(_what_a_rank_sees, 2) == [("", 0, "cpu")] * 2
    assert "1 GPU(s) visible, NCCL needs one per rank: running on CPU instead" in capsys.readouterr().out


def test_the_torchrun_helper_leases_or_hides_the_gpus(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(torchrun_module, "_run", lambda cmd, env, *rest: ran.append(dict(env)) or (0, "", ""))
    monkeypatch.setattr(lease, "_torch_device_count", lambda: 2)
    monkeypatch.setenv("PARLAB_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("PARLAB_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    torchrun_module.torchrun("job.py", 4)  # 4 processes, 2 GPUs: CPU mode, and no GPU visible to them
    assert ran[-1]["CUDA_VISIBLE_DEVICES"] == ""
    torchrun_module.torchrun("job.py", 2)  # GPU mode, no workshop pool: every visible GPU, as before
    assert "CUDA_VISIBLE_DEVICES" not in ran[-1]
    monkeypatch.setenv("PARLAB_GPUS", "auto")  # a workshop: the job holds a lease while it runs
    torchrun_module.torchrun("job.py", 2)
    assert ran[-1]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert all(h is None for h in lease.holders_of(["0", "1"], str(tmp_path / "locks")).values())  # released


# -- a spawner's CUDA_VISIBLE_DEVICES ----------------------------------------------------------------------

def test_parlab_gpus_count_within_a_spawners_list(tmp_path):
    spawner = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "PARLAB_GPU_LOCKS": str(tmp_path)}
    assert lease.pool(dict(spawner, PARLAB_GPUS="2,3"), lambda: 4) == ["6", "7"]  # the machine's 6 and 7
    assert lease.pool(dict(spawner, PARLAB_GPUS="auto"), lambda: 4) == ["4", "5", "6", "7"]
    with lease.acquire(2, env=dict(spawner, PARLAB_GPUS="2,3"), wait=0) as held:
        assert held.env["CUDA_VISIBLE_DEVICES"] == "6,7" and held.gpus == ["6", "7"]
    with pytest.raises(ValueError, match=r"names GPU 4, but CUDA_VISIBLE_DEVICES='4,5,6,7' lets this process "
                                         r"see 4 GPU\(s\), numbered 0..3"):
        lease.pool(dict(spawner, PARLAB_GPUS="3,4"), lambda: 4)
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb", "PARLAB_GPUS": "1"}
    assert lease.pool(uuids, lambda: 2) == ["GPU-bb"]
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES is empty: this process may see no GPU"):
        lease.pool({"CUDA_VISIBLE_DEVICES": "", "PARLAB_GPUS": "0"}, lambda: 8)
    assert lease.pool({"CUDA_VISIBLE_DEVICES": "", "PARLAB_GPUS": "auto"}, lambda: 8) == []


# -- NCCL semantics the CPU hides ------------------------------------------------------------------------

def _frames(*lines):
    torch_file = os.path.join(os.path.dirname(torch.__file__), "cuda", "__init__.py")
    user = [traceback.FrameSummary("/work/cell.py", 3 + i, "step", line=line) for i, line in enumerate(lines)]
    return user, torch_file


def test_a_rank_blocked_on_the_gpu_is_waiting_on_a_collective_under_nccl():
    """NCCL queues a collective and returns; a rank whose peer never came blocks later, in .item() or in a
    synchronize. Under gloo those frames are ordinary work."""
    user, torch_file = _frames("loss = model(x)", "print(loss.item())")
    assert _worker._describe_stack(user, nccl=True)[1] and not _worker._describe_stack(user, nccl=False)[1]
    sync = [*user[:1], traceback.FrameSummary(torch_file, 1, "synchronize", line="torch._C._cuda_synchronize()")]
    assert _worker._describe_stack(sync, nccl=True)[1] and not _worker._describe_stack(sync, nccl=False)[1]
    assert not _worker._describe_stack(user[:1], nccl=True)[1]  # computing: busy, not waiting


@pytest.mark.usefixtures("no_leftover_ranks")
def test_the_zygote_refuses_a_preload_that_initialised_cuda(tmp_path, monkeypatch):
    # CPU torch cannot start CUDA; a module that marks it started presents what a GPU machine would see.
    (tmp_path / "parlab_cuda_mod.py").write_text("import torch.cuda\ntorch.cuda._initialized = True\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    _zygote.shutdown()  # the next zygote starts with tmp_path on its path
    try:
        with pytest.raises(LaunchError, match="importing parlab_cuda_mod initialised CUDA in the rank server"):
            _zygote.preload("parlab_cuda_mod")
        # CPU-mode ranks: a GPU-mode rank calls set_device, which starts CUDA in it (on 2+ GPUs, or simulated)
        out = parlab.launch(lambda: ("parlab_cuda_mod" in sys.modules, torch.cuda.is_initialized()), 2,
                            backend="gloo", announce=False)
        assert out == [(False, False)] * 2  # a fresh zygote, without it
        monkeypatch.setenv("PARLAB_PRELOAD", "parlab_cuda_mod")  # named at start: it serves nobody
        _zygote.shutdown()
        with pytest.raises(LaunchError, match="initialised CUDA"):
            parlab.launch(lambda: None, 1, announce=False)
    finally:
        monkeypatch.delenv("PARLAB_PRELOAD", raising=False)
        _zygote.shutdown()


# -- no other code tests the backend string; every mesh is built from the decision -------------------------

def _sources():
    files = [p for p in (ROOT / "src" / "parlab").rglob("*.py")]
    texts = {p: p.read_text() for p in files}
    import nbformat

    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = nbformat.read(nb, as_version=4).cells
        texts[nb] = "\n".join(c.source for c in cells if c.cell_type == "code")
    return texts


# The decision (runtime.py) and the copyable script's written-out copy of it (held to it above).
# The simulated GPUs present the string NCCL's group has (simgpu/distributed.py).
ALLOWED = {ROOT / "src/parlab/lab/runtime.py", ROOT / "src/parlab/lab/job/train_fsdp.py",
           ROOT / "src/parlab/lab/launch/simgpu/distributed.py", ROOT / "src/parlab/lab/launch/simgpu/__init__.py"}


def test_nothing_else_tests_the_backend_string():
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p, text in _sources().items() if p not in ALLOWED
             for m in re.finditer(r".*get_backend\(.*", text)]
    assert found == [], "ask parlab.lab.runtime (gpu_mode, device, choose) instead of the backend string:\n" + "\n".join(found)
    compared = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p, text in _sources().items()
                for m in re.finditer(r".*get_backend\([^)]*\)\s*[!=]=.*", text)]
    assert compared == []  # in GPU mode it is "cpu:gloo,cuda:nccl": `== "nccl"` is False


def _code_before(text: str, at: int) -> bool:
    """Is position ``at`` in code (not in a comment or a ``quoted`` name on its line)?"""
    line = text[text.rfind("\n", 0, at) + 1:at]
    return "#" not in line and not line.endswith("`")


def test_every_fully_shard_gets_a_mesh():
    calls = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}" for p, text in _sources().items()
             for m in re.finditer(r"(?<!def )\bfully_shard\((?![^)]*mesh=)[^)]*\)", text) if _code_before(text, m.start())]
    assert calls == [], "pass mesh= (parlab.lab.runtime.mesh()): without it FSDP2 builds a CUDA mesh on a GPU machine " \
                        "even in CPU mode:\n" + "\n".join(calls)


# -- one statement of the GPU runner's size; the workshop guide's sizes are the notebooks' ---------------------

RUNNER = "a GPU runner: 1, 2, 4 or 8 NVIDIA GPUs"


def test_one_statement_of_the_runner_size():
    workflow = (ROOT / ".github/workflows/ci.yml").read_text()
    ci = (ROOT / "docs/ci.md").read_text()
    assert RUNNER in " ".join(line.lstrip("# ") for line in workflow.splitlines()) and RUNNER in ci
    assert f"assert n >= 1, '{RUNNER}'" in workflow  # the install step fails only without any GPU
    for text in (workflow, ci, (ROOT / "docs/workshop.md").read_text()):
        assert not re.search(r"\b[48] or more (NVIDIA )?GPUs|\bn >= [2-8]\b", text), "an older statement of the size"


def test_the_workshop_guide_states_each_chapters_world_size():
    import nbformat

    from parlab.course import chapters as course
    table = {}
    for row in re.findall(r"^\| ([0-9][0-9][–0-9, ]*) \| (\d+)[^|]*\| (\d+)[^|]*\|$",
                          (ROOT / "docs/workshop.md").read_text(), re.M):
        for part in row[0].split(", "):
            first, _, last = part.partition("–")
            for n in range(int(first), int(last or first) + 1):
                table[f"{n:02d}"] = (int(row[1]), int(row[2]))
    chapters = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        chapters[path.name[:2]] = (course.world_size(nb, {}), course.world_size(nb, course.ci_parameters(nb)))
    assert table == chapters


# -- launch inside a torchrun/SLURM job: one mode for every local rank -------------------------------------

@pytest.mark.parametrize("local_world, gpu", [(2, True), (4, False)])
def test_a_job_with_fewer_gpus_than_local_ranks_runs_every_rank_on_cpu(monkeypatch, local_world, gpu):
    """2 GPUs: with 4 processes on the node, local ranks 0 and 1 used to take a GPU and 2 and 3 the CPU."""
    from parlab.lab.launch import cluster

    calls = {}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: None)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PARLAB_DEVICE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, "unset")  # restored after the test; run_in_job sets what it needs
    for local_rank in range(local_world):
        calls.clear()
        job = cluster.Job(local_rank, local_world, local_rank, local_world, "torchrun")
        got = cluster.run_in_job(job, lambda: os.environ["PARLAB_DEVICE"], (), None, local_world, "auto", 30, False)
        if gpu:
            assert got == f"cuda:{local_rank}" and calls["backend"] == "cpu:gloo,cuda:nccl"
            assert calls["device_id"] == calls["set_device"] == torch.device("cuda", local_rank)
        else:
            assert got == "cpu" and calls["backend"] == "gloo" and calls["device_id"] is None
            assert "set_device" not in calls and os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_gpu_modes_gloo_half_stays_on_loopback_too():
    """GPU mode's group is ``cpu:gloo,cuda:nccl``: its gloo half (CPU tensors, object collectives) must be
    kept on loopback as plain gloo's is, or it picks whatever interface the host name resolves to."""
    from parlab.lab.launch._loop import gloo_interface

    for backend in ("gloo", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:gloo"):
        assert gloo_interface(backend, {}) == {"GLOO_SOCKET_IFNAME": "lo"}, backend
    for gpus in (0, 2):  # what the launcher passes it: the ranks' group backend, not the printed name "nccl"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plan_module, "visible_gpus", lambda: gpus)
            plan = make_plan(2)
        assert plan.group_backend == ("cpu:gloo,cuda:nccl" if gpus else "gloo")
        assert gloo_interface(plan.group_backend, {}) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert gloo_interface("nccl", {}) == {}
    assert gloo_interface("cpu:gloo,cuda:nccl", {"GLOO_SOCKET_IFNAME": "eth0"}) == {}  # the learner's choice stays


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_one_tolerance_against_one_process_follows_the_launch(gpus, monkeypatch):
    """Chapters compare a launch's results with one CPU process at ``make_plan(n).tolerance``: assert_close's
    defaults on CPU ranks, ``runtime.TOLERANCE["cuda"]`` on GPU ranks, decided where the mode is."""
    monkeypatch.setattr(plan_module, "visible_gpus", lambda: gpus)
    for world in (1, 2, 4, 8):
        want = runtime.TOLERANCE["cuda"] if gpus >= world else {}
        assert make_plan(world).tolerance == want
    assert runtime.TOLERANCE["cuda"]["rtol"] > 1.3e-6  # wider than float32's default, which GPUs miss
    with pytest.raises(ValueError, match="device_type must be one of 'cpu', 'cuda'; got 'mps'"):
        runtime.tolerance("mps")


def test_the_launchers_hang_report_comes_before_nccls_watchdog():
    """A hang under NCCL: the launcher asks the ranks where they are at the launch's timeout; NCCL's watchdog
    aborts them at the group's. GPU mode's group waits longer, so the report finds them alive; gloo's
    waiting rank raises at the launch's timeout, which the report reads."""
    gpu = {"timeout": 5.0, "device_type": "cuda"}
    assert _worker.group_timeout(gpu) >= gpu["timeout"] + 30
    assert _worker.group_timeout({"timeout": 5.0, "device_type": "cpu"}) == 5.0
