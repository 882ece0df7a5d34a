"""The peak memory of a piece of work, on a GPU or a CPU rank (chapter 04: a training step under each ZeRO stage).

On a GPU, ``torch.cuda.max_memory_allocated`` answers "how much did this need at most". On a CPU PyTorch keeps no
such statistic, but its profiler (``torch.profiler.profile(profile_memory=True)``) records every allocation and
every release the allocator makes, in order, as ``[memory]`` events with a signed size. Adding them up in time
order gives the bytes live at each moment; the peak is their maximum, counted from the moment the work began.

What it sees: tensors allocated and freed by PyTorch on the thread that runs the work (on CPU, autograd's
backward runs on that thread too), and the buffers gloo allocates for a collective on its worker thread (the op
runs under the caller's thread-local state, the profiler's included). What it does not: memory allocated before
the work began (add what the rank held then, e.g. with ``measure_memory``), and a release made on another thread
outside that state: gloo's worker keeps a reference to an op's tensors until just after the op completes, so a
buffer the work drops as soon as its op is done is now and then freed there, unseen, and stays counted. Both
that and a gloo buffer that happens to be in flight at the peak can only add to it: on a CPU, the least over a
few identical runs is the work's own peak.
"""

from __future__ import annotations

import os

import torch


def peak_memory(fn, *args, device=None, **kwargs) -> tuple[object, int]:
    """Run ``fn(*args, **kwargs)``; return its result and the most bytes it had allocated at once beyond what
    was allocated when it started (0 if it allocated nothing). ``device``: where ``fn`` allocates (pass
    ``parlab.device()`` on a rank): a CUDA device is watched through CUDA's statistics, else the CPU."""
    from parlab.lab.launch import simgpu

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and not simgpu.active():  # a simulated GPU's tensors live on the CPU: watched there
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn(*args, **kwargs)
        torch.cuda.synchronize(device)
        return result, max(0, torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    # Kineto prints a status line to stderr as each profile starts and stops, on every rank; level 6 is quiet.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn(*args, **kwargs)
    live = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and e.device_type() == torch.autograd.DeviceType.CPU]
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return result, peak
