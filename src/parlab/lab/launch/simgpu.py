"""GPUs simulated on the CPU, with NCCL's ways where they differ from gloo's (for CI without GPUs).

``PARLAB_SIMULATE_GPUS=N`` makes every process that imports ``parlab`` (and every Python process started
from one: the variable puts a ``sitecustomize`` on ``PYTHONPATH``) present a machine with N GPUs, so that
the GPU-only code of the package, the chapters and the copyable scripts runs on a CPU-only machine:

- **The machine.** ``torch.cuda.is_available()`` is True and ``device_count()`` counts the simulated GPUs
  that ``CUDA_VISIBLE_DEVICES`` lets this process see (numbers below N, or ``GPU-sim-<n>`` UUIDs; ``""``:
  none). The launcher, the lease pool and the one decision (``runtime.choose``) see them as GPUs.
- **The device, swapped to the CPU.** A tensor or module sent to ``cuda``/``cuda:<n>`` (a ``device=``
  argument, ``.to``, ``.cuda``) lands on the CPU; pinned memory is plain memory; a ``"cuda"`` device mesh
  is a CPU one; ``DistributedDataParallel``'s ``device_ids`` are dropped. Names, arguments, shapes and
  every assert that does not depend on CUDA run as on a GPU. A memory statistic reads as
  :class:`Unmeasured`: carrying it is fine, using it raises :class:`NeedsRealGPU`, where ``parlab run``
  lets the cell stop and goes on (the cells after it still run).
- **CUDA starts in a process** when it calls ``set_device`` or puts a tensor on a GPU, as on a GPU machine:
  ``torch.cuda.is_initialized()`` is then True (the zygote refuses a preload that does this).
- **NCCL's groups.** ``init_process_group("nccl" | "cpu:gloo,cuda:nccl", device_id=...)`` makes a group
  that ``dist.get_backend()`` reports as ``"cpu:gloo,cuda:nccl"``; gloo carries the bytes.
- **A collective returns when it is queued.** In a GPU-mode group, a blocking collective
  (``all_reduce``, ``all_gather``, ``reduce_scatter_tensor``, ``broadcast``, ``all_to_all_single``, ...,
  ``send``/``recv``) returns at once, as NCCL's does; the host waits only where a GPU program would: at a
  host read (``.item()``, ``.tolist()``, ``print(t)``, ...), at ``torch.cuda.synchronize()``, or at the
  first op that reads a tensor the collective writes (the GPU's stream order). A rank whose peers never
  come therefore blocks there, or nowhere.
- **A mismatch waits for the watchdog.** A collective that gloo rejects (peers with other sizes) or that
  times out blocks until the group's timeout, then fails as NCCL's watchdog does, instead of raising at
  once.

What it cannot present (CUDA kernels, NCCL's own log, memory figures, GPU timings) is listed in
docs/ci.md, with the check on a real GPU that decides it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import time
import weakref

from parlab.lab.launch.errors import LaunchError

ENV = "PARLAB_SIMULATE_GPUS"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_simsite")
NAME = "Simulated GPU (parlab, on the CPU)"
MEMORY = 80 * 2**30
# torch.distributed's blocking collectives that NCCL queues and returns from.
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter")
# Tensor methods that copy to the host: the host waits for the GPU's queued work there.
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__repr__",
              "__format__", "__str__", "__array__")


class NeedsRealGPU(LaunchError):
    """What only a real GPU can answer (a memory figure, NCCL's log), asked on a simulated one. ``parlab run``
    on simulated GPUs lets a cell stop here and goes on with the next; the gpu job on a real GPU decides it."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"[simulated GPU] needs a real GPU: {what} (docs/ci.md, GPUs simulated on the CPU)")

    def __reduce__(self):  # from a rank to the notebook: made again from what it needs
        return NeedsRealGPU, (self.what,)


def needs_real_gpu(what: str):
    """A function that raises :class:`NeedsRealGPU` for ``what``, whatever it is called with."""

    def read(*args, **kwargs):
        raise NeedsRealGPU(what)

    return read


class Unmeasured:
    """A figure only a real GPU has (a memory statistic), read on a simulated one: it can be kept and
    passed on, and using it (formatting, arithmetic, comparing) raises :class:`NeedsRealGPU`, so code that
    only carries it runs on and the cell that reads it stops there."""

    def __init__(self, what: str):
        self.what = what

    def _use(self, *args, **kwargs):
        raise NeedsRealGPU(self.what)

    __format__ = __str__ = __repr__ = __float__ = __int__ = __index__ = __bool__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _use
    __floordiv__ = __rfloordiv__ = __lt__ = __le__ = __gt__ = __ge__ = __neg__ = _use
    __hash__ = object.__hash__


def requested(env=None) -> int:
    """How many GPUs ``PARLAB_SIMULATE_GPUS`` asks for (0 when unset)."""
    value = (os.environ if env is None else env).get(ENV, "").strip()
    if not value:
        return 0
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise ValueError(f"{ENV} must be a number of GPUs from 1 to 64 (or unset); got {value!r}")
    return int(value)


def visible(env=None) -> list[int]:
    """The simulated GPUs this process sees, as the machine numbers them, ``CUDA_VISIBLE_DEVICES`` applied."""
    env = os.environ if env is None else env
    n = requested(env)
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return list(range(n))
    seen = []
    for entry in filter(None, (e.strip() for e in listed.split(","))):
        index = int(entry) if entry.isdigit() else int(entry[8:]) if entry.startswith("GPU-sim-") and entry[8:].isdigit() else -1
        if not 0 <= index < n:
            break  # CUDA stops at the first entry that names no GPU
        seen.append(index)
    return seen


class _State:
    def __init__(self):
        self.installed = False
        self.initialized = False  # CUDA started in this process (set_device, or a tensor put on a GPU)
        self.current = 0
        self.pending: list = []  # (work, storages it writes, what) of collectives queued and not yet waited for
        self.lock = threading.Lock()
        self.timeout = 600.0  # the default group's timeout in seconds (NCCL's watchdog fires after it)
        self.timeouts: dict = {}  # a new group's own timeout, by the group
        self.swapped: dict = {}  # id -> weak reference, of tensors sent to a simulated GPU (on the CPU)


_state = _State()


def _is_cuda(device) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


# -- waiting where a GPU program waits ----------------------------------------------------------------

def wait_all() -> None:
    """Wait for every collective this process queued, as ``torch.cuda.synchronize()`` does on a GPU."""
    while _state.pending:
        work, _, what, queued, timeout = _state.pending.pop(0)
        _finish(work, what, queued, timeout)


def _finish(work, what: str, queued: float, timeout: float) -> None:
    try:
        work.wait()
    except Exception as exc:  # noqa: BLE001 - gloo refused it (a mismatch) or timed out: NCCL would hang
        time.sleep(max(0.0, timeout - (time.monotonic() - queued)))
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(
            f"[simulated NCCL] Watchdog caught collective operation timeout: {what} ran for {timeout:.0f} s "
            f"without completing (NCCL waits for peers that never match; gloo said: {said})") from None


def _queue(work, tensors, what: str, group) -> None:
    timeout = _state.timeouts.get(group, _state.timeout)
    _state.pending.append((work, _storages(tensors), what, time.monotonic(), timeout))


def _storages(tensors) -> set:
    import torch

    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.device.type != "meta"}


