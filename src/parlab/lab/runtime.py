"""Who and where am I? Rank, world size, device and mode for code that runs on a rank (chapter 00).

These read the initialised process group (or, before one exists, the environment that ``parlab.launch``
or torchrun set), so the same function answers correctly in a notebook launch, under torchrun, and in a
plain single process (rank 0 of 1).

**The one decision.** Which device and backend a rank uses is decided here and nowhere else:
:func:`choose` before the ranks start (the launcher, ``launch`` inside a torchrun/SLURM job), and
:func:`gpu_mode` / :func:`device` once a group exists; every ``DeviceMesh`` comes from :func:`mesh`. No
other code tests the backend string: in GPU mode it is ``"cpu:gloo,cuda:nccl"`` (one backend per device
type), so comparing the backend with ``"nccl"`` is False exactly when it matters (tests/test_gpu_mode.py
fails on any such comparison). ``parlab.lab.job.train_fsdp`` is torch-only, to be copied; it writes the same rule out, and a test
holds it to this one.

The rule: **GPU mode when this machine gives every one of its ranks a GPU of its own** (NCCL refuses two
ranks on one GPU); rank ``local_rank`` then computes on ``cuda:local_rank`` of the GPUs it sees. Otherwise
CPU mode (gloo), and a rank in CPU mode sees no GPU at all (the launcher sets ``CUDA_VISIBLE_DEVICES=""``
before it starts), so nothing it runs can create a CUDA context on a GPU it was not given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")
# The backend argument of init_process_group in GPU mode: one backend per device type. NCCL moves CUDA
# tensors, gloo any CPU tensor a cell still has (made without device=parlab.device()), which NCCL alone
# would refuse.
GPU_MODE_BACKEND = "cpu:gloo,cuda:nccl"
# What a CPU-mode rank's CUDA_VISIBLE_DEVICES is: no GPU at all.
NO_GPUS = ""


# How far a run's numbers may be from one process on the CPU, as torch.testing.assert_close's keyword
# arguments, by the device the ranks computed on. CPU ranks: assert_close's float32 defaults (the same
# kernels, a different summation order). GPU ranks: cuBLAS and fused attention round differently from the
# CPU (about 1e-6 relative an op) and momentum carries it over steps. The GPU value is PROVISIONAL: the
# ``tolerance`` check of benchmarks/gpu_smoke.py measures the bound on a GPU and fails above it (docs/ci.md).
TOLERANCE = {"cpu": {}, "cuda": {"rtol": 1e-4, "atol": 1e-5}}


def tolerance(device_type: str) -> dict:
    """``assert_close``'s tolerance for ranks on ``device_type`` ("cpu" or "cuda") against one CPU process."""
    if device_type not in TOLERANCE:
        raise ValueError(f"device_type must be one of {', '.join(map(repr, TOLERANCE))}; got {device_type!r}")
    return dict(TOLERANCE[device_type])


@dataclass(frozen=True)
class Mode:
    """What :func:`choose` decided for one rank."""

    backend: str  # init_process_group's argument: "gloo" or GPU_MODE_BACKEND
    device: torch.device  # this rank's device: cuda:<local rank> or cpu
    note: str = ""  # why CPU although GPUs are visible ("" when there is nothing to explain)

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def name(self) -> str:
        """"nccl" or "gloo", as the launcher prints it."""
        return "nccl" if self.gpu else "gloo"


def choose(local_world_size: int, local_rank: int = 0, gpus: int | None = None, backend: str = "auto") -> Mode:
    """The one decision: the device and backend of rank ``local_rank`` of ``local_world_size`` ranks on
    this machine, with ``gpus`` GPUs visible to it (default: ``torch.cuda.device_count()``, which asks
    NVML and creates no CUDA context).

    ``backend="auto"``: GPU mode when ``gpus >= local_world_size``, else CPU mode, saying why when some
    GPUs were there; ``"gloo"``: CPU mode; ``"nccl"``: GPU mode, or a ValueError saying what to do.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    for name, value, low in (("local_world_size", local_world_size, 1), ("local_rank", local_rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int of at least {low}; got {value!r}")
    if local_rank >= local_world_size:
        raise ValueError(f"local_rank must be below local_world_size={local_world_size}; got {local_rank}")
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if backend == "gloo":
        return Mode("gloo", torch.device("cpu"))
    if gpus >= local_world_size:
        return Mode(GPU_MODE_BACKEND, torch.device("cuda", local_rank))
    if backend == "nccl":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={local_world_size} on this machine but {gpus} GPU(s) "
            f"are visible (CUDA_VISIBLE_DEVICES={visible}). NCCL refuses two ranks on one GPU. Use at most "
            f"{gpus} ranks, or backend='gloo' to run the ranks on CPU, or backend='auto' to choose for you."
            if gpus else "backend='nccl' needs CUDA GPUs and none is visible; use backend='gloo' or 'auto' (CPU).")
    note = f"{gpus} GPU(s) visible, NCCL needs one per rank: running on CPU instead" if gpus else ""
    return Mode("gloo", torch.device("cpu"), note)


def rank() -> int:
    """This process's rank, 0 … world_size-1."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    """How many ranks take part."""
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    """This rank's index among the ranks on its machine (its GPU index in GPU mode)."""
    return int(os.environ.get("LOCAL_RANK", rank()))


def gpu_mode(group=None) -> bool:
    """Does ``group`` (default: the whole group) move CUDA tensors? True for plain ``"nccl"`` and for a
    combined backend that names one for CUDA (``"cpu:gloo,cuda:nccl"``); False for ``"gloo"``. The only
    place that reads the backend string."""
    if not dist.is_initialized():
        return False
    backend = str(dist.get_backend(group)).lower()
    return backend == "nccl" or any(part.strip().startswith("cuda:") for part in backend.split(","))


def device(group=None) -> torch.device:
    """The device this rank computes on: its own GPU in GPU mode, else the CPU.

    ``PARLAB_DEVICE`` (which ``parlab.launch`` sets on every rank) answers first; then the group's backend
    (:func:`gpu_mode`); outside any group, the CPU. ``group``: the device for collectives over that group
    (the CPU when it is a gloo group, even in GPU mode)."""
    if group is not None:
        return torch.device("cuda", local_rank()) if gpu_mode(group) else torch.device("cpu")
    if "PARLAB_DEVICE" in os.environ:
        return torch.device(os.environ["PARLAB_DEVICE"])
    if gpu_mode():
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def mesh(shape: tuple[int, ...] | None = None, names: tuple[str, ...] | None = None, group=None):
    """The ``DeviceMesh`` for ``fully_shard`` and DTensor, on this rank's device type: pass it as ``mesh=``
    everywhere. Without one, ``fully_shard`` builds a CUDA mesh whenever the machine has a GPU, even over
    a gloo-only group in CPU mode. ``shape``: default ``(world_size,)``, one axis over all ranks;
    ``group``: a 1-D mesh over that process group's ranks instead."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if group is not None and group is not dist.group.WORLD:
        if shape is not None:
            raise ValueError(f"mesh: give shape or group, not both; got shape={shape!r} and a group")
        return DeviceMesh.from_group(group, device().type, mesh_dim_names=tuple(names) if names else None)
    shape = tuple(shape) if shape is not None else (world_size(),)
    return init_device_mesh(device().type, shape, mesh_dim_names=tuple(names) if names else None)


def synchronize() -> None:
    """Wait for this rank's queued GPU work (nothing on CPU): a host timestamp taken after it is the work's end."""
    d = device()
    if d.type == "cuda":
        torch.cuda.synchronize(d)
