"""The simulated GPUs' ``torch.cuda``: a machine with GPUs, as ``parlab.lab.launch.simgpu`` presents it."""

from __future__ import annotations

import contextlib
import time

from parlab.lab.launch.simgpu import MEMORY, NAME, Unmeasured, _index, _state, needs_real_gpu, visible, wait_all

class Event:
    """``torch.cuda.Event``: it fires when the collectives queued before it complete, as a GPU event recorded
    on the stream after them does (its time then, on ``time.perf_counter``'s axis); the host does not wait."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing, self.at, self.after = enable_timing, None, []

    def record(self, stream=None):
        self.at, self.after = time.perf_counter(), list(_state.pending)

    def _fired(self) -> float:
        if self.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return max([self.at] + [q.done_at if q.done_at is not None else q.finish() for q in self.after])

    def elapsed_time(self, end) -> float:
        return (end._fired() - self._fired()) * 1e3

    def synchronize(self):
        self._fired()

    def query(self) -> bool:
        return all(q.done_at is not None for q in self.after)

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

    def is_capturing(self) -> bool:  # CUDA graphs: never, here
        return False


_STREAM = Stream()


class _Properties:
    def __init__(self, index: int):
        self.name, self.total_memory, self.uuid = NAME, MEMORY, f"GPU-sim-{index}"
        self.major, self.minor, self.multi_processor_count = 9, 0, 132

    def __repr__(self):
        return f"_CudaDeviceProperties(name='{self.name}', total_memory={self.total_memory >> 20}MB, uuid={self.uuid})"



def functions(real_is_initialized) -> dict:
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

    def get_rng_state(device="cuda"):
        import torch

        return torch.get_rng_state()  # the CPU's generator: the simulated GPUs' tensors are made there

    return {
        "get_rng_state": get_rng_state, "set_rng_state": lambda new_state, device="cuda": None,
        "get_rng_state_all": lambda: [get_rng_state() for _ in visible()],
        "set_rng_state_all": lambda new_states: None,
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
        "default_stream": lambda device=None: _STREAM, "is_current_stream_capturing": lambda: False,
    }


def _own(fn):
    """A function object of its own for each name (torch.compile's tracer refuses one registered twice)."""

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    return call


def accelerator_functions(cuda: dict) -> dict:
    """``torch.accelerator`` (accelerate and transformers ask it which device a machine has): the same GPUs."""
    import torch

    return {name: _own(fn) for name, fn in {
        "current_accelerator": lambda check_available=False: torch.device("cuda") if visible() else None,
        "is_available": lambda: bool(visible()), "device_count": lambda: len(visible()),
        "current_device_index": cuda["current_device"], "current_device_idx": cuda["current_device"],
        "set_device_index": cuda["set_device"], "set_device_idx": cuda["set_device"],
        "synchronize": cuda["synchronize"], "empty_cache": cuda["empty_cache"],
        "get_device_capability": cuda["get_device_capability"], "memory_allocated": cuda["memory_allocated"],
        "max_memory_allocated": cuda["max_memory_allocated"], "memory_reserved": cuda["memory_reserved"],
        "max_memory_reserved": cuda["max_memory_reserved"], "reset_peak_memory_stats": cuda["reset_peak_memory_stats"],
        "get_memory_info": cuda["mem_get_info"], "current_stream": cuda["current_stream"],
        "set_stream": lambda stream: None,
    }.items()}


def patch_profiler() -> None:
    """``torch.profiler.profile(activities=[CPU, CUDA])``: the simulated GPUs' work runs on the CPU, where the
    CPU activity records it; asking a CPU build's profiler for CUDA activity only slows every op down."""
    import functools

    from torch.profiler import ProfilerActivity, profile

    real_init = profile.__init__

    @functools.wraps(real_init)
    def init(self, *args, activities=None, **kwargs):
        if activities is not None:
            activities = [a for a in activities if a != ProfilerActivity.CUDA] or [ProfilerActivity.CPU]
        real_init(self, *args, activities=activities, **kwargs)

    profile.__init__ = init
