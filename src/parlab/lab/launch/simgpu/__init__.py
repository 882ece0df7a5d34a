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
  come therefore blocks there, or nowhere. Inside backward or an ``autograd.Function`` (whose reads bypass
  the simulation) the collective completes before returning, so the data is always right.
- **A mismatch waits for the watchdog.** A collective that gloo rejects (peers calling different
  collectives) or that times out blocks until the group's timeout, then fails as NCCL's watchdog does,
  instead of raising at once. (Peers that call one collective with different sizes make gloo abort the
  process: the simulation cannot turn that into a wait.)
- ``torch.accelerator`` (which accelerate and the Trainer ask) presents the same GPUs.

What it cannot present (CUDA kernels, NCCL's own log, memory figures, GPU timings) is listed in
docs/ci.md, with the check on a real GPU that decides it.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import time
import weakref

ENV = "PARLAB_SIMULATE_GPUS"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
NAME = "Simulated GPU (parlab, on the CPU)"
MEMORY = 80 * 2**30
HOST_REMEMBERED = 4096  # tensors made on the CPU from nothing, the most recent
# torch.distributed's blocking collectives that NCCL queues and returns from.
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter")
# Tensor methods that copy to the host: the host waits for the GPU's queued work there.
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__repr__",
              "__format__", "__str__", "__array__")


class NeedsRealGPU(Exception):
    """What only a real GPU can answer (a memory figure, NCCL's log), asked on a simulated one. ``parlab run``
    on simulated GPUs lets a cell stop here and goes on with the next; the gpu job on a real GPU decides it.
    Not a ``LaunchError``: a cell that catches a launch's failure must not swallow it."""

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
    """A figure only a real GPU has (a memory statistic), read on a simulated one. Like a NaN it can be
    kept, passed on and computed with (the result is unmeasured too); reading it (formatting, comparing,
    converting) raises :class:`NeedsRealGPU`, so the code that carries it runs on, and the cell that reads
    it stops there."""

    def __init__(self, what: str):
        self.what = what

    def _read(self, *args, **kwargs):
        raise NeedsRealGPU(self.what)

    def _same(self, *args, **kwargs):
        return self

    __format__ = __str__ = __repr__ = __float__ = __int__ = __index__ = __bool__ = _read
    __lt__ = __le__ = __gt__ = __ge__ = _read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _same
    __floordiv__ = __rfloordiv__ = __neg__ = __abs__ = _same
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
        self.pending: list = []  # Queued collectives not yet waited for, in order
        self.lock = threading.Lock()
        self.timeout = 600.0  # the default group's timeout in seconds (NCCL's watchdog fires after it)
        self.timeouts: dict = {}  # a new group's own timeout, by the group
        self.swapped: dict = {}  # id -> weak reference, of tensors sent to a simulated GPU (on the CPU)
        self.host = collections.OrderedDict()  # id -> storage, of recent tensors made on the CPU from nothing


_state = _State()


def _is_cuda(device) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


# -- waiting where a GPU program waits ----------------------------------------------------------------

class Queued:
    """A collective queued on a simulated GPU: its work, what it writes, and when it completed (``done_at``,
    ``time.perf_counter()``; set by its future, or when waited for), which is when a GPU event recorded after
    it would fire."""

    def __init__(self, work, writes: set, what: str, timeout: float):
        self.work, self.writes, self.what, self.timeout = work, writes, what, timeout
        self.queued, self.done_at = time.monotonic(), None
        try:
            work.get_future().add_done_callback(self._done)
        except (AttributeError, RuntimeError):  # gloo's reduce-scatter and point-to-point have no future
            pass

    def _done(self, _future=None) -> None:
        if self.done_at is None:
            self.done_at = time.perf_counter()

    def finish(self) -> float:
        """Wait for it (NCCL's watchdog's way when it fails); returns when it completed."""
        try:
            self.work.wait()
        except Exception as exc:  # noqa: BLE001 - gloo refused it (a mismatch) or timed out: NCCL would hang
            time.sleep(max(0.0, self.timeout - (time.monotonic() - self.queued)))
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT") == "1":
                raise NeedsRealGPU("NCCL's flight recorder, which its watchdog dumps on a timeout") from None
            raise RuntimeError(
                f"[simulated NCCL] Watchdog caught collective operation timeout: {self.what} ran for "
                f"{self.timeout:.0f} s without completing (NCCL waits for peers that never match; gloo said: "
                f"{said})") from None
        self._done()
        return self.done_at


