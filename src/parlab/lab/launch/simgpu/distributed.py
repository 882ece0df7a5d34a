"""The simulated GPUs' ``torch.distributed``: NCCL's groups, by name and by their ways (``simgpu``)."""

from __future__ import annotations

import functools
import inspect
import sys

import torch

from parlab.lab.launch.simgpu import COLLECTIVES, _queue, _state, on_host

def _gpu_group(group) -> bool:
    """Queue a collective over ``group``, as NCCL would? Only in a GPU-mode group, and only where every
    later read of its output passes the simulation's mode: not in backward (the autograd engine reads
    gradients in C++), and not inside a torch function the mode is handling (an ``autograd.Function``'s
    forward runs with the mode off). There it completes before returning, as gloo's does: the data stays
    right, and only the timing of the host differs from NCCL's."""
    import torch
    import torch.distributed as dist

    if not _state.initialized or not dist.is_initialized():
        return False  # a CPU-mode rank: plain gloo, blocking
    if torch._C._current_autograd_node() is not None or not torch._C._is_torch_function_mode_enabled():
        return False
    return "cuda:" in str(dist.distributed_c10d.get_backend(group))


def _queued(name: str, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def collective(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        tensors = [v for value in bound.arguments.values()
                   for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, torch.Tensor)]
        if bound.arguments.get("async_op") or not _gpu_group(bound.arguments.get("group")) or all(map(on_host, tensors)):
            return original(*args, **kwargs)  # gloo's, blocking: CPU tensors go through GPU mode's gloo half
        bound.arguments["async_op"] = True
        work = original(*bound.args, **bound.kwargs)
        if work is not None:  # None: this rank is not in the group
            _queue(work, tensors, name, bound.arguments.get("group"))
        return None

    return collective


def _p2p(name: str, original, async_version):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def p2p(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if not _gpu_group(bound.arguments.get("group")) or on_host(bound.arguments["tensor"]):
            return original(*args, **kwargs)
        work = async_version(*bound.args, **bound.kwargs)  # isend/irecv take send/recv's arguments
        if work is not None:
            _queue(work, [bound.arguments["tensor"]], name, bound.arguments.get("group"))
        peer = bound.arguments.get("src" if name == "recv" else "dst")
        return -1 if peer is None else peer  # recv from any source: which one is known only once it arrives

    return p2p


def _init_process_group(original):
    @functools.wraps(original)
    def init_process_group(backend=None, *args, **kwargs):
        import datetime

        if backend is not None and "nccl" in str(backend):
            backend = "cpu:gloo,cuda:gloo"  # what NCCL's half presents, carried by gloo
        kwargs.pop("device_id", None)
        timeout = kwargs.get("timeout")
        if isinstance(timeout, datetime.timedelta):
            _state.timeout = timeout.total_seconds()
        return original(backend, *args, **kwargs)

    return init_process_group


def _get_backend(original):
    @functools.wraps(original)
    def get_backend(group=None):
        return str(original(group)).replace("cuda:gloo", "cuda:nccl")

    return get_backend


def _new_group(original):
    @functools.wraps(original)
    def new_group(*args, **kwargs):
        import datetime

        if "nccl" in str(kwargs.get("backend") or ""):
            kwargs["backend"] = None  # the default group's backend
        group = original(*args, **kwargs)
        if isinstance(kwargs.get("timeout"), datetime.timedelta):
            _state.timeouts[group] = kwargs["timeout"].total_seconds()
        return group

    return new_group


def patch() -> None:
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.nn.parallel as parallel

    for name in COLLECTIVES:
        setattr(dist, name, _queued(name, getattr(dist, name)))
    dist.send = _p2p("send", dist.send, dist.isend)
    dist.recv = _p2p("recv", dist.recv, dist.irecv)
    dist.init_process_group = _init_process_group(dist.init_process_group)
    dist.get_backend = _get_backend(dist.get_backend)
    dist.new_group = _new_group(dist.new_group)

    real_init_mesh = device_mesh.init_device_mesh

    @functools.wraps(real_init_mesh)
    def init_device_mesh(device_type, *args, **kwargs):
        return real_init_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.init_device_mesh = init_device_mesh
    real_mesh_init = device_mesh.DeviceMesh.__init__

    @functools.wraps(real_mesh_init)
    def mesh_init(self, device_type, *args, **kwargs):
        real_mesh_init(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.DeviceMesh.__init__ = mesh_init
    real_from_group = device_mesh.DeviceMesh.from_group

    def from_group(group, device_type, *args, **kwargs):
        return real_from_group(group, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.DeviceMesh.from_group = staticmethod(from_group)

    real_ddp_init = parallel.DistributedDataParallel.__init__

    @functools.wraps(real_ddp_init)
    def ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        real_ddp_init(self, module, None, None, *args, **kwargs)  # the module is on the CPU

    parallel.DistributedDataParallel.__init__ = ddp_init
    # nn.DataParallel runs the module as it is (the package's name data_parallel is also a function's)
    sys.modules["torch.nn.parallel.data_parallel"]._get_available_device_type = lambda: None

