"""Bandwidth against message size, and the α-β cost model fitted to it (chapter 02).

:func:`sweep` runs one collective at growing sizes on every rank (call it inside ``parlab.launch``) and
returns, per size, the slowest rank's mean time, the algorithm bandwidth and the bus bandwidth, by the
nccl-tests convention (see :mod:`parlab.measure.comm`). :func:`fit_alpha_beta` fits the classic
latency-bandwidth model ``T(m) = α + m·β`` (α: fixed cost per call, β: seconds per byte) to it by least
squares, weighting each point by 1/T so that small messages, where α rules, count as much as large
ones (Hockney 1994; Thakur, Rabenseifner & Gropp 2005 give the per-algorithm forms).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from parlab.measure.comm import algbw, bus_factor

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


@dataclass(frozen=True)
class BandwidthPoint:
    bytes: int
    seconds: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s


def _runner(op: str, nbytes: int, n: int, device):
    numel = max(n, nbytes // 4 // n * n)  # float32 elements, divisible by the group size
    x = torch.ones(numel, device=device)
    out = torch.empty(numel, device=device)
    shard = torch.empty(numel // n, device=device)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather_into_tensor(out, x[: numel // n]),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_to_all": lambda: dist.all_to_all_single(out, x),
    }
    return calls[op], numel * 4


def sweep(op: str = "all_reduce", sizes=(2**10, 2**14, 2**18, 2**20), iters: int = 5, warmup: int = 2,
          device=None) -> list[BandwidthPoint]:
    """Time ``op`` at each size in bytes (the nccl-tests size); run on every rank of a launch."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not swept; choose one of {', '.join(OPS)}")
    if iters < 1:
        raise ValueError(f"iters={iters!r} must be at least 1")
    n = dist.get_world_size()
    device = device or (torch.device("cuda", torch.cuda.current_device())
                        if dist.get_backend() == "nccl" else torch.device("cpu"))
    points = []
    for size in sizes:
        call, nbytes = _runner(op, int(size), n, device)
        for _ in range(warmup):
            call()
        dist.barrier()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sync()
        seconds = torch.tensor((time.perf_counter() - start) / iters)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # a collective is as slow as its slowest rank
        t = seconds.item()
        points.append(BandwidthPoint(nbytes, t, algbw(nbytes, t), algbw(nbytes, t) * bus_factor(op, n)))
    return points


def fit_alpha_beta(sizes, seconds) -> tuple[float, float]:
    """Least-squares fit of ``T = α + β·m``; returns ``(alpha_seconds, beta_seconds_per_byte)``."""
    m = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if m.shape != t.shape or m.size < 2:
        raise ValueError(f"sizes and seconds must be equally long with at least 2 points; got {m.size} "
                         f"and {t.size}")
    a = np.stack([np.ones_like(m), m], axis=1) / t[:, None]  # relative error: weight rows by 1/T
    alpha, beta = np.linalg.lstsq(a, np.ones_like(t), rcond=None)[0]
    return max(float(alpha), 0.0), max(float(beta), 0.0)
