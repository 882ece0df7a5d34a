"""Kernel-side GPU cells hold a lease too (launch/kernel_gpus.py), tested on a faked CUDA and a faked pool:
the block computes on the GPUs it leased, never on the pool's first one by default, and gives them back,
memory first, however it ends."""

from __future__ import annotations

import os

import pytest

from parlab.lab.launch import LaunchError, kernel_gpus, lease, leased_gpus


class FakeCuda:
    """torch.cuda as a kernel on an 8-GPU machine would see it; memory a test leaves on a device stays."""

    def __init__(self, count=8):
        self.count, self.current, self.initialized = count, 0, False
        self.allocated = {i: 0 for i in range(count)}
        self.calls = []

    def device_count(self):
        return self.count

    def is_initialized(self):
        return self.initialized

    def current_device(self):
        return self.current

    def set_device(self, i):
        self.calls.append(("set_device", i))
        self.current, self.initialized = i, True

    def synchronize(self, i):
        self.calls.append(("synchronize", i))

    def empty_cache(self):
        self.calls.append(("empty_cache",))

    def memory_allocated(self, i):
        return self.allocated[i]


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(kernel_gpus, "_cuda", lambda: fake)
    return fake


def _held(folder):
    return {g: h["what"] for g, h in lease.holders_of(folder=folder).items() if h}


def test_a_kernel_block_leases_gpus_behind_a_launch_and_gives_them_back(tmp_path, cuda):
    folder = str(tmp_path / "locks")
    env = {"PARLAB_GPUS": "auto", "CUDA_VISIBLE_DEVICES": "4,5,6,7", "PARLAB_GPU_LOCKS": folder}
    with lease.acquire(2, env=env, wait=0, what="a launch"):  # GPUs 4 and 5 are taken
        with leased_gpus(2, what="DataParallel", env=env, wait=0) as held:
            assert held.gpus == ["6", "7"] and held.indices == [2, 3]  # 6 and 7 are this process's cuda:2, 3
            assert str(held.device) == "cuda:2" and [str(d) for d in held.devices] == ["cuda:2", "cuda:3"]
            assert cuda.current == 2  # .cuda() and device="cuda" go to the leased GPU, not cuda:0
            assert _held(folder) == {"4": "a launch", "5": "a launch", "6": "DataParallel", "7": "DataParallel"}
        assert _held(folder) == {"4": "a launch", "5": "a launch"}
    assert ("empty_cache",) in cuda.calls and cuda.calls.index(("synchronize", 2)) < cuda.calls.index(("empty_cache",))


def test_the_lease_ends_when_the_block_raises_and_leftover_memory_is_named(tmp_path, cuda):
    folder = str(tmp_path / "locks")
    env = {"PARLAB_GPUS": "0,1", "PARLAB_GPU_LOCKS": folder}
    cuda.initialized, cuda.current = True, 1
    said = []
    with pytest.raises(ZeroDivisionError):
        with leased_gpus(1, env=env, wait=0, echo=said.append) as held:
            assert held.gpus == ["0"] and cuda.current == 0
            cuda.allocated[0] = 3 * 2**20  # a tensor the cell kept in a notebook variable
            1 / 0
    assert _held(folder) == {} and cuda.current == 1  # released; the kernel's own device back
    assert said == ["parlab: after leased_gpus, tensors of this kernel still hold 3.0 MiB on GPU 0: `del` them "
                    "inside the block (or move them to the CPU) so that the next holder gets the memory"]


def test_without_a_pool_the_first_gpus_and_nothing_locked(tmp_path, cuda, monkeypatch):
    monkeypatch.delenv("PARLAB_GPUS", raising=False)
    env = {"PARLAB_GPU_LOCKS": str(tmp_path / "locks")}
    with leased_gpus(2, env=env) as held:
        assert held.gpus == ["0", "1"] and held.indices == [0, 1] and cuda.current == 0
    assert not os.path.exists(tmp_path / "locks")
    with pytest.raises(LaunchError, match=r"leased_gpus\(9\) needs 1 to 8 GPUs: this process sees 8"):
        with leased_gpus(9, env=env):
            pass


def test_a_kernel_block_waits_its_turn(tmp_path, cuda):
    env = {"PARLAB_GPUS": "0", "PARLAB_GPU_LOCKS": str(tmp_path / "locks")}
    with lease.acquire(1, env=env, device_count=lambda: 8, wait=0, what="a launch"):
        with pytest.raises(LaunchError, match=r"Held: GPU 0 by .*a launch"):
            with leased_gpus(1, env=env, wait=0):
                pass
    assert cuda.calls == []  # never touched a GPU it did not hold


UUIDS = ["5d1f0a2c-1111-2222-3333-444455556666", "9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff",
         "0a0b0c0d-1234-5678-9abc-def012345678"]


@pytest.mark.parametrize("gpus, env, indices", [
    (["2", "0"], {}, [2, 0]),  # numbers: the machine's own
    (["GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff"], {}, [1]),  # as nvidia-smi -L prints it
    (["GPU-0a0b0c0d", "5d1f0a2c"], {}, [2, 0]),  # prefixes, as CUDA_VISIBLE_DEVICES accepts them
    (["MIG-9e8d7c6b-aaaa"], {}, [1]),
    (["GPU-0a0b0c0d"], {"CUDA_VISIBLE_DEVICES": "GPU-5d1f0a2c,GPU-0a0b0c0d"}, [1]),  # a spawner's list of UUIDs
])
def test_local_indices_of_numbers_and_uuids(gpus, env, indices):
    """A pool of UUIDs (PARLAB_GPUS=GPU-…, no CUDA_VISIBLE_DEVICES) used to fail with int('GPU-…')."""
    assert kernel_gpus.local_indices(gpus, env, uuids=lambda: UUIDS) == indices


def test_a_uuid_of_no_gpu_here_is_named():
    with pytest.raises(LaunchError, match=r"PARLAB_GPUS names 'GPU-ffff', which is none of this process's GPUs"):
        kernel_gpus.local_indices(["GPU-ffff"], {}, uuids=lambda: UUIDS)


def test_a_kernel_block_on_a_pool_of_uuids(tmp_path, cuda, monkeypatch):
    """leased_gpus with PARLAB_GPUS of UUIDs computes on the device whose UUID it leased."""

    class Props:
        def __init__(self, i):
            self.uuid = UUIDS[i] if i < len(UUIDS) else f"{i:08x}-0000-0000-0000-000000000000"

    cuda.get_device_properties = Props
    env = {"PARLAB_GPUS": "GPU-0a0b0c0d-1234-5678-9abc-def012345678", "PARLAB_GPU_LOCKS": str(tmp_path / "locks")}
    with leased_gpus(1, env=env, wait=0) as held:
        assert held.indices == [2] and cuda.current == 2
