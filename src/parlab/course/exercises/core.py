"""The exercise checker every chapter uses: run the learner's function (on N ranks) beside a reference,
and say exactly what differs — which rank, which element, expected against got.

A check returns a :class:`Passed` (its ``repr`` is the pass message, so a notebook cell shows it) or raises
:class:`ExerciseFailed`, an ``AssertionError`` whose message names the first difference.

- :func:`check_ranks`: ``fn(x)`` and ``reference(x)`` run on every rank of one launch, each on its own clone
  of ``make_input(rank, world_size)``; a function that returns ``None`` is taken to have worked in place,
  like ``dist.all_reduce``.
- :func:`check_function`: plain (single-process) functions over a list of cases.
- :func:`first_difference`: the sentence that names the first differing element of two tensors.
- :data:`ANSWERS` and :func:`refusing`: the one refusal. ``ANSWERS["ch06.1"]`` names the package functions that
  answer an exercise; while a check runs the learner's code ``with refusing("ch06.1", why):``, their code fails
  the check, however the learner reached it (see below); ``_grading()`` (private) for the check's own code
  called from the learner's; :func:`without` refuses named functions the same way.
- :func:`record_group`: every op issued on a process group while the learner's code runs, whatever thread or
  dispatch mode issues it, each send's partner included (``CommRecord.peer``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import unicodedata
from dataclasses import dataclass

import torch
import torch.distributed as dist

import parlab
from parlab.course.exercises.calling import (ExerciseFailed, _call, _name, _raised, call_in_order,  # noqa: F401
                                             in_order, shown_call)  # re-exported: checks import them here
from parlab.course.exercises.recording import GroupLog, record_group  # noqa: F401 - re-exported: checks import them here
from parlab.lab.language import say


@dataclass(frozen=True)
class Passed:
    message: str

    def __repr__(self) -> str:
        return f"✅ {self.message}"


def first_difference(got, expected, atol=1e-5, rtol=1e-5) -> str | None:
    """``None`` if equal within tolerance, else a sentence naming the first differing element."""
    if not isinstance(got, torch.Tensor):
        return say("expected a tensor of shape {shape}, got {kind}: {got!r:.80}", shape=tuple(expected.shape),
                   kind=type(got).__name__, got=got)
    if got.shape != expected.shape:
        return say("expected shape {expected}, got shape {got}", expected=tuple(expected.shape), got=tuple(got.shape))
    if got.dtype != expected.dtype:
        return say("expected dtype {expected}, got {got}", expected=expected.dtype, got=got.dtype)
    close = torch.isclose(got, expected, atol=atol, rtol=rtol)
    if bool(close.all()):
        return None
    bad = (~close).nonzero()
    index = tuple(int(i) for i in bad[0])
    where = index[0] if len(index) == 1 else index
    return say("element {where}: expected {expected:g}, got {got:g} ({bad} of {numel} elements differ)",
               where=where, expected=expected[index].item(), got=got[index].item(), bad=len(bad),
               numel=expected.numel())


def _run_pair(fn, reference, make_input, record, refuse):
    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(rank, n)
    theirs = x.clone()
    ref_out = reference(theirs)
    expected = theirs if ref_out is None else ref_out
    mine = x.clone()
    with _refusing_if(refuse), record_group() as log:
        out = fn(mine)
    got = mine if out is None else out
    got = got.detach().cpu() if isinstance(got, torch.Tensor) else got
    return {"input": x, "got": got, "expected": expected.detach().cpu(),
            "records": log.records if record else [], "early": log.early if record else []}


def _refusing_if(refuse):
    """``refusing(*refuse)``, or nothing when ``refuse`` is ``None``: (exercise, why) travels to the ranks."""
    return refusing(*refuse) if refuse else contextlib.nullcontext()


def _default_input(rank, world_size):
    # distinct per rank and per element, so a wrong sum or a misplaced chunk shows up
    return torch.arange(3 * world_size, dtype=torch.float32) + 100 * rank


# -- the one refusal ---------------------------------------------------------------------------------------------
#
# An exercise that asks for something the package already has must not be passed by calling the package. Which
# package functions answer which exercise is declared here, in :data:`ANSWERS`, by dotted name: the product code
# carries no marker. While a check runs the learner's code (``refusing``), a profile hook (``sys.setprofile``, and
# ``threading.setprofile`` for threads started meanwhile) looks at every Python call; one whose code is an
# answer's (same file, first line and qualified name) fails the check. The code is what is refused, not a name,
# so every way of reaching it is refused alike: an alias bound before the check (``from m import f as g``), a
# default argument, ``functools.partial``, a dict or list holding it, a re-export, a copy of a class's
# ``__dict__``, a subclass, a method called through its instance, and ``importlib.reload`` (a fresh function,
# the same file, line and name).
#
# A refusal raised inside the learner's code may be caught there (``try: ... except: pass``), and the hook is
# unset on that thread when it raises (CPython does so); so every refusal is also logged, and ``refusing``
# fails the check on exit whatever the learner did with it. Which answers are refused is process-wide state,
# not a ``ContextVar``: a thread the learner starts begins with an empty context. Checks run the learner's code
# on ranks in other processes (``parlab.launch``), so a check enters ``refusing`` on every rank, inside the
# function it launches. ``reload`` of this module keeps the state (its globals survive).

#: exercise -> the dotted names (module, then attributes) of the package functions that answer it. A name that
#: does not resolve fails the check that refuses it (``tests/test_exercises.py`` resolves them all).
ANSWERS: dict[str, tuple[str, ...]] = {
    "ch01.1": ("parlab.course.exercises.ch01._measured_mlp_bytes", "parlab.course.exercises.ch01.GatedReLUMLP.forward",
               "parlab.lab.measure.memory.measure_activations", "parlab.lab.measure.activations.layer_terms",
               "parlab.lab.measure.memory.activation_bytes_per_layer", "parlab.lab.measure.memory.estimate_memory",
               "parlab.lab.measure.activation_estimate.estimate_activations"),
    "ch01.2": ("parlab.course.exercises.ch01._layer_bytes", "parlab.lab.measure.activations.layer_terms",
               "parlab.lab.measure.memory.activation_bytes_per_layer", "parlab.lab.measure.memory.estimate_memory",
               "parlab.lab.measure.memory.measure_activations", "parlab.lab.measure.activation_estimate.estimate_activations"),
    "ch01.3": ("parlab.course.exercises.ch01._max_params", "parlab.course.exercises.ch01._per_param_bytes",
               "parlab.lab.measure.memory.estimate_memory", "parlab.lab.measure.memory.activation_bytes_per_layer",
               "parlab.lab.measure.activations.layer_terms", "parlab.lab.measure.memory.measure_activations",
               "parlab.lab.measure.activation_estimate.estimate_activations"),
    "ch02.2": ("parlab.course.exercises.ch02._crossover_bytes",),
    "ch03.2": ("parlab.course.exercises.ch03._reference_buckets", "parlab.lab.measure.memory.ddp_buckets"),
    "ch04.1": ("parlab.course.exercises.ch04._reference_owner_shards",),
    "ch04.2": ("parlab.course.exercises.ch04.reference_peak_gathered",),
    "ch04.3": ("parlab.course.exercises.ch04._accumulation_volume", "parlab.decide.planner.data_parallel.predict_dp_step"),
    "ch05.1": ("parlab.lab.parallel.tensor.RowParallelLinear.forward",),
    "ch05.2": ("parlab.course.exercises.ch05._reference_tp_collectives", "parlab.course.exercises.ch05._states"),
    "ch05.3": ("parlab.course.exercises.ch05._recompute_answer",),
    "ch06.1": ("parlab.lab.parallel.pipeline_schedule.naive", "parlab.lab.parallel.pipeline_schedule.gpipe",
               "parlab.lab.parallel.pipeline_schedule.one_f_one_b",
               "parlab.lab.parallel.pipeline_schedule.interleaved_1f1b", "parlab.lab.parallel.pipeline_schedule.make"),
    "ch06.2": ("parlab.course.exercises.ch06._smallest_m",),
    "ch06.3": ("parlab.lab.parallel.pipeline_schedule.in_flight", "parlab.lab.parallel.pipeline_schedule.peak_in_flight"),
    "ch07.1": tuple(f"parlab.lab.topology.Topology.{name}"
                    for name in ("coords", "group_ranks", "groups", "rank_at", "describe")),
    "ch07.2": ("parlab.lab.measure.memory.estimate_memory", "parlab.decide.planner.step._predict"),
    "ch07.3": ("parlab.decide.planner.step._predict",),
    "ch10.1": ("parlab.lab.parallel.context.combine",),
    "ch10.2": ("parlab.lab.parallel.expert.route", "parlab.lab.parallel.expert.dispatch"),
    "ch10.3": ("parlab.lab.parallel.expert_practice.DroplessExpertParallelMoE.forward",),
}

#: (exercise, why) of the scopes open now, innermost last (a check may nest in another)
_REFUSED: list = globals().get("_REFUSED", [])
_LOCK = globals().get("_LOCK") or threading.RLock()
#: co_filename -> {(co_firstlineno, co_qualname): [(label, why), ...]}: the code refused now, innermost last
_CODES: dict = globals().get("_CODES", {})
#: every refusal raised, in order: ``refusing`` fails its check on exit if one was raised inside it
_STRUCK: list = globals().get("_STRUCK", [])
#: the profile hooks to restore when the outermost scope closes
_KEPT: list = globals().get("_KEPT", [])
_GRADING = globals().get("_GRADING") or threading.local()


def _resolve(dotted: str):
    """The object a dotted name names, walked from its top package: a submodule where one is (imported if need
    be), else an attribute (a class's own ``__dict__`` entry for a method, so a staticmethod or property is
    found as defined)."""
    import importlib
    import sys

    parts = dotted.split(".")
    obj, path = importlib.import_module(parts[0]), parts[0]
    for name in parts[1:]:
        path = f"{path}.{name}"
        if path in sys.modules:
            obj = sys.modules[path]
        elif isinstance(obj, type) and name in vars(obj):
            obj = vars(obj)[name]
        elif hasattr(obj, name):
            obj = getattr(obj, name)
        else:
            obj = importlib.import_module(path)
    return obj


def _code_of(obj):
    """The code object a function-like ``obj`` runs (through wrappers, bound methods, staticmethod, property,
    partial); ``TypeError`` if it has none."""
    for _ in range(20):
        if isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, functools.partial):
            obj = obj.func
        elif hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        elif hasattr(obj, "__func__"):
            obj = obj.__func__
        elif hasattr(obj, "__code__"):
            return obj.__code__
        else:
            break
    raise TypeError(f"{obj!r} is not a Python function: its code cannot be refused")


def refused_answers(exercise: str) -> list[str]:
    """The dotted names of the package functions that answer ``exercise`` (:data:`ANSWERS`)."""
    return list(ANSWERS.get(exercise, ()))


def _hook(frame, event, arg):
    if event != "call":
        return
    code = frame.f_code
    by_file = _CODES.get(code.co_filename)
    if by_file is None:
        return
    held = by_file.get((code.co_firstlineno, code.co_qualname))
    if held and not getattr(_GRADING, "depth", 0):
        label, why = held[-1]
        message = say("{label} is the package's answer to this exercise: {why}", label=label, why=why)
        _STRUCK.append(message)
        raise ExerciseFailed(message)


@contextlib.contextmanager
def _grading():
    """The check's own code, called from inside the learner's (a ``price`` function the learner is given):
    the answers it calls are not refused. Private, and not exported: the refusal's off switch is no part of
    what a learner is shown."""
    _GRADING.depth = getattr(_GRADING, "depth", 0) + 1
    try:
        yield
    finally:
        _GRADING.depth -= 1


def _keys(objects) -> list:
    keys = []
    for obj in objects:
        code = _code_of(obj)
        module = getattr(obj, "__module__", None) or getattr(getattr(obj, "fget", None), "__module__", "")
        keys.append((code.co_filename, (code.co_firstlineno, code.co_qualname), f"{module}.{code.co_qualname}"))
    return keys


@contextlib.contextmanager
def _refusing_objects(objects, scope, why: str):
    """The body runs with the code of every one of ``objects`` failing the check, saying ``why``."""
    import sys

    keys = _keys(objects)
    with _LOCK:
        if not _REFUSED:
            _KEPT.append((sys.getprofile(), threading.getprofile()))
        _REFUSED.append((scope, why))
        for filename, key, label in keys:
            _CODES.setdefault(filename, {}).setdefault(key, []).append((label, why))
        struck = len(_STRUCK)
        sys.setprofile(_hook)
        threading.setprofile(_hook)
    failed = None
    try:
        yield
    finally:
        with _LOCK:
            if sys.getprofile() is not _hook and len(_STRUCK) == struck:  # CPython unsets it only when it raises
                _STRUCK.append(say("the check's profile hook was replaced while your code ran (sys.setprofile): "
                                   "{why}", why=why))
            for filename, key, label in keys:
                held = _CODES[filename][key]
                held.remove((label, why))
                if not held:
                    del _CODES[filename][key]
                if not _CODES[filename]:
                    del _CODES[filename]
            _REFUSED.remove((scope, why))
            if _REFUSED:
                sys.setprofile(_hook)  # CPython unsets a hook that raised: the outer scope needs it back
            else:
                kept_sys, kept_threading = _KEPT.pop()
                sys.setprofile(kept_sys)
                threading.setprofile(kept_threading)
            if len(_STRUCK) > struck:
                failed = _STRUCK[struck]
                del _STRUCK[struck:]
        if failed is not None:  # refused, whether the learner's code caught it or not
            raise ExerciseFailed(failed) from None


def refusing(exercise: str, why: str):
    """Run the body with every function :data:`ANSWERS` lists for ``exercise`` failing the check, saying
    ``why``, however it is reached. The check computes its expected values before entering it; enter it on the
    ranks, inside the function a check launches, for the learner's code that runs there."""
    if exercise not in ANSWERS:
        raise KeyError(f"no answers are declared for exercise {exercise!r} (parlab.course.exercises.core.ANSWERS)")
    return _refusing_objects([_resolve(name) for name in ANSWERS[exercise]], exercise, why)


