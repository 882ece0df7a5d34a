"""Checks for the learner's exercises: run their function (on N ranks) beside a reference, and say
exactly what differs — which rank, which element, expected against got (every chapter's Exercises).

Each check returns a :class:`Passed` (its ``repr`` is the pass message, so a notebook cell shows it)
or raises :class:`ExerciseFailed`, an ``AssertionError`` whose message names the first difference.

- :func:`check_ranks`: the general form. ``fn(x)`` and ``reference(x)`` run on every rank of one
  launch, each on its own clone of ``make_input(rank, world_size)``; a function that returns ``None``
  is taken to have worked in place, like ``dist.all_reduce``.
- :func:`check_mean_over_ranks`: chapter 00. The mean of a tensor over all ranks, left on every rank.
- :func:`check_ring_all_reduce`: chapter 02. Against ``dist.all_reduce``; also that only point-to-point
  messages were used, and that each rank sent ``2(n−1)/n`` of the buffer.
- :func:`check_function`: plain (single-process) functions over a list of cases; chapter 01.
- :func:`check_average_gradients`: chapter 03. DDP's gradient averaging, with a diagnosis of the usual
  mistakes (the sum instead of the mean, no all-reduce at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

import parlab


class ExerciseFailed(AssertionError):
    """The learner's answer differs from the reference; the message says where."""


@dataclass(frozen=True)
class Passed:
    message: str

    def __repr__(self) -> str:
        return f"✅ {self.message}"


def first_difference(got, expected, atol=1e-5, rtol=1e-5) -> str | None:
    """``None`` if equal within tolerance, else a sentence naming the first differing element."""
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor of shape {tuple(expected.shape)}, got {type(got).__name__}: {got!r:.80}"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
    if got.dtype != expected.dtype:
        return f"expected dtype {expected.dtype}, got {got.dtype}"
    close = torch.isclose(got, expected, atol=atol, rtol=rtol)
    if bool(close.all()):
        return None
    bad = (~close).nonzero()
    index = tuple(int(i) for i in bad[0])
    where = index[0] if len(index) == 1 else index
    return (f"element {where}: expected {expected[index].item():g}, got {got[index].item():g} "
            f"({len(bad)} of {expected.numel()} elements differ)")


def _run_pair(fn, reference, make_input, record):
    from parlab.measure import record_comm

    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(rank, n)
    mine = x.clone()
    with record_comm() as log:
        out = fn(mine)
    got = mine if out is None else out
    theirs = x.clone()
    ref_out = reference(theirs)
    expected = theirs if ref_out is None else ref_out
    got = got.detach().cpu() if isinstance(got, torch.Tensor) else got
    return {"input": x, "got": got, "expected": expected.detach().cpu(),
            "records": log.records if record else []}


def _default_input(rank, world_size):
    # distinct per rank and per element, so a wrong sum or a misplaced chunk shows up
    return torch.arange(3 * world_size, dtype=torch.float32) + 100 * rank


def _name(fn):
    return getattr(fn, "__name__", repr(fn))


