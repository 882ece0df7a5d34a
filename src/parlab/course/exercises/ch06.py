"""Chapter 06's exercises: pipeline schedules, their bubble and their memory, checked against the package's
schedules (``parlab.lab.parallel.pipeline_schedule``) over many settings, naming the first difference; and two
"think" questions, checked by the simulator's numbers and a choice (what messages cost, how far to
interleave)."""

from __future__ import annotations

from fractions import Fraction

from parlab.course.exercises.core import ExerciseFailed, Passed, _call, _name, call_in_order, check_choice, refusing
from parlab.lab.language import say


def check_one_f_one_b_order(fn) -> Passed:
    """``fn(stage, num_stages, num_micro_batches)`` → the operations that stage runs in one step of 1F1B, in
    order, as names: ``["F0", "F1", "B0", ...]``. Checked for every stage of 1 to 6 stages and 1 to 9
    micro-batches, fewer micro-batches than stages included, and of three settings drawn anew at every call
    (7 to 12 stages, 1 to 24 micro-batches)."""
    import random

    from parlab.lab.parallel import pipeline_schedule as ps

    draw = random.Random()  # and settings new at every call: a table of the fixed grid's orders fails
    settings = [(p, m) for p in range(1, 7) for m in range(1, 10)]
    settings += [(draw.randrange(7, 13), draw.randrange(1, 25)) for _ in range(3)]
    for p, m in settings:
        schedule = ps.one_f_one_b(p, m)
        for stage in range(p):
            expected = schedule.names(stage)
            with refusing("ch06.1", say("the exercise asks for 1F1B's order written out, without "
                                        "parlab.lab.parallel.pipeline_schedule's schedules: count the warm-up "
                                        "forwards first")):
                got = _call(fn, stage, p, m)  # by position: fn(stage, num_stages, num_micro_batches)
            got_list = list(got) if isinstance(got, (list, tuple)) else got
            if got_list != expected:
                where = (say("stage {stage} of {p}, {m} micro-batches", stage=stage, p=p, m=m) if m > 1
                         else say("stage {stage} of {p}, {m} micro-batch", stage=stage, p=p, m=m))
                if not isinstance(got_list, list):
                    raise ExerciseFailed(say("{fn}({where}): expected a list of names like 'F0', got {got!r:.80}",
                                             fn=_name(fn), where=where, got=got))
                i = next((i for i, (a, b) in enumerate(zip(got_list, expected)) if a != b),
                         min(len(got_list), len(expected)))
                said = repr(got_list[i]) if i < len(got_list) else say("nothing (the list ends)")
                wanted = repr(expected[i]) if i < len(expected) else say("nothing (the list should end)")
                raise ExerciseFailed(say("{fn} for {where}: operation {i} should be {wanted}, got {said} "
                                         "(yours: {yours})", fn=_name(fn), where=where, i=i, wanted=wanted,
                                         said=said, yours=' '.join(map(str, got_list))))
    return Passed(say("{fn} gives 1F1B's order for every stage of 1–6 stages and 1–9 micro-batches, and of "
                      "3 settings drawn anew ({drawn})", fn=_name(fn),
                      drawn=', '.join(f'p={p}, m={m}' for p, m in settings[-3:])))


def _smallest_m(p, target, v=1):
    # exact arithmetic: (p−1)/(v·m+p−1) ≤ target, with target taken as the float it is
    t = Fraction(target)
    m = 1
    while Fraction(p - 1, v * m + p - 1) > t:
        m += 1
    return m


def _smallest_m_for(bubble, t):
    """The smallest m ≥ 1 whose ``bubble(m)`` (a Fraction) is at most ``t``; None past 10⁶."""
    return next((m for m in range(1, 10**6) if bubble(m) <= t), None)


def _smallest_m_mistake(got, p, target, v, expected) -> str:
    """The hint naming the mistake ``got`` makes, when it is one a learner makes, else ''. Where two
    mistakes give the same m, both are named."""
    if isinstance(got, bool) or not isinstance(got, int):
        return say(" (return a whole number of micro-batches, an int)")
    if got <= 0:
        if p == 1:
            return say(" (m={got} is no step at all: a step runs at least one micro-batch, so m ≥ 1; with p=1 "
                       "there is no bubble, and m=1 meets any target)", got=got)
        return say(" (m={got} is no step at all: a step runs at least one micro-batch, so m ≥ 1; start counting "
                   "at 1)", got=got)
    t = Fraction(target)
    mistakes = []
    if abs(Fraction(p - 1, v * expected + p - 1) - t) < Fraction(1, 10**12):
        mistakes.append((expected + 1, say("at m={expected} the bubble equals the target, and 'at most' includes "
                                           "it: compare with ≤, exactly (with fractions.Fraction or integers), not "
                                           "through floating point", expected=expected)))
    mistakes += [
        (_smallest_m_for(lambda m: Fraction(p - 1, v * m), t),
         say("that is the m for (p − 1)/(v·m) ≤ target, the Playbook's and Megatron's bubble, relative to the "
             "ideal step; this exercise's is the idle share of the step, (p − 1)/(v·m + p − 1)")),
        (_smallest_m(p, target, 1), say("that is the m for v=1: with v={v} stages per rank the bubble is "
                                        "(p − 1)/(v·m + p − 1)", v=v)),
        (expected - 1, say("with m={got} the bubble is still above the target: the smallest m whose bubble is at "
                           "most the target", got=got)),
    ]
    named = [hint for value, hint in mistakes if value is not None and value != expected and got == value]
    return say(" ({hints})", hints=say("; or ").join(named)) if named else ""


