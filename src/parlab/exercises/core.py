"""The exercise checker every chapter uses: run the learner's function (on N ranks) beside a reference,
and say exactly what differs — which rank, which element, expected against got.

A check returns a :class:`Passed` (its ``repr`` is the pass message, so a notebook cell shows it) or raises
:class:`ExerciseFailed`, an ``AssertionError`` whose message names the first difference.

- :func:`check_ranks`: ``fn(x)`` and ``reference(x)`` run on every rank of one launch, each on its own clone
  of ``make_input(rank, world_size)``; a function that returns ``None`` is taken to have worked in place,
  like ``dist.all_reduce``.
- :func:`check_function`: plain (single-process) functions over a list of cases.
- :func:`first_difference`: the sentence that names the first differing element of two tensors.
- :func:`answer_of` and :func:`refusing`: the one refusal. ``@answer_of("ch06.1")`` marks a package function
  as the answer to an exercise; while a check runs the learner's code ``with refusing("ch06.1", why):``, the
  marked function object itself fails the check, however the learner reached it (see below).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import threading
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


def _run_pair(fn, reference, make_input, record, refuse):
    from parlab.measure import record_comm

    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(rank, n)
    theirs = x.clone()
    ref_out = reference(theirs)
    expected = theirs if ref_out is None else ref_out
    mine = x.clone()
    with _refusing_if(refuse), record_comm() as log:
        out = fn(mine)
    got = mine if out is None else out
    got = got.detach().cpu() if isinstance(got, torch.Tensor) else got
    return {"input": x, "got": got, "expected": expected.detach().cpu(),
            "records": log.records if record else []}


def _refusing_if(refuse):
    """``refusing(*refuse)``, or nothing when ``refuse`` is ``None``: (exercise, why) travels to the ranks."""
    return refusing(*refuse) if refuse else contextlib.nullcontext()


def _default_input(rank, world_size):
    # distinct per rank and per element, so a wrong sum or a misplaced chunk shows up
    return torch.arange(3 * world_size, dtype=torch.float32) + 100 * rank


def _name(fn):
    return getattr(fn, "__name__", repr(fn))


def _call(fn, **kwargs):
    """``fn(**kwargs)``; a learner's function still raising ``NotImplementedError``, or one whose parameters
    are not the names the check passes, fails the check, saying so."""
    try:
        signature = inspect.signature(fn)
        signature.bind(**kwargs)
    except TypeError:
        raise ExerciseFailed(f"{_name(fn)}{signature} cannot be called as {_name(fn)}("
                             f"{', '.join(f'{k}=…' for k in kwargs)}), as the check calls it: keep the parameter "
                             f"names the exercise gives") from None
    except ValueError:  # no signature to read (a builtin): let the call say what is wrong
        pass
    try:
        return fn(**kwargs)
    except NotImplementedError:
        raise ExerciseFailed(f"{_name(fn)} is not written yet (it raises NotImplementedError)") from None


# -- the one refusal ---------------------------------------------------------------------------------------------
#
# An exercise that asks for something the package already has must not be passed by calling the package. The
# refusal lives in the answer's function object (the wrapper ``answer_of`` returns), so every way of reaching
# that object is refused alike: an alias bound before the check (``from m import f as g``), a default argument,
# ``functools.partial``, a dict or list holding it, a re-export, a copy of a class's ``__dict__``, a method
# called through its instance, and ``importlib.reload`` (which decorates the fresh function again).
#
# Which exercises are being checked is process-wide state, not a ``ContextVar``: a thread or an executor the
# learner starts begins with an empty context and would escape a context variable, never a global. Checks run
# the learner's code on ranks in other processes (``parlab.launch``), so the check enters ``refusing`` inside
# the function it launches, on every rank. ``reload`` of this module keeps the state (its globals survive).

#: exercise -> why its answers are refused, for the checks running now (a check may nest in another)
_REFUSED: dict = globals().get("_REFUSED", {})
_LOCK = globals().get("_LOCK") or threading.Lock()
#: exercise -> the qualified names of the functions marked as its answer (what ``refused_answers`` reports)
_ANSWERS: dict = globals().get("_ANSWERS", {})


def answer_of(*exercises: str):
    """Mark a package function as the answer to ``exercises`` (ids like ``"ch06.1"``): while a check for one
    of them runs (:func:`refusing`), calling it fails the check. Outside a check it is the function itself,
    its source and signature unchanged (``inspect`` follows ``__wrapped__``)."""
    def mark(fn):
        label = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def answer(*args, **kwargs):
            if _REFUSED:
                for exercise in exercises:
                    if exercise in _REFUSED:
                        raise ExerciseFailed(f"{label} is the package's answer to this exercise: "
                                             f"{_REFUSED[exercise]}")
            return fn(*args, **kwargs)

        answer.__answer_of__ = exercises
        for exercise in exercises:
            names = _ANSWERS.setdefault(exercise, [])
            if label not in names:
                names.append(label)
        return answer
    return mark


def refused_answers(exercise: str) -> list[str]:
    """The qualified names of the package functions marked as ``exercise``'s answer (imported so far)."""
    return list(_ANSWERS.get(exercise, ()))