def _reads_pending(args, kwargs) -> bool:
    import torch
    from torch.utils._pytree import tree_leaves

    writes = set().union(*(entry[1] for entry in _state.pending))
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            try:
                if leaf.untyped_storage().data_ptr() in writes:
                    return True
            except (RuntimeError, NotImplementedError):  # a tensor without storage (a DTensor's wrapper)
                continue
    return False


def _swap_device(value):
    import torch

    if _is_cuda(value):
        _state.initialized = True
        return torch.device("cpu")
    return value


def on_gpu(tensor) -> bool:
    """Was ``tensor`` sent to a simulated GPU (a ``cuda`` device argument, ``.to``, ``.cuda``)?"""
    ref = _state.swapped.get(id(tensor))
    return ref is not None and ref() is tensor


def _forget(ref, key: int) -> None:
    if _state.swapped.get(key) is ref:
        del _state.swapped[key]


def _mark(result):
    import torch

    if isinstance(result, torch.Tensor) and not on_gpu(result):
        key = id(result)
        _state.swapped[key] = weakref.ref(result, functools.partial(_forget, key=key))
    return result


def _mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    host_reads = {getattr(torch.Tensor, name) for name in HOST_READS if hasattr(torch.Tensor, name)}
    to_like = {torch.Tensor.to, torch.Tensor.new_empty, torch.Tensor.new_zeros, torch.Tensor.new_ones,
               torch.Tensor.new_full, torch.Tensor.new_tensor}

    class CudaOnCpu(TorchFunctionMode):
        """Puts ``cuda`` tensors on the CPU; waits for queued collectives where a GPU program would."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if _state.pending and (func in host_reads or _reads_pending(args, kwargs)):
                wait_all()
            to_gpu = _is_cuda(kwargs.get("device")) or (func in to_like and any(map(_is_cuda, args)))
            if "device" in kwargs:
                kwargs["device"] = _swap_device(kwargs["device"])
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            if func is torch.Tensor.cuda:
                _state.initialized = True
                return _mark(args[0])
            if func is torch.Tensor.pin_memory:
                return args[0]
            if func is torch.Tensor.is_pinned:
                return False
            if func in to_like:
                args = tuple(_swap_device(a) for a in args)
            result = func(*args, **kwargs)
            return _mark(result) if to_gpu else result

    return CudaOnCpu


# -- torch.cuda, as a machine with GPUs presents it -------------------------------------------------------

class Event:
    """``torch.cuda.Event``: a host timestamp taken when recorded (the queued collectives waited for first)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing, self.at = enable_timing, None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1e3

    def synchronize(self):
        wait_all()

    def query(self) -> bool:
        return True

    def wait(self, stream=None):
        pass


