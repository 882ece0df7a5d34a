"""How a check meets the learner's function: :class:`ExerciseFailed`, the call by position in the order of the
exercise's parameters (:func:`in_order`, :func:`call_in_order`), and the one sentence for a call that raised
(:func:`_call`): which call, which exception, which line. ``parlab.course.exercises.core`` re-exports them.
"""

from __future__ import annotations

import inspect

from parlab.lab.language import say


class ExerciseFailed(AssertionError):
    """The learner's answer differs from the reference; the message says where."""


def _name(fn):
    return getattr(fn, "__name__", repr(fn))


def in_order(order, case: dict) -> tuple[tuple, dict]:
    """``case`` (parameter name -> value) as ``(args, kwargs)`` for a positional call: its values in the order
    of ``order``'s parameters (the reference function, or the parameter names of the exercise's signature),
    up to the first one ``case`` leaves out (a default); what follows that, by name. A learner's function is
    called so, not by keyword: one that renamed a parameter is checked on what it computes."""
    if callable(order):
        bound = inspect.signature(order).bind(**case)
        return bound.args, bound.kwargs
    names = list(order)
    unknown = [k for k in case if k not in names]
    if unknown:
        raise ValueError(f"in_order: case {case!r} names {unknown}, not parameters of {names}")
    args = []
    for name in names:
        if name not in case:
            break
        args.append(case[name])
    return tuple(args), {k: v for k, v in case.items() if k not in names[:len(args)]}


def call_in_order(fn, order, case: dict):
    """:func:`_call` ``fn`` with ``case``'s values in ``order`` (:func:`in_order`): ``fn(80, 4, 2)`` for
    ``case = {"gpu_gb": 80, "n_d": 4, "stage": 2}`` and a reference ``(gpu_gb, n_d, stage, k=12)``."""
    args, kwargs = in_order(order, case)
    return _call(fn, *args, **kwargs)


def shown_call(fn, *args, **kwargs) -> str:
    """``fn(*args, **kwargs)`` as text, each value's repr cut at 60 characters: the call a check made."""
    shown = ", ".join([*(f"{a!r:.60}" for a in args), *(f"{k}={v!r:.60}" for k, v in kwargs.items())])
    return f"{_name(fn)}({shown})"


def _call(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)``; a learner's function still raising ``NotImplementedError``, one that cannot take
    the arguments the check passes (too few or too many parameters), or one that raises (a ``ZeroDivisionError``
    in its own arithmetic) fails the check, saying so: the call it was made with, the exception, and the line
    that raised it. Checks pass a learner's arguments by position (:func:`call_in_order`), so names are free."""
    try:
        signature = inspect.signature(fn)
        signature.bind(*args, **kwargs)
    except TypeError:
        raise ExerciseFailed(say("{fn}{signature} cannot be called as {call}, as the check calls it: keep the "
                                 "parameters the exercise gives, in its order", fn=_name(fn), signature=signature,
                                 call=shown_call(fn, *args, **kwargs))) from None
    except ValueError:  # no signature to read (a builtin): let the call say what is wrong
        pass
    try:
        return fn(*args, **kwargs)
    except ExerciseFailed:  # a refusal, or the check's own code called from the learner's: already precise
        raise
    except NotImplementedError:
        raise ExerciseFailed(say("{fn} is not written yet (it raises NotImplementedError)", fn=_name(fn))) from None
    except Exception as error:  # noqa: BLE001 - any error in the learner's code becomes the check's message
        failure = ExerciseFailed(_raised(fn, error, *args, **kwargs))
        failure.raised = error  # a check may add a hint for the error it recognises
        raise failure from None


def _raised(fn, error: BaseException, *args, **kwargs) -> str:
    """The sentence for ``fn(*args, **kwargs)`` having raised ``error``: the call, the exception, and the line
    that raised it (the innermost frame, and the learner's own line when that is elsewhere), not the whole
    traceback."""
    import traceback

    text = say("{call} raised {error_type}: {error}", call=shown_call(fn, *args, **kwargs),
               error_type=type(error).__name__, error=error)
    frames = traceback.extract_tb(error.__traceback__)
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    own = [f for f in frames if code is not None and f.filename == code.co_filename and f.name == code.co_name]
    shown_frames = own[-1:]  # the learner's own line that raised, or led to what raised
    if frames and not (own and frames[-1] is own[-1]):
        shown_frames.append(frames[-1])  # and where it was raised, when that is further in
    for frame in shown_frames:
        line = (frame.line or "").strip()
        text += "\n" + (say("  at line {lineno} of {function}: {line}", lineno=frame.lineno, function=frame.name,
                             line=line) if line else
                         say("  at line {lineno} of {function}", lineno=frame.lineno, function=frame.name))
    return text