@contextlib.contextmanager
def refusing(exercise: str, why: str):
    """Run the body with every function marked ``@answer_of(exercise)`` failing the check, saying ``why``.
    The check computes its expected values before entering it; enter it on the ranks, inside the function a
    check launches, for the learner's code that runs there."""
    with _LOCK:
        kept = _REFUSED.get(exercise)
        _REFUSED[exercise] = why
    try:
        yield
    finally:
        with _LOCK:
            if kept is None:
                _REFUSED.pop(exercise, None)
            else:
                _REFUSED[exercise] = kept


@contextlib.contextmanager
def without(owner, names, why: str):
    """Chapter 07's and 08's older refusal, kept until they move to :func:`answer_of`: ``owner.<name>`` for
    each of ``names`` is replaced while the body runs, so only lookups through ``owner`` at call time fail.
    A marked answer among them is refused as an object instead, and left in place: a module first imported
    inside the body (``from m import f``) would otherwise keep the replacement for good."""
    def refuse(*args, **kwargs):
        raise ExerciseFailed(why)

    found = {name: getattr(owner, name) for name in names}
    marks = {e for value in found.values() for e in getattr(value, "__answer_of__", ())}
    kept = {name: value for name, value in found.items() if not hasattr(value, "__answer_of__")}
    with contextlib.ExitStack() as stack:
        for exercise in sorted(marks):
            stack.enter_context(refusing(exercise, why))
        try:
            for name in kept:
                setattr(owner, name, refuse)
            yield
        finally:
            for name, value in kept.items():
                setattr(owner, name, value)


def check_choice(what: str, letter, choices: dict, right: str) -> Passed:
    """A "think" question answered by a key of ``choices``: fails, naming ``what``, unless ``letter`` is
    ``right``. A choice's value is its text, or ``(text, feedback)``: a wrong answer then hears why it is
    wrong (its feedback), never which one is right; every wrong choice must have feedback."""
    missing = [key for key, value in choices.items() if key != right and not isinstance(value, tuple)]
    if missing:
        raise ValueError(f"{what}: wrong choices {missing} need (text, feedback): a learner who picks one hears why")
    if letter not in choices:
        raise ExerciseFailed(f"{what}: {letter!r} is not one of {sorted(choices)}")
    text, feedback = choices[letter] if isinstance(choices[letter], tuple) else (choices[letter], "")
    if letter != right:
        raise ExerciseFailed(f"{what}: {letter!r} ({text}) is not why. {feedback}")
    return Passed(f"{what}: {text}")


def check_ranks(fn, reference, world_size: int = 4, make_input=_default_input, timeout: float = 30,
                atol: float = 1e-5, rtol: float = 1e-5, _record: bool = False, refuse: tuple | None = None):
    """Run ``fn`` and ``reference`` on ``world_size`` ranks; pass if every rank's result matches. ``refuse``:
    ``(exercise, why)``, the answers :func:`refusing` refuses while ``fn`` runs on each rank."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote (a callable taking one tensor)")
    results = parlab.launch(_run_pair, world_size=world_size, args=(fn, reference, make_input, _record, refuse),
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


def check_function(fn, reference, cases, rel: float = 0.01, refuse: tuple | None = None) -> Passed:
    """Compare ``fn(**case)`` with ``reference(**case)`` (numbers) for each dict in ``cases``; ``refuse``:
    ``(exercise, why)``, refused while ``fn`` runs (the reference runs first, outside)."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote")
    for case in cases:
        expected = reference(**case)
        with _refusing_if(refuse):
            got = fn(**case)
        if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=rel):
            args = ", ".join(f"{k}={v!r}" for k, v in case.items())
            raise ExerciseFailed(f"{_name(fn)}({args}): expected {expected:.4g}, got {got!r:.12}")
    return Passed(f"{_name(fn)} agrees with the reference on all {len(cases)} cases")