def check_smallest_micro_batches(fn) -> Passed:
    """``fn(p, target, v=1)`` → the smallest number of micro-batches m ≥ 1 whose bubble,
    (p − 1)/(v·m + p − 1), is at most ``target`` (a fraction of the step, e.g. 0.1). Includes targets met
    exactly, where rounding in floating point gives the wrong m. A wrong answer that a known mistake gives
    is named: m = 0, the Playbook's bubble (p − 1)/(v·m), v forgotten, one too few, '<' or rounding."""
    cases = [dict(p=p, target=t) for p in (1, 2, 4, 5, 8, 16) for t in (0.5, 0.25, 0.2, 0.1, 0.05)]
    cases += [dict(p=p, target=t, v=v) for p in (4, 8) for t in (0.2, 0.1) for v in (2, 3)]
    for case in cases:
        expected = _smallest_m(**case)
        with refusing("ch06.2", say("the exercise asks for the bubble's inequality solved yourself, not the "
                                    "check's own answer")):
            got = call_in_order(fn, _smallest_m, case)
        if got != expected:
            args = ", ".join(f"{k}={v!r}" for k, v in case.items())
            p, v = case["p"], case.get("v", 1)
            numbers = ""
            if isinstance(got, int) and not isinstance(got, bool) and got >= 1:
                numbers = say(" (with m={got} the bubble is {yours:.4f}; with m={expected}, {right:.4f})", got=got,
                              yours=(p - 1) / (v * got + p - 1), expected=expected,
                              right=(p - 1) / (v * expected + p - 1))
            hint = _smallest_m_mistake(got, p, case["target"], v, expected)
            raise ExerciseFailed(say("{fn}({args}): expected {expected}, got {got!r:.40}{numbers}{hint}",
                                     fn=_name(fn), args=args, expected=expected, got=got, numbers=numbers,
                                     hint=hint))
    return Passed(say("{fn} finds the smallest m in all {count} cases", fn=_name(fn), count=len(cases)))


def _peak(ops):
    from parlab.lab.parallel.pipeline_schedule import Op, Schedule, in_flight

    parsed = [Op.parse(name, stage=0) for name in ops]
    m = 1 + max(op.micro_batch for op in parsed)
    return max(in_flight(Schedule("yours", 1, m, 1, [parsed]), 0), default=0)


def _held_peak(ops, frees) -> int:
    """The most micro-batches held at once when a forward holds one and each op of a kind in ``frees`` frees one."""
    held = most = 0
    for name in ops:
        held += name[0] == "F"
        held -= name[0] in frees
        most = max(most, held)
    return most


def _peak_mistake(got, ops, expected) -> str:
    """The hint naming the mistake ``got`` makes, when it is one a learner makes, else ''."""
    if isinstance(got, bool) or not isinstance(got, int):
        return say(" (return a whole number of micro-batches, an int)")
    mistakes = [
        (_held_peak(ops, "BI"), say(" (I frees nothing: the weight gradient W still needs the stage's saved inputs, "
                                    "so a split backward frees its micro-batch's activations at W)")),
        (_held_peak(ops, "BIW"), say(" (I and W are two halves of one backward: they free the activations once, "
                                     "at W)")),
        (_held_peak(ops, "B"), say(" (a split backward frees too: at its W, once both halves have run)")),
        (sum(name[0] == "F" for name in ops), say(" (that counts every forward the stage runs: a backward frees "
                                                  "its micro-batch's activations, so count what is held at once)")),
    ]
    for value, hint in mistakes:
        if value != expected and got == value:
            return hint
    return ""


