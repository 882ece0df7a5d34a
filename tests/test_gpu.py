"""GPU mode (NCCL, one GPU per rank). Marked `gpu`: skipped on machines without CUDA GPUs, run on simulated
ones under ``PARLAB_SIMULATE_GPUS`` (NCCL's ways included: parlab.lab.launch.simgpu)."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.lab.launch import simgpu
from parlab.lab.launch.plan import make_plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("no_leftover_ranks")]
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
# Under PARLAB_SIMULATE_GPUS (CPU CI) these tests run on simulated GPUs; the ones below need what the
# simulation cannot present (docs/ci.md): NCCL's own log, CUDA attention kernels, real memory figures.
real_gpu = pytest.mark.skipif(simgpu.active(), reason="needs a real GPU: the simulation has no NCCL, CUDA "
                                                      "kernels or memory figures (docs/ci.md)")


def _cuda_all_reduce():
    t = torch.full((4,), parlab.rank() + 1.0, device=parlab.device())
    dist.all_reduce(t)
    return dist.get_backend(), str(parlab.device()), t  # t is a CUDA tensor: it must come back on the CPU


def test_one_rank_per_gpu_with_nccl():
    n = min(torch.cuda.device_count(), 2)
    results = parlab.launch(_cuda_all_reduce, n)
    for rank, (backend, device, t) in enumerate(results):
        assert "nccl" in backend and device == f"cuda:{rank}"
        assert t.device.type == "cpu"
        torch.testing.assert_close(t, torch.full((4,), n * (n + 1) / 2))


def test_more_ranks_than_gpus():
    n = torch.cuda.device_count() + 1
    plan = make_plan(n, "auto")
    assert plan.backend == "gloo" and "NCCL needs one per rank" in plan.describe()
    with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU"):
        parlab.launch(_cuda_all_reduce, n, backend="nccl")
    results = parlab.launch(_cuda_all_reduce, 2 if n <= 2 else n, backend="gloo")  # CPU tensors, gloo
    assert results[0][:2] == ("gloo", "cpu")


def test_safe_after_the_caller_initialised_cuda():
    x = torch.ones(1024, device="cuda")  # the caller now holds a CUDA context
    assert torch.cuda.is_initialized() and x.sum().item() == 1024
    results = parlab.launch(_cuda_all_reduce, 1)
    assert "nccl" in results[0][0]


def _cpu_tensor_in_gpu_mode():
    t = torch.ones(2)  # made without device=parlab.device(): the gloo half of the group carries it
    dist.all_reduce(t)
    return t


def test_cpu_tensors_still_work_in_gpu_mode():
    n = min(torch.cuda.device_count(), 2)
    for t in parlab.launch(_cpu_tensor_in_gpu_mode, n):
        torch.testing.assert_close(t, torch.full((2,), float(n)))


def _hold_memory_then_fail():
    torch.empty(2**30, dtype=torch.uint8, device=parlab.device())  # 1 GiB per rank
    raise RuntimeError("fails while holding GPU memory")


@real_gpu
def test_gpu_memory_released_after_a_failure():
    free_before, _ = torch.cuda.mem_get_info(0)
    with pytest.raises(parlab.RankError):
        parlab.launch(_hold_memory_then_fail, 1)
    free_after, _ = torch.cuda.mem_get_info(0)
    assert free_after > free_before - 2**28  # the rank's gigabyte came back


@needs_two
def test_nccl_hang_is_reported():
    def skip():
        if parlab.rank() == 0:
            dist.all_reduce(torch.ones(1, device=parlab.device()))

    with pytest.raises(parlab.RankTimeoutError) as info:
        parlab.launch(skip, 2, timeout=5)
    assert "had returned" in info.value.stacks[1]


def _which_gpu():
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES"), str(torch.cuda.get_device_properties(parlab.device()).uuid)


@needs_two
def test_a_leased_launch_avoids_a_held_gpu(tmp_path, monkeypatch):
    """Workshop mode: with PARLAB_GPUS=auto a launch takes GPUs no other launch holds, and sees only those."""
    from parlab.lab.launch import lease

    monkeypatch.setenv("PARLAB_GPUS", "auto")
    monkeypatch.setenv("PARLAB_GPU_LOCKS", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with lease.acquire(1, wait=0) as other:  # another learner holds the first GPU
        assert other.gpus == ["0"]
        (visible, uuid), = parlab.launch(_which_gpu, 1)
    assert visible == "1"
    assert uuid != str(torch.cuda.get_device_properties(0).uuid)
    assert set(lease.holders_of(folder=str(tmp_path)).values()) == {None}  # the launch let go of GPU 1


def _nccl_all_reduce():
    t = torch.ones(1 << 20, device=parlab.device())  # (1M,): 4 MiB, enough for NCCL to set up its channels
    dist.all_reduce(t)
    torch.cuda.synchronize()


@needs_two
@real_gpu
@pytest.mark.parametrize("disable", ["0", "1"])
def test_nccl_p2p_disable_takes_effect(disable, tmp_path, monkeypatch):
    # chapter 02 and the guide's benchmark turn NVLink off with NCCL_P2P_DISABLE=1. NCCL reads it when a
    # process makes its first communicator, so it is set before the launch (ranks take on the caller's
    # environment); NCCL's own log then names each channel's transport.
    from parlab.lab.measure import nccl_transports

    monkeypatch.setenv("NCCL_P2P_DISABLE", disable)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    parlab.launch(_nccl_all_reduce, 2, backend="nccl")
    transports = nccl_transports("".join(p.read_text() for p in tmp_path.glob("nccl.*.log")))
    assert transports, "NCCL wrote no channel lines: was NCCL_DEBUG_FILE honoured?"
    if disable == "1":
        assert "P2P" not in transports


@needs_two
@real_gpu
def test_ring_attention_matches_pytorch_context_parallel():
    """Chapter 10's GPU reference: PyTorch's context_parallel (it refuses CPU attention) shards the sequence
    as parlab.lab.parallel.context.Layout does (head and tail chunks), and both match full attention."""
    from parlab.lab.parallel import context as cpx

    for res in parlab.launch(cpx.compare_with_pytorch, 2, backend="nccl"):
        assert res["same_layout"]
        assert res["pytorch_vs_full"] < 3e-2 and res["ring_vs_full"] < 3e-2  # bf16 inputs, fp32 ring
