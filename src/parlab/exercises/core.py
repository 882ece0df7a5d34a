"""The exercise checker every chapter uses: run the learner's function (on N ranks) beside a reference,
and say exactly what differs — which rank, which element, expected against got.

A check returns a :class:`Passed` (its ``repr`` is the pass message, so a notebook cell shows it) or raises
:class:`ExerciseFailed`, an ``AssertionError`` whose message names the first difference.

- :func:`check_ranks`: ``fn(x)`` and ``reference(x)`` run on every rank of one launch, each on its own clone
  of ``make_input(rank, world_size)``; a function that returns ``None`` is taken to have worked in place,
  like ``dist.all_reduce``.
- :func:`check_function`: plain (single-process) functions over a list of cases.
- :func:`first_difference`: the sentence that names the first differing element of two tensors.
"""

from __future__ import annotations

import contextlib
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


def _call(fn, **kwargs):
    """``fn(**kwargs)``; a learner's function still raising ``NotImplementedError`` fails the check, saying so."""
    try:
        return fn(**kwargs)
    except NotImplementedError:
        raise ExerciseFailed(f"{_name(fn)} is not written yet (it raises NotImplementedError)") from None


@contextlib.contextmanager
def without(owner, names, why: str):
    """While a learner's function runs, ``owner.<name>`` for each of ``names`` fails the check, saying
    ``why``: an exercise that asks for something the package already has cannot be passed by calling it."""
    def refuse(*args, **kwargs):
        raise ExerciseFailed(why)

    kept = {name: getattr(owner, name) for name in names}
    try:
        for name in names:
            setattr(owner, name, refuse)
        yield
    finally:
        for name, value in kept.items():
            setattr(owner, name, value)


def check_choice(what: str, letter, choices: dict, right: str) -> Passed:
    """A "think" question answered by a key of ``choices``: fails, naming ``what``, unless ``letter`` is
    ``right``. A choice's value is its text, or ``(text, feedback)``: a wrong answer then hears why it is
    wrong (its feedback), never which one is right."""
    if letter not in choices:
        raise ExerciseFailed(f"{what}: {letter!r} is not one of {sorted(choices)}")
    text, feedback = choices[letter] if isinstance(choices[letter], tuple) else (choices[letter], "")
    if letter != right:
        raise ExerciseFailed(f"{what}: {letter!r} ({text}) is not why; " + (feedback or "think again"))
    return Passed(f"{what}: {text}")


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