def check_peak_activations(fn) -> Passed:
    """``fn(ops)`` → the most micro-batches whose activations a stage holds at once while it runs ``ops``
    (names in order, e.g. ``["F0", "F1", "B0", ...]``), where a split backward ``I3``, ``W3`` frees
    micro-batch 3's activations only with its ``W`` (the weight gradient still needs the inputs). A wrong
    answer that a known mistake gives is named: I freeing, I and W both freeing, a split backward never
    freeing, every forward counted."""
    from parlab.lab.parallel import pipeline_schedule as ps

    cases = [ps.gpipe(4, 6).names(1), ps.one_f_one_b(4, 6).names(0), ps.one_f_one_b(4, 6).names(3),
             ["F0", "I0", "F1", "W0", "I1", "F2", "W1", "I2", "W2"],
             ["F0", "F1", "I0", "I1", "F2", "W0", "I2", "W1", "W2"],
             ["F0", "B0", "F1", "F2", "I1", "W1", "B2"]]
    for ops in cases:
        expected = _peak(ops)
        with refusing("ch06.3", say("the exercise asks you to count the activations yourself, without "
                                    "parlab.lab.parallel.pipeline_schedule's in_flight: which ops hold, which "
                                    "free?")):
            got = _call(fn, list(ops))
        if got != expected:
            raise ExerciseFailed(say("{fn}({ops}): expected {expected}, got {got!r:.40}{hint}", fn=_name(fn),
                                     ops=' '.join(ops), expected=expected, got=got,
                                     hint=_peak_mistake(got, ops, expected)))
    return Passed(say("{fn} agrees on all {count} operation lists", fn=_name(fn), count=len(cases)))


# -- think: what messages and interleaving cost (checked through the simulator's numbers) -----------------

def message_choices() -> dict:
    """Exercise 4's choices (:data:`MESSAGE_CHOICES`), in the learner's language: why a recorded bubble at
    large m exceeds the simulated one on this machine."""
    return {
        "a": say("each message costs a fixed time (chapter 02's α) while the operations shrink as m grows"),
        "b": (say("more micro-batches mean more activations to hold, and memory is slow"),
              say("1F1B holds at most p micro-batches' activations whatever m is: memory does not grow with m.")),
        "c": (say("the formula (p − 1)/(m + p − 1) is wrong for large m"),
              say("The simulator with comm=0 gives the formula exactly; what does comm=1 add to every boundary?")),
    }


def interleave_choices() -> dict:
    """Exercise 5's choices (:data:`INTERLEAVE_CHOICES`), in the learner's language: where to stop raising v."""
    return {
        "a": say("when the bubble saved is smaller than the time of the extra messages (v·p − 1 boundaries per "
                 "micro-batch)"),
        "b": (say("never: a larger v always gives a shorter step"),
              say("The bubble shrinks with v, but each micro-batch crosses v·p − 1 boundaries: what do they cost?")),
        "c": (say("at v = 2, because PyTorch supports no more"),
              say("PyTorch's ScheduleInterleaved1F1B takes any number of stages per rank.")),
    }


#: ``MESSAGE_CHOICES`` (exercise 4) and ``INTERLEAVE_CHOICES`` (exercise 5) are read when asked for, in the
#: language of the moment (``parlab.lab.language``).
_CHOICES = {"MESSAGE_CHOICES": message_choices, "INTERLEAVE_CHOICES": interleave_choices}


def __getattr__(name: str):
    if name in _CHOICES:
        return _CHOICES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _near(what, got, want, tol=0.005):
    if not isinstance(got, (int, float)) or abs(got - want) > tol:
        raise ExerciseFailed(say("{what}: {got!r:.40} is not what the simulator gives (within {tol}); run "
                                 "ps.simulate with those settings and read ps.bubble_fraction", what=what, got=got,
                                 tol=tol))


def check_message_cost(bubble_comm_1: float, why: str) -> Passed:
    """Exercise 4: the simulated bubble of 1F1B at p = 4, m = 8, F = 1, B = 2 when every message between ranks
    takes as long as a forward (``comm=1``), and the letter of :data:`MESSAGE_CHOICES` that answers why."""
    from parlab.lab.parallel import pipeline_schedule as ps

    _near(say("the bubble with comm=1"), bubble_comm_1,
          ps.bubble_fraction(ps.simulate(ps.one_f_one_b(4, 8), comm=1)))
    check_choice(say("why"), why, message_choices(), "a")
    return Passed(say("messages that cost a forward each: the simulated bubble, and why small micro-batches pay"))


def check_interleave_tradeoff(bubble_v2: float, bubble_v4: float, peak_v2: int, peak_v4: int, stop: str) -> Passed:
    """Exercise 5: interleaved 1F1B at p = 4, m = 8 with v = 2 and v = 4: the simulated bubbles, rank 0's peak
    of (stage, micro-batch) activations held (each 1/v of a rank's layers), and where to stop
    (:data:`INTERLEAVE_CHOICES`)."""
    from parlab.lab.parallel import pipeline_schedule as ps

    for v, bubble, peak in ((2, bubble_v2, peak_v2), (4, bubble_v4, peak_v4)):
        schedule = ps.interleaved_1f1b(4, 8, v)
        _near(say("the bubble at v={v}", v=v), bubble, ps.bubble_fraction(ps.simulate(schedule)))
        if peak != ps.peak_in_flight(schedule)[0]:
            raise ExerciseFailed(say("rank 0's peak at v={v}: {peak!r:.20} is not the simulator's (the widget "
                                     "prints it)", v=v, peak=peak))
    check_choice(say("where to stop"), stop, interleave_choices(), "a")
    return Passed(say("interleaving: the bubble shrinks with v, rank 0 holds more stages' activations, and messages "
                      "set the limit"))
