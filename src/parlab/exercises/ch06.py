"""Chapter 06's exercises: pipeline schedules, their bubble and their memory, checked against the package's
schedules (``parlab.parallel.pipeline_schedule``) over many settings, naming the first difference."""

from __future__ import annotations

from fractions import Fraction

from parlab.exercises.core import ExerciseFailed, Passed, _call, _name, without

SCHEDULE_BUILDERS = ("naive", "gpipe", "one_f_one_b", "interleaved_1f1b", "make")


def check_one_f_one_b_order(fn) -> Passed:
    """``fn(stage, num_stages, num_micro_batches)`` → the operations that stage runs in one step of 1F1B, in
    order, as names: ``["F0", "F1", "B0", ...]``. Checked for every stage of 1 to 6 stages and 1 to 9
    micro-batches, fewer micro-batches than stages included."""
    from parlab.parallel import pipeline_schedule as ps

    for p in range(1, 7):
        for m in range(1, 10):
            schedule = ps.one_f_one_b(p, m)
            for stage in range(p):
                expected = schedule.names(stage)
                with without(ps, SCHEDULE_BUILDERS, "the exercise asks for 1F1B's order written out, without "
                             "parlab.parallel.pipeline_schedule's schedules: count the warm-up forwards first"):
                    got = _call(fn, stage=stage, num_stages=p, num_micro_batches=m)
                got_list = list(got) if isinstance(got, (list, tuple)) else got
                if got_list != expected:
                    where = (f"stage {stage} of {p}, {m} micro-batch{'es' if m > 1 else ''}")
                    if not isinstance(got_list, list):
                        raise ExerciseFailed(f"{_name(fn)}({where}): expected a list of names like 'F0', got {got!r:.80}")
                    i = next((i for i, (a, b) in enumerate(zip(got_list, expected)) if a != b),
                             min(len(got_list), len(expected)))
                    said = repr(got_list[i]) if i < len(got_list) else "nothing (the list ends)"
                    wanted = repr(expected[i]) if i < len(expected) else "nothing (the list should end)"
                    raise ExerciseFailed(f"{_name(fn)} for {where}: operation {i} should be {wanted}, got {said}.\n"
                                         f"  expected: {' '.join(expected)}\n  got     : {' '.join(map(str, got_list))}")
    return Passed(f"{_name(fn)} gives 1F1B's order for every stage of 1–6 stages and 1–9 micro-batches")


def _smallest_m(p, target, v=1):
    # exact arithmetic: (p−1)/(v·m+p−1) ≤ target, with target taken as the float it is
    t = Fraction(target)
    m = 1
    while Fraction(p - 1, v * m + p - 1) > t:
        m += 1
    return m


def check_smallest_micro_batches(fn) -> Passed:
    """``fn(p, target, v=1)`` → the smallest number of micro-batches m ≥ 1 whose bubble,
    (p − 1)/(v·m + p − 1), is at most ``target`` (a fraction of the step, e.g. 0.1). Includes targets met
    exactly, where rounding in floating point gives the wrong m."""
    cases = [dict(p=p, target=t) for p in (1, 2, 4, 5, 8, 16) for t in (0.5, 0.25, 0.2, 0.1, 0.05)]
    cases += [dict(p=p, target=t, v=v) for p in (4, 8) for t in (0.2, 0.1) for v in (2, 3)]
    for case in cases:
        expected, got = _smallest_m(**case), _call(fn, **case)
        if got != expected:
            args = ", ".join(f"{k}={v!r}" for k, v in case.items())
            v = case.get("v", 1)
            hint = ""
            if isinstance(got, int) and got >= 1:
                hint = (f" (with m={got} the bubble is {(case['p'] - 1) / (v * got + case['p'] - 1):.4f}; "
                        f"with m={expected}, {(case['p'] - 1) / (v * expected + case['p'] - 1):.4f})")
            raise ExerciseFailed(f"{_name(fn)}({args}): expected {expected}, got {got!r:.40}{hint}")
    return Passed(f"{_name(fn)} finds the smallest m in all {len(cases)} cases")


def _peak(ops):
    from parlab.parallel.pipeline_schedule import Op, Schedule, in_flight

    parsed = [Op.parse(name, stage=0) for name in ops]
    m = 1 + max(op.micro_batch for op in parsed)
    return max(in_flight(Schedule("yours", 1, m, 1, [parsed]), 0), default=0)


def check_peak_activations(fn) -> Passed:
    """``fn(ops)`` → the most micro-batches whose activations a stage holds at once while it runs ``ops``
    (names in order, e.g. ``["F0", "F1", "B0", ...]``), where a split backward ``I3``, ``W3`` frees
    micro-batch 3's activations only with its ``W`` (the weight gradient still needs the inputs)."""
    from parlab.parallel import pipeline_schedule as ps

    cases = [ps.gpipe(4, 6).names(1), ps.one_f_one_b(4, 6).names(0), ps.one_f_one_b(4, 6).names(3),
             ["F0", "I0", "F1", "W0", "I1", "F2", "W1", "I2", "W2"],
             ["F0", "F1", "I0", "I1", "F2", "W0", "I2", "W1", "W2"],
             ["F0", "B0", "F1", "F2", "I1", "W1", "B2"]]
    for ops in cases:
        expected = _peak(ops)
        with without(ps, ("in_flight", "peak_in_flight"), "the exercise asks you to count the activations "
                     "yourself, without parlab.parallel.pipeline_schedule's in_flight: which ops hold, which free?"):
            got = _call(fn, ops=list(ops))
        if got != expected:
            raise ExerciseFailed(f"{_name(fn)}({' '.join(ops)}): expected {expected}, got {got!r:.40}")
    return Passed(f"{_name(fn)} agrees on all {len(cases)} operation lists")