def check_ranks(fn, reference, world_size: int = 4, make_input=_default_input, timeout: float = 30,
                atol: float = 1e-5, rtol: float = 1e-5, _record: bool = False):
    """Run ``fn`` and ``reference`` on ``world_size`` ranks; pass if every rank's result matches."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote (a callable taking one tensor)")
    results = parlab.launch(_run_pair, world_size=world_size, args=(fn, reference, make_input, _record),
                            timeout=timeout, output="all", announce=False)
    for rank, r in enumerate(results):
        problem = first_difference(r["got"], r["expected"], atol, rtol)
        if problem:
            got = r["got"].tolist() if hasattr(r["got"], "tolist") else r["got"]
            raise ExerciseFailed(f"{_name(fn)} on rank {rank} of {world_size}: {problem}.\n"
                                 f"  input on rank {rank}: {r['input'].tolist()}\n"
                                 f"  expected{' ' * (len(str(rank)) + 6)}: {r['expected'].tolist()}\n"
                                 f"  got{' ' * (len(str(rank)) + 11)}: {got}")
    return results


def _mean_over_ranks(t):
    dist.all_reduce(t)
    t.div_(dist.get_world_size())


def check_mean_over_ranks(fn, world_size: int = 4, timeout: float = 30) -> Passed:
    """Chapter 00: ``fn(t)`` must leave in ``t``, on every rank, the mean of ``t`` over all ranks."""
    check_ranks(fn, _mean_over_ranks, world_size, timeout=timeout)
    return Passed(f"{_name(fn)} leaves the mean over {world_size} ranks on every rank")


def check_ring_all_reduce(fn, world_size: int = 4, numel: int | None = None, timeout: float = 30) -> Passed:
    """Chapter 02's exercise: ``fn(tensor)`` must sum ``tensor`` over all ranks like ``dist.all_reduce``,
    using only send/recv (isend/irecv), sending ``2(n−1)/n`` of the buffer per rank."""
    numel = numel or 3 * world_size

    def make_input(rank, n):
        return torch.arange(numel, dtype=torch.float32) + 100 * rank

    results = check_ranks(fn, _all_reduce, world_size, make_input, timeout, _record=True)
    buffer = numel * 4
    expected_bytes = 2 * (world_size - 1) / world_size * buffer
    sent = []
    for rank, r in enumerate(results):
        others = sorted({rec.op for rec in r["records"]} - {"send", "recv"})
        if others:
            raise ExerciseFailed(f"{_name(fn)} on rank {rank} called {', '.join(others)}: the exercise is to "
                                 f"build all-reduce from point-to-point messages (send/recv, isend/irecv)")
        sent.append(sum(rec.bytes for rec in r["records"] if rec.op == "send"))
    mean_sent = sum(sent) / world_size
    # chunks may differ by one element when numel % n != 0, so compare the mean over ranks
    if not math.isclose(mean_sent, expected_bytes, rel_tol=0.01):
        raise ExerciseFailed(f"{_name(fn)} gives the right sums but ranks sent {sent} bytes "
                             f"(mean {mean_sent:g}); a ring sends 2(n−1)/n × {buffer} = {expected_bytes:g} "
                             f"bytes per rank")
    return Passed(f"{_name(fn)} matches dist.all_reduce on {world_size} ranks; each rank sent "
                  f"{mean_sent:g} bytes = 2(n−1)/n × {buffer}-byte buffer")


def _all_reduce(t):
    dist.all_reduce(t)


def check_function(fn, reference, cases, rel: float = 0.01) -> Passed:
    """Compare ``fn(**case)`` with ``reference(**case)`` (numbers) for each dict in ``cases``."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote")
    for case in cases:
        expected, got = reference(**case), fn(**case)
        if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=rel):
            args = ", ".join(f"{k}={v!r}" for k, v in case.items())
            raise ExerciseFailed(f"{_name(fn)}({args}): expected {expected:.4g}, got {got!r:.12}")
    return Passed(f"{_name(fn)} agrees with the reference on all {len(cases)} cases")


def _zero_reference(num_params, n_d, stage, k=12):
    from parlab.measure import estimate_memory

    optimizer = {12: "adam", 8: "momentum", 4: "sgd"}[k]  # K = fp32 master (4) + optimizer state
    return estimate_memory(num_params=int(num_params), precision="bf16", optimizer=optimizer,
                           world_size=n_d, zero_stage=stage).total / 1e9


def check_zero_memory(fn) -> Passed:
    """Chapter 01's exercise: ``fn(num_params, n_d, stage, k=12)`` → GB of model states per GPU under
    ZeRO stage 0–3 with mixed precision (2 + 2 + K bytes per parameter), checked over the ZeRO paper's
    grid (Rajbhandari et al. 2020, Table 1) and K = 4, 8."""
    cases = [dict(num_params=psi, n_d=nd, stage=s) for psi in (7.5e9, 128e9) for nd in (1, 4, 64)
             for s in range(4)]
    cases += [dict(num_params=7.5e9, n_d=16, stage=s, k=k) for s in range(4) for k in (4, 8)]
    return check_function(fn, _zero_reference, cases)


# -- chapter 03: averaging gradients, DDP's step ------------------------------------------------------


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
    per_rank = parlab.launch(_average_gradients_on_rank, world_size=world_size, args=(fn,), announce=False, output="all")
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
