"""Bandwidth against message size, and the α-β cost model fitted to it (chapter 02).

:func:`sweep` runs one collective at growing sizes on every rank (call it inside ``parlab.launch``) and
returns, per size, the slowest rank's median time, the algorithm bandwidth and the bus bandwidth, by the
nccl-tests convention (see :mod:`parlab.lab.measure.comm`). :func:`fit_alpha_beta` fits the classic
latency-bandwidth model ``T(m) = α + m·β`` (α: fixed cost per call, β: seconds per byte) to it by least
squares, weighting each point by 1/T so that small messages, where α rules, count as much as large
ones (Hockney 1994; Thakur, Rabenseifner & Gropp 2005 give the per-algorithm forms), and keeping both
non-negative: a time cannot shrink as a message grows, however noisy the machine.

``sweep("send")`` times one message between the first two ranks of the group the classic way, a
ping-pong (rank 0 sends, rank 1 sends it back) halved: one clock, so no two ranks' clocks or barrier
exits need to agree (chapter 06 fits the pipeline's link with it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from parlab.lab.measure.comm import algbw, bus_factor

# PyTorch 2.13 renamed the tensor forms (the old names warn); older releases have only the old ones.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")


@dataclass(frozen=True)
class BandwidthPoint:
    bytes: int
    seconds: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s


def _runner(op: str, nbytes: int, n: int, device, group=None):
    # float32 elements, divisible by the group size (a message between two ranks need not be)
    numel = max(1, nbytes // 4) if op == "send" else max(n, nbytes // 4 // n * n)
    x = torch.ones(numel, device=device)
    out = torch.empty(numel, device=device)
    shard = torch.empty(numel // n, device=device)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x, group=group),
        "all_gather": lambda: _all_gather(out, x[: numel // n], group=group),
        "reduce_scatter": lambda: _reduce_scatter(shard, x, group=group),
        "broadcast": lambda: dist.broadcast(x, dist.get_global_rank(group, 0) if group else 0, group=group),
        "all_to_all": lambda: dist.all_to_all_single(out, x, group=group),
        "send": lambda: _ping_pong(x, group),
    }
    return calls[op], numel * 4


def _ping_pong(x, group) -> None:
    """Group rank 0 sends ``x`` to group rank 1, which sends it back; the others wait at the next barrier."""
    me = dist.get_rank(group)
    if me > 1:
        return
    peer = dist.get_global_rank(group, 1 - me) if group else 1 - me
    first, second = (dist.send, dist.recv) if me == 0 else (dist.recv, dist.send)
    first(x, peer, group=group)
    second(x, peer, group=group)


def sweep(op: str = "all_reduce", sizes=(2**10, 2**14, 2**18, 2**20), iters: int = 5, warmup: int = 2,
          device=None, group=None) -> list[BandwidthPoint]:
    """Time ``op`` at each size in bytes (the nccl-tests size); run on every rank of a launch.

    group: a process group (default: all ranks); every rank of the launch must call ``sweep``.
    ``"send"``: one message from the group's rank 0 to its rank 1, half a ping-pong's round trip.
    """
    if op not in OPS:
        raise ValueError(f"op={op!r} is not swept; choose one of {', '.join(OPS)}")
    if iters < 1:
        raise ValueError(f"iters={iters!r} must be at least 1")
    n = dist.get_world_size(group)
    if device is None:  # this rank's own GPU when the group moves CUDA tensors (the one decision), else the CPU
        from parlab.lab import runtime
        device = runtime.device(group if group is not None else dist.group.WORLD)
    points = []
    for size in sizes:
        call, nbytes = _runner(op, int(size), n, device, group)
        for _ in range(warmup):
            call()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        times = []
        for _ in range(iters):
            # Each call timed alone, from a common start: the median then shrugs off the calls that a
            # busy machine's scheduler delayed (ranks sharing few CPU cores are often descheduled).
            dist.barrier(group)
            sync()
            start = time.perf_counter()
            call()
            sync()
            times.append((time.perf_counter() - start) / (2 if op == "send" else 1))  # a round trip is two
        seconds = torch.tensor([sorted(times)[len(times) // 2]], device=device)
        # a collective is as slow as its slowest rank
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)
        t = seconds.item()
        points.append(BandwidthPoint(nbytes, t, algbw(nbytes, t), algbw(nbytes, t) * bus_factor(op, n)))
    return points


def fit_alpha_beta(sizes, seconds) -> tuple[float, float]:
    """Least-squares fit of ``T = α + β·m`` with α, β ≥ 0; returns ``(alpha_seconds, beta_seconds_per_byte)``.

    Where the unconstrained optimum has a negative term (noise on a loaded machine), the best fit with
    that term at zero is returned, not the optimum clipped: clipping would leave the other term fitted
    to a line that is not there. β = 0 then says that the sizes did not resolve the bandwidth."""
    m = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if m.shape != t.shape or m.size < 2:
        raise ValueError(f"sizes and seconds must be equally long with at least 2 points; got {m.size} "
                         f"and {t.size}")
    a = np.stack([np.ones_like(m), m], axis=1) / t[:, None]  # relative error: weight rows by 1/T
    ones = np.ones_like(t)
    alpha, beta = np.linalg.lstsq(a, ones, rcond=None)[0]
    if alpha >= 0 and beta >= 0:
        return float(alpha), float(beta)
    # the optimum under α, β ≥ 0 lies on an edge: the better of the two one-term fits
    fits = [(max(float(a[:, k] @ ones / (a[:, k] @ a[:, k])), 0.0), k) for k in (0, 1)]
    value, k = min(fits, key=lambda f: np.sum((a[:, f[1]] * f[0] - ones) ** 2))
    return (value, 0.0) if k == 0 else (0.0, value)


def nccl_lines(output: str) -> list[str]:
    """The lines ``NCCL_DEBUG=INFO`` made NCCL write into ``output`` (a job's printed output)."""
    from parlab.lab.launch import simgpu

    lines = [line for line in output.splitlines() if "NCCL INFO" in line]
    if not lines and simgpu.active():  # no NCCL ran: the simulated GPUs' bytes went through gloo
        raise simgpu.NeedsRealGPU("NCCL's own log (NCCL_DEBUG=INFO)")
    return lines


def nccl_transports(log_text: str) -> set[str]:
    """The transports NCCL chose for its channels, read from its ``NCCL_DEBUG=INFO`` log: ``"P2P"`` (GPU
    to GPU directly: NVLink or PCIe peer-to-peer), ``"SHM"`` (through host memory), ``"NET"`` (a network).

    NCCL logs one line per channel and peer, e.g. ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read``.
    Chapter 02 and the GPU tests use it to check that ``NCCL_P2P_DISABLE=1`` really took effect.
    """
    from parlab.lab.launch import simgpu

    if not log_text and simgpu.active():  # no NCCL ran: the simulated GPUs' bytes went through gloo
        raise simgpu.NeedsRealGPU("NCCL's own log (NCCL_DEBUG=INFO)")
    return set(re.findall(r"Channel \S+ : .*? via (\w+)", log_text))