def wait_all() -> None:
    """Wait for every collective this process queued, as ``torch.cuda.synchronize()`` does on a GPU."""
    while _state.pending:
        _state.pending.pop(0).finish()


def _queue(work, tensors, what: str, group) -> None:
    _state.pending.append(Queued(work, _storages(tensors), what, _state.timeouts.get(group, _state.timeout)))


def _storages(tensors) -> set:
    import torch

    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.device.type != "meta"}


def _reads_pending(args, kwargs) -> bool:
    import torch
    from torch.utils._pytree import tree_leaves

    writes = set().union(*(entry.writes for entry in _state.pending))
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
    return _marked(_state.swapped, tensor)


def on_host(tensor) -> bool:
    """Was ``tensor`` made on the CPU from nothing (``torch.zeros(1)``: no device, no tensor argument) and
    never sent to a GPU? In GPU mode the gloo half of ``cpu:gloo,cuda:nccl`` carries such a tensor, which
    blocks as gloo does; any other tensor counts as on the GPU (what it was computed from is not tracked).
    The recent ones are remembered by id and storage, not by a weak reference (which would stop
    ``torch.utils.swap_tensors`` on a parameter): a stale or forgotten entry only changes whether the host
    waits at the collective, never the data."""
    try:
        return _state.host.get(id(tensor)) == tensor.untyped_storage().data_ptr() and not on_gpu(tensor)
    except (RuntimeError, NotImplementedError):
        return False


def _mark_host(result):
    import torch

    if isinstance(result, torch.Tensor):
        try:
            _state.host[id(result)] = result.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return result
        if len(_state.host) > HOST_REMEMBERED:
            _state.host.popitem(last=False)
    return result


def _marked(table: dict, tensor) -> bool:
    ref = table.get(id(tensor))
    return ref is not None and ref() is tensor


def _forget(ref, key: int, table: dict) -> None:
    if table.get(key) is ref:
        del table[key]


def _mark(result, table: dict | None = None):
    import torch

    table = _state.swapped if table is None else table
    if isinstance(result, torch.Tensor) and not _marked(table, result):
        key = id(result)
        table[key] = weakref.ref(result, functools.partial(_forget, key=key, table=table))
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
            if to_gpu:
                return _mark(result)
            return _mark_host(result) if not types and _state.initialized else result  # made from nothing

    return CudaOnCpu

def _index(device=None) -> int:
    import torch

    if device is None:
        return _state.current
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return _state.current if device.index is None else device.index


def install() -> bool:
    """Present ``PARLAB_SIMULATE_GPUS`` GPUs in this process (and, through ``PYTHONPATH``, in the Python
    processes it starts). Does nothing when the variable is unset; safe to call again."""
    if _state.installed or not requested():
        return _state.installed
    import torch

    from parlab.lab.launch.simgpu import cuda, distributed

    functions = cuda.functions(torch.cuda.is_initialized)
    for name, fn in functions.items():  # classes as they are; each function an object of its own
        setattr(torch.cuda, name, fn if isinstance(fn, type) else cuda._own(fn))
    cuda.patch_profiler()
    torch.compile = _no_compile
    for name, fn in cuda.accelerator_functions(functions).items():
        if hasattr(torch, "accelerator"):
            setattr(torch.accelerator, name, fn)
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        setattr(torch.cuda.memory, name, needs_real_gpu("the CUDA caching allocator's history"))
    distributed.patch()
    _mode_class()().__enter__()  # for the rest of the process
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SITE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([SITE, *paths])
    _state.installed = True
    return True


def _no_compile(model=None, **kwargs):
    """``torch.compile`` on simulated GPUs: its tracer (dynamo) cannot see through the simulation's torch.cuda
    and torch.accelerator, and Inductor's GPU kernels need a GPU; the compiled callable raises NeedsRealGPU."""
    def refuse(*args, **kw):
        raise NeedsRealGPU("torch.compile (dynamo traces the simulation's own functions; Inductor's GPU kernels)")

    return (lambda fn: refuse) if model is None else refuse


def active() -> bool:
    """Is this process presenting simulated GPUs?"""
    return _state.installed
