"""Chapter 09's exercise: find the bug from the evidence. Given each rank's records of the collectives it
issued (a flight recorder's, as chapter 09's ``debug.log_on_rank0_loop`` writes them), name the first
sequence number at which the ranks' records diverge and the rank that took another path there.

The check calls the learner's ``culprit(records)`` on a few fixed hangs (the chapter's own among them) and on
fresh ones drawn for each call: a rank that issues an extra collective, one that skips one, one whose
collective carries another size. Each wrong answer gets a hint naming the usual mistake: the rank whose
record stops earliest (an innocent one: it stopped because it was waiting), the last difference instead of
the first, the op compared without its size."""

from __future__ import annotations

import collections
import random
import sys

from parlab.course.exercises.core import ExerciseFailed, Passed, _call, _name, without
from parlab.lab.job import debug

GRADIENTS = 72  # elements of the gradient all-reduce in the chapter's loop


def _rec(seq, what, numel, op="all_reduce"):
    return {"seq": seq, "op": op, "numel": numel, "what": what}


def _key(r):
    return None if r is None else (r["op"], r["numel"], r["what"])


def reference_culprit(records: list[list[dict]]) -> tuple[int, int]:
    """(the first sequence number at which the ranks' records differ, the rank whose record there differs from
    the most common one); a missing record (the rank's record ended) counts as one kind of record."""
    for seq in range(max(len(r) for r in records)):
        keys = [_key(r[seq]) if seq < len(r) else None for r in records]
        if len(set(keys)) > 1:
            common = collections.Counter(keys).most_common(1)[0][0]
            return seq, next(rank for rank, k in enumerate(keys) if k != common)
    raise ValueError("the ranks' records never diverge")


def _hang(world: int, culprit: int, at: int, kind: str, rng: random.Random) -> list[list[dict]]:
    """Records of a loop of gradient all-reduces (and an all_gather every third step) in which ``culprit``
    goes its own way at sequence number ``at``: an extra collective, a skipped one, or another size."""
    at = 3 * (at // 3) if kind == "skip" else at  # a skipped op is visible only where the next one differs
    plan = [("gradients", GRADIENTS, "all_reduce") if s % 3 else ("metrics", 4, "all_gather") for s in range(at + 4)]
    out = []
    for rank in range(world):
        ops = list(plan)
        if rank == culprit:
            if kind == "extra":
                ops.insert(at, ("loss for the log", 1, "all_reduce"))
            elif kind == "skip":  # skips the step's all_gather (rank-dependent logging, say)
                ops.pop(at)
            else:  # "size": the same op on another size (a batch not divisible, a padded last shard)
                what, numel, op = ops[at]
                ops[at] = (what, numel + rng.randint(1, 9), op)
        # a rank's record ends at its first unmatched collective (it waits there), or a little after
        stop = at + 1 + (rng.randint(1, 2) if rank == culprit and kind == "extra" else 0)
        out.append([_rec(s, what, numel, op) for s, (what, numel, op) in enumerate(ops[:stop])])
    return out


def _chapter_hang() -> list[list[dict]]:
    """The chapter's loop on 3 ranks: rank 0 all-reduces the loss after each step's gradients."""
    grads = [_rec(0, "gradients", GRADIENTS), _rec(1, "gradients", GRADIENTS)]
    return [[grads[0], _rec(1, "loss for the log", 1)], list(grads), list(grads)]


def _cases(rng: random.Random):
    yield _chapter_hang()
    yield _hang(4, 3, 2, "extra", rng)  # the culprit's record is the longest: "stops earliest" is wrong
    yield _hang(3, 1, 4, "size", rng)  # same op and what, another size
    for kind in ("extra", "skip", "size", "extra"):
        world = rng.randint(3, 6)
        yield _hang(world, rng.randrange(world), rng.randint(1, 6), kind, rng)


def _hint(got, want, records) -> str:
    seq, rank = want
    same_ops = all(len({(r[s]["op"], r[s]["what"]) if s < len(r) else None for r in records}) == 1
                   for s in range(seq + 1))
    if same_ops and (got is None or got[0] != seq):
        return (f"at #{seq} every rank issued {records[0][seq]['op']} of '{records[0][seq]['what']}', but rank "
                f"{rank}'s carries {records[rank][seq]['numel']} elements: compare the size too")
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) for v in got)):
        return f"return a tuple (sequence number, rank) of two ints; got {got!r:.60}"
    shortest = min(range(len(records)), key=lambda r: len(records[r]))
    if got[1] == shortest and got[1] != rank:
        return (f"you named rank {got[1]}, whose record stops earliest. A rank's record stops where it waits for "
                f"the others: that rank is stuck, not wrong. Name the rank whose record at the divergence "
                f"differs from the others'")
    if got[0] != seq:
        if got[0] > seq:
            return f"the records first differ at #{seq}, you returned #{got[0]}: the first difference is the evidence"
        return f"the records are still equal at #{got[0]}; they first differ at #{seq}"
    return (f"right place (#{seq}), wrong rank: rank {rank}'s record there differs from the most common one; "
            f"rank {got[1]}'s is like the others'")


def check_culprit(fn, seed: int | None = None) -> Passed:
    """Chapter 09's exercise: ``fn(records)`` → ``(seq, rank)``: where the ranks' records first diverge and
    the rank whose record there differs from the others'."""
    if not callable(fn):
        raise TypeError(f"fn must be the function you wrote; got {type(fn).__name__}")
    rng = random.Random(seed)
    cases = list(_cases(rng))
    for records in cases:
        want = reference_culprit(records)
        why = "this exercise asks you to find the divergence yourself; the chapter's own functions are refused"
        with without(debug, ["divergence"], why), without(sys.modules[__name__], ["reference_culprit"], why):
            got = _call(fn, [list(r) for r in records])
        if got != want:
            shown = "\n".join(f"  rank {r}: " + ", ".join(f"#{x['seq']} {x['op']}({x['numel']}, {x['what']})"
                                                         for x in recs) for r, recs in enumerate(records))
            raise ExerciseFailed(f"{_name(fn)} on these records:\n{shown}\nreturned {got!r}, expected {want!r}: "
                                 f"{_hint(got, want, records)}")
    return Passed(f"{_name(fn)} names where the records diverge and who took another path, in {len(cases)} hangs")