def without(owner, names, why: str):
    """``owner.<name>`` for each of ``names`` refused as code while the body runs (as :func:`refusing` refuses
    an exercise's answers), however the learner reached it; nothing is replaced."""
    return _refusing_objects([getattr(owner, name) for name in names], f"{getattr(owner, '__name__', owner)}",
                             why)


class later:  # noqa: N801 - read as ``later.say(...)``
    """A template marked where it is written and said where it is shown: a "think" question's choices, which
    :func:`check_choice` says in the learner's language when it shows one. ``later.say(template)`` is the
    template itself (the catalogs' test finds it, as it finds ``say``)."""

    @staticmethod
    def say(template: str) -> str:
        return template


def check_choice(what: str, letter, choices: dict, right: str) -> Passed:
    """A "think" question answered by a key of ``choices``: fails, naming ``what``, unless ``letter`` is
    ``right``. A choice's value is its text, or ``(text, feedback)``: a wrong answer then hears why it is
    wrong (its feedback), never which one is right; every wrong choice must have feedback. The texts are said
    in the learner's language (:func:`parlab.lab.language.say`: mark them ``later.say("...")``)."""
    missing = [key for key, value in choices.items() if key != right and not isinstance(value, tuple)]
    if missing:
        raise ValueError(f"{what}: wrong choices {missing} need (text, feedback): a learner who picks one hears why")
    if letter not in choices:
        raise ExerciseFailed(say("{what}: {letter!r} is not one of {choices}", what=what, letter=letter,
                                 choices=sorted(choices)))
    text, feedback = choices[letter] if isinstance(choices[letter], tuple) else (choices[letter], "")
    text, feedback = say(text), say(feedback) if feedback else feedback
    if letter != right:
        raise ExerciseFailed(say("{what}: {letter!r} ({text}) is not why. {feedback}", what=what, letter=letter,
                                 text=text, feedback=feedback))
    return Passed(say("{what}: {text}", what=what, text=text))


