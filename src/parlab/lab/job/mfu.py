"""How much of the machine a step used: FLOPs counted, FLOPs by formula, MFU and HFU (chapter 09).

Chapter 09's section 5 runs ``FlopCounterMode`` in a cell the learner reads, forward and backward apart, and
does the step-time arithmetic there: MFU = (FLOPs / step time) / peak FLOP/s. What is here serves that cell
(:func:`step_seconds`, :func:`matmul_peak`) and its Under the hood (:func:`count_flops`, :func:`narayanan_flops`,
:func:`utilization`).

- :func:`count_flops` runs a function under ``torch.utils.flop_counter.FlopCounterMode`` and returns the
  FLOPs of every matrix product it saw (2·m·n·k each; backward counted too). It counts only the operators
  it has a formula for: a fused attention kernel it does not know (the CPU's flash attention) counts 0.
- :func:`narayanan_flops`: a GPT layer stack's FLOPs per step, Narayanan et al. 2021 ("Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21), §5.1:
  ``72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L))`` for forward + backward, that is 6Ψ per token (Ψ ≈ 12·L·h² + V·h)
  plus attention's 12·L·s·h per token; ``96·B·s·L·h²·(1 + s/(6h) + V/(16·h·L))`` with full activation
  recomputation (one more forward of every layer).
- :func:`utilization`: MFU (model FLOPs utilisation, Chowdhery et al. 2022, "PaLM", Appendix B) is the model's
  FLOPs (no recomputation) per second over the peak; HFU (hardware FLOPs utilisation) counts what the
  hardware really computed, recomputation included, so HFU ≥ MFU.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn, *args, **kwargs) -> tuple[int, dict[str, int]]:
    """FLOPs of ``fn(*args, **kwargs)``, in all and per operator (``{"aten.mm": ...}``)."""
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops(), {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}


def narayanan_flops(batch: int, seq_len: int, layers: int, hidden: int, vocab: int,
                    recompute: bool = False) -> float:
    """FLOPs of one training step (forward + backward) of a GPT: Narayanan et al. 2021, §5.1."""
    b, s, n, h, v = batch, seq_len, layers, hidden, vocab
    if recompute:
        return 96 * b * s * n * h**2 * (1 + s / (6 * h) + v / (16 * h * n))
    return 72 * b * s * n * h**2 * (1 + s / (6 * h) + v / (12 * h * n))


def utilization(flops_per_step: float, step_seconds: float, peak_flops: float, world_size: int = 1) -> float:
    """Achieved FLOP/s over the peak of ``world_size`` devices: MFU with model FLOPs, HFU with hardware FLOPs."""
    return flops_per_step / (step_seconds * peak_flops * world_size)


def matmul_peak(n: int = 1024, repeats: int = 5, device="cpu", dtype=torch.float32) -> float:
    """FLOP/s of the fastest of ``repeats`` n × n matrix products here: a stand-in for the datasheet's peak
    where there is none (a CPU). On a GPU, prefer the datasheet (``parlab.decide.planner``'s GPUs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        if a.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ a
        if a.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def step_seconds(fn, repeats: int = 9, warmup: int = 2) -> dict:
    """Wall time of ``fn()`` (a step): ``warmup`` calls first (allocations, first-call dispatch), then the
    median, fastest and slowest of ``repeats`` calls, in seconds. On shared cores the spread is the answer's
    honesty: two steps whose ranges overlap are not told apart by this measurement."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return {"median": times[len(times) // 2], "min": times[0], "max": times[-1]}
