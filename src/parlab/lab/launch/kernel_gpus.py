"""GPUs for work in the notebook's own process, leased like a launch's (lease.py).

A few cells compute on a GPU in the kernel itself, not on ranks: chapter 01's peak-memory step, chapter
03's ``nn.DataParallel``, chapter 08's ``torch.compile``. On a shared machine they must hold a lease too,
or every learner's kernel lands on the pool's first GPU beside whoever holds it. ::

    from parlab.lab.launch import leased_gpus

    with leased_gpus(2, what="DataParallel") as held:  # waits its turn, like a launch
        dp = torch.nn.DataParallel(model.to(held.device), device_ids=held.indices)
        ...
        del dp, model  # nothing of the cell's may stay on the GPUs once the lease ends

Inside the block the current CUDA device is the first leased GPU (so ``.cuda()`` and ``device="cuda"``
go there). On leaving it, the previous device comes back, the kernel's cached GPU memory is returned
(``torch.cuda.empty_cache``), a line warns if tensors still hold memory on the leased GPUs, and the lease
ends. What cannot be freed without restarting the kernel is CUDA's own context (a few hundred MiB on each
GPU the kernel has used). Without ``PARLAB_GPUS`` nothing is locked and the first ``n`` visible GPUs are
used, as before.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, field

from parlab.lab.launch import lease
from parlab.lab.launch.errors import LaunchError


def _cuda():
    import torch

    return torch.cuda


@dataclass
class KernelGPUs:
    """The GPUs a kernel-side block holds: ``gpus`` as the lock files (and nvidia-smi) name them, ``indices``
    as torch numbers them in this process."""

    gpus: list[str] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)

    @property
    def devices(self) -> list:
        import torch

        return [torch.device("cuda", i) for i in self.indices]

    @property
    def device(self):
        return self.devices[0]


def _device_uuids() -> list[str]:
    """This process's GPUs' UUIDs in torch's numbering (``cuda:i`` is the i-th), without the ``GPU-``/``MIG-``
    prefix nvidia-smi writes. Asking starts CUDA in the kernel, as the block's ``set_device`` does next."""
    cuda = _cuda()
    return [str(cuda.get_device_properties(i).uuid) for i in range(cuda.device_count())]


def local_indices(gpus: list[str], env=None, uuids=None) -> list[int]:
    """Where leased GPUs are in this process's numbering: their places in ``CUDA_VISIBLE_DEVICES`` when it is
    set (the pool then names GPUs as it lists them, numbers or UUIDs); else a number is its own, and a UUID
    (``GPU-…`` or ``MIG-…`` as ``nvidia-smi -L`` prints it, or a prefix of one, as CUDA accepts) is the
    device whose UUID it is. ``uuids``: a function giving this process's devices' UUIDs in torch's order
    (default: torch's device properties)."""
    env = env if env is not None else os.environ
    if "CUDA_VISIBLE_DEVICES" in env:
        visible = [t.strip() for t in env["CUDA_VISIBLE_DEVICES"].split(",") if t.strip()]
        return [visible.index(g) for g in gpus]
    names = None
    indices = []
    for g in gpus:
        if g.isdigit():
            indices.append(int(g))
            continue
        names = names if names is not None else (uuids or _device_uuids)()
        bare = g.split("-", 1)[1] if g.startswith(("GPU-", "MIG-")) else g
        found = [i for i, u in enumerate(names) if u.removeprefix("GPU-").removeprefix("MIG-").startswith(bare)]
        if len(found) != 1:
            raise LaunchError(f"PARLAB_GPUS names {g!r}, which {'is none' if not found else 'matches several'} of "
                              f"this process's GPUs (UUIDs, in torch's order: {', '.join(names) or 'none'}); "
                              f"name them as `nvidia-smi -L` prints them")
        indices.append(found[0])
    return indices


@contextlib.contextmanager
def leased_gpus(n: int = 1, *, what: str = "a cell in the kernel", env=None, wait: float | None = None,
                echo=None):
    """Hold ``n`` GPUs for work in this process (see the module's docstring); yields :class:`KernelGPUs`."""
    env = env if env is not None else os.environ
    cuda = _cuda()
    visible = cuda.device_count()
    if not isinstance(n, int) or not 1 <= n <= visible:
        raise LaunchError(f"leased_gpus({n!r}) needs 1 to {visible} GPUs: this process sees {visible}")
    held = lease.acquire(n, env=env, device_count=lambda: visible, wait=wait, what=what, echo=echo)
    try:
        gpus = held.gpus or [str(i) for i in range(n)]  # not leasing: the first n, as before
        indices = local_indices(held.gpus, env) if held.gpus else list(range(n))
        previous = cuda.current_device() if cuda.is_initialized() else None
        cuda.set_device(indices[0])
        try:
            yield KernelGPUs(gpus, indices)
        finally:
            _free(cuda, indices, previous, held.gpus or gpus, echo)
    finally:
        held.release()


def _free(cuda, indices: list[int], previous: int | None, names: list[str], echo) -> None:
    """Give back what the block cached on the GPUs, say what is still held there, restore the device."""
    gc.collect()  # tensors of the block that nothing refers to any more
    for i in indices:
        with contextlib.suppress(RuntimeError):
            cuda.synchronize(i)
    cuda.empty_cache()
    still = {name: cuda.memory_allocated(i) for name, i in zip(names, indices)}
    still = {name: b for name, b in still.items() if b}
    if still:
        say = echo or print
        say("parlab: after leased_gpus, tensors of this kernel still hold "
            + ", ".join(f"{b / 2**20:.1f} MiB on GPU {name}" for name, b in still.items())
            + ": `del` them inside the block (or move them to the CPU) so that the next holder gets the memory")
    if previous is not None:
        cuda.set_device(previous)