def _columns(text: str) -> int:
    """The columns ``text`` takes in a monospaced font: two for a wide (Chinese) character."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _aligned(rows) -> str:
    """``(label, value)`` rows, one a line under two spaces, the values aligned after the longest label."""
    width = max(_columns(label) for label, _ in rows)
    return "\n".join(say("  {label}: {value}", label=label + " " * (width - _columns(label)), value=value)
                     for label, value in rows)


def check_ranks(fn, reference, world_size: int = 4, make_input=_default_input, timeout: float = 30,
                atol: float = 1e-5, rtol: float = 1e-5, _record: bool = False, refuse: tuple | None = None):
    """Run ``fn`` and ``reference`` on ``world_size`` ranks; pass if every rank's result matches. ``refuse``:
    ``(exercise, why)``, the answers :func:`refusing` refuses while ``fn`` runs on each rank."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote (a callable taking one tensor)", fn=fn))
    results = parlab.launch(_run_pair, world_size=world_size, args=(fn, reference, make_input, _record, refuse),
                            timeout=timeout, output="all", announce=False)
    for rank, r in enumerate(results):
        problem = first_difference(r["got"], r["expected"], atol, rtol)
        if problem:
            got = r["got"].tolist() if hasattr(r["got"], "tolist") else r["got"]
            rows = [(say("input on rank {rank}", rank=rank), r["input"].tolist()),
                    (say("expected"), r["expected"].tolist()), (say("got"), got)]
            raise ExerciseFailed(say("{fn} on rank {rank} of {world_size}: {problem}.", fn=_name(fn), rank=rank,
                                     world_size=world_size, problem=problem) + "\n" + _aligned(rows))
    return results


def check_function(fn, reference, cases, rel: float = 0.01, refuse: tuple | None = None) -> Passed:
    """Compare ``fn`` with ``reference`` (numbers) on each dict in ``cases``, both called with the case's values
    by position in the order of ``reference``'s parameters (:func:`in_order`: the learner's names are theirs);
    ``refuse``: ``(exercise, why)``, refused while ``fn`` runs (the reference runs first, outside)."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    for case in cases:
        args, kwargs = in_order(reference, case)
        expected = reference(*args, **kwargs)
        with _refusing_if(refuse):
            got = _call(fn, *args, **kwargs)
        if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=rel):
            raise ExerciseFailed(say("{call}: expected {expected:.4g}, got {got!r:.12}",
                                     call=shown_call(fn, *args, **kwargs), expected=expected, got=got))
    return Passed(say("{fn} agrees with the reference on all {cases} cases", fn=_name(fn), cases=len(cases)))
