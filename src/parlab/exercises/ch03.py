"""Chapter 03's exercise: DDP's gradient-averaging step, with a diagnosis of the usual mistakes (the sum
instead of the mean, no all-reduce at all)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import parlab
from parlab.exercises.core import ExerciseFailed, Passed


def reference_average_gradients(params) -> None:
    """The answer: sum each gradient over the ranks (all-reduce), then divide by the number of ranks."""
    n = dist.get_world_size()
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(n)


def _known_grads(rank: int, shapes) -> list[torch.Tensor]:
    """The gradients rank ``rank`` starts with: different on every rank, reproducible on any."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(s, generator=g) for s in shapes]


def _average_gradients_on_rank(fn) -> list[str]:
    from parlab.models import tiny_mlp

    rank, n = parlab.rank(), parlab.world_size()
    model = tiny_mlp(seed=0)
    names, params = zip(*model.named_parameters())
    before = [p.detach().clone() for p in params]
    shapes = [p.shape for p in params]
    mine = _known_grads(rank, shapes)
    everyone = [_known_grads(r, shapes) for r in range(n)]
    for p, g in zip(params, mine):
        p.grad = g.clone()
    try:
        fn(list(params))
    except NotImplementedError:
        return ["average_gradients is not written yet (it raises NotImplementedError)"]
    problems = []  # (parameter name, what is wrong)
    for i, (name, p) in enumerate(zip(names, params)):
        total = sum(e[i] for e in everyone)
        want = total / n
        got = p.grad
        if not torch.equal(p.detach(), before[i]):
            problems.append((name, "the parameter itself changed; only .grad should"))
        elif got is None:
            problems.append((name, ".grad is None afterwards"))
        elif got.shape != want.shape:
            problems.append((name, f".grad has shape {tuple(got.shape)}, expected {tuple(want.shape)}"))
        elif torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            continue
        elif torch.allclose(got, mine[i]):
            problems.append((name, ".grad is unchanged: this rank's gradient was not combined with the "
                                   "others (no all-reduce?)"))
        elif torch.allclose(got, total, rtol=1e-5, atol=1e-6):
            problems.append((name, f".grad holds the SUM over the {n} ranks; divide by the world size to "
                                   f"get the average"))
        elif torch.allclose(got, mine[i] / n, rtol=1e-5, atol=1e-6):
            problems.append((name, f".grad is this rank's gradient divided by {n}: it was never summed "
                                   f"with the other ranks' (an all-reduce is missing)"))
        else:
            err = (got - want).abs().max().item()
            problems.append((name, f".grad differs from the average over ranks by up to {err:.3g}"))
    # One line per distinct problem, naming the parameters it hits.
    by_text: dict[str, list[str]] = {}
    for name, text in problems:
        by_text.setdefault(text, []).append(name)
    return [f"{', '.join(ns) if len(ns) <= 3 else f'{len(ns)} of {len(names)} parameters'}: {text}"
            for text, ns in by_text.items()]


def check_average_gradients(fn, world_size: int = 2) -> Passed:
    """Chapter 03: run ``fn(params)`` on ``world_size`` ranks, each holding different, known gradients,
    and compare every ``.grad`` with the true average; a failure names each distinct problem and the
    ranks and parameters it hits (the sum instead of the mean, an unchanged gradient, ...)."""
    if not callable(fn):
        raise TypeError(f"fn must be a function average_gradients(params); got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2 (averaging needs several ranks); got {world_size!r}")
    per_rank = parlab.launch(_average_gradients_on_rank, world_size=world_size, args=(fn,), announce=False,
                             output="all")
    ranks_of: dict[str, list[int]] = {}  # the same finding on several ranks is reported once
    for r, lines in enumerate(per_rank):
        for line in lines:
            ranks_of.setdefault(line, []).append(r)
    report = [f"{'every rank' if len(rs) == world_size else 'rank ' + ', '.join(map(str, rs))}: {line}"
              for line, rs in ranks_of.items()]
    if not report:
        return Passed(f"every gradient on every one of {world_size} ranks is the average over ranks")
    shown = report[:8] + ([f"... and {len(report) - 8} more"] if len(report) > 8 else [])
    raise ExerciseFailed("average_gradients is not right yet:\n  " + "\n  ".join(shown))