class Stream:
    """``torch.cuda.Stream``: one queue, the host's."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = device

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self):
        wait_all()

    def query(self) -> bool:
        return True


_STREAM = Stream()


class _Properties:
    def __init__(self, index: int):
        self.name, self.total_memory, self.uuid = NAME, MEMORY, f"GPU-sim-{index}"
        self.major, self.minor, self.multi_processor_count = 9, 0, 132

    def __repr__(self):
        return f"_CudaDeviceProperties(name='{self.name}', total_memory={self.total_memory >> 20}MB, uuid={self.uuid})"


def _index(device=None) -> int:
    import torch

    if device is None:
        return _state.current
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return _state.current if device.index is None else device.index


def _cuda_functions(real_is_initialized) -> dict:
    def set_device(device):
        _state.current, _state.initialized = _index(device), True

    def is_initialized():
        return _state.initialized or real_is_initialized()

    def synchronize(device=None):
        wait_all()

    def get_device_properties(device=None):
        index = _index(device)
        seen = visible()
        if not 0 <= index < len(seen):
            raise AssertionError("Invalid device id")  # torch's own message
        return _Properties(seen[index])

    @contextlib.contextmanager
    def stream(s=None):
        yield

    what = "a GPU memory figure (the simulated GPUs' tensors live on the CPU)"

    def memory(device=None):
        return Unmeasured(what)

    def mem_get_info(device=None):
        return Unmeasured(what), Unmeasured(what)

    return {
        "is_available": lambda: True, "device_count": lambda: len(visible()), "set_device": set_device,
        "current_device": lambda: _state.current, "is_initialized": is_initialized, "synchronize": synchronize,
        "get_device_properties": get_device_properties, "get_device_name": lambda device=None: NAME,
        "get_device_capability": lambda device=None: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "mem_get_info": mem_get_info, "memory_allocated": memory, "max_memory_allocated": memory,
        "memory_reserved": memory, "max_memory_reserved": memory, "memory_stats": needs_real_gpu(what),
        "set_per_process_memory_fraction": needs_real_gpu("a cap on GPU memory"),
        "reset_peak_memory_stats": lambda device=None: None, "reset_max_memory_allocated": lambda device=None: None,
        "empty_cache": lambda: None,
        "Event": Event, "Stream": Stream, "stream": stream, "current_stream": lambda device=None: _STREAM,
        "default_stream": lambda device=None: _STREAM,
    }


# -- torch.distributed, NCCL's way ------------------------------------------------------------------------

def _gpu_group(group) -> bool:
    import torch.distributed as dist

    if not _state.initialized or not dist.is_initialized():
        return False  # a CPU-mode rank: plain gloo, blocking
    return "cuda:" in str(dist.distributed_c10d.get_backend(group))


def _queued(name: str, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def collective(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("async_op") or not _gpu_group(bound.arguments.get("group")):
            return original(*args, **kwargs)
        bound.arguments["async_op"] = True
        work = original(*bound.args, **bound.kwargs)
        tensors = [v for value in bound.arguments.values()
                   for v in (value if isinstance(value, (list, tuple)) else [value])]
        if work is not None:  # None: this rank is not in the group
            _queue(work, tensors, name, bound.arguments.get("group"))
        return None

    return collective


def _p2p(name: str, original, async_version):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def p2p(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if not _gpu_group(bound.arguments.get("group")):
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


def _patch_distributed() -> None:
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


def install() -> bool:
    """Present ``PARLAB_SIMULATE_GPUS`` GPUs in this process (and, through ``PYTHONPATH``, in the Python
    processes it starts). Does nothing when the variable is unset; safe to call again."""
    if _state.installed or not requested():
        return _state.installed
    import torch

    for name, fn in _cuda_functions(torch.cuda.is_initialized).items():
        setattr(torch.cuda, name, fn)
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        setattr(torch.cuda.memory, name, needs_real_gpu("the CUDA caching allocator's history"))
    _patch_distributed()
    _mode_class()().__enter__()  # for the rest of the process
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SITE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([SITE, *paths])
    _state.installed = True
    return True


def active() -> bool:
    """Is this process presenting simulated GPUs?"""
    return _state.installed
