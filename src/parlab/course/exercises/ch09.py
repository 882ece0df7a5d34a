"""Chapter 09's exercises.

- :func:`check_culprit`: find the bug from the evidence. Given each rank's records of the collectives it
  issued (a flight recorder's, as chapter 09's ``debug.log_on_rank0_loop`` writes them), name the first
  sequence number at which the ranks' records diverge and the rank that took another path there. The check
  calls the learner's ``culprit(records)`` on a few fixed hangs (the chapter's own among them) and on fresh
  ones drawn for each call: a rank that issues an extra collective, one that skips one, one whose collective
  carries another size, one that leaves the loop early (its record ends at the divergence). Each wrong answer
  gets a hint naming the usual mistake: the rank whose record stops earliest (an innocent one: it stopped
  because it was waiting), the last difference instead of the first, the op compared without its size, a
  record that ended not counted as a difference.
- :func:`check_mfu`: a published run's MFU from its reported numbers (PaLM 540B, Chowdhery et al. 2022,
  Appendix B: 46.2 %) and from fresh runs drawn for each call. The hints name the usual mistakes: forward
  FLOPs only (2Ψ, not 6Ψ), one chip's peak for the whole job's tokens, attention left out, a percentage."""

from __future__ import annotations

import collections
import math
import random
import sys

from parlab.course.exercises.core import ExerciseFailed, Passed, _call, _name, without
from parlab.lab.job import debug, mfu
from parlab.lab.language import say

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
    goes its own way at sequence number ``at``: an extra collective, a skipped one, another size, or it leaves
    the loop early ("ends": its record ends at ``at``, the others' go on; a rank whose data ran out, say)."""
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
            elif kind == "ends":  # leaves the loop before #at: nothing more to record
                ops = ops[:at]
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
    yield _hang(4, 2, 5, "ends", rng)  # the culprit's record ends at the divergence: it counts as a difference
    for kind in ("extra", "skip", "size", "extra", "ends"):
        world = rng.randint(3, 6)
        yield _hang(world, rng.randrange(world), rng.randint(1, 6), kind, rng)


def _hint(got, want, records) -> str:
    seq, rank = want
    ended = [r for r, recs in enumerate(records) if len(recs) == seq]
    if ended and (not isinstance(got, tuple) or got[:1] != (seq,)):
        return say("at #{seq} rank {rank}'s record has ended while the others' go on: it left the loop early. A "
                   "record that ended counts as a different record, so the records differ at #{seq} (a loop over the "
                   "shortest record, or over the ranks that still have one, never sees it)", seq=seq, rank=ended[0])
    same_ops = all(len({(r[s]["op"], r[s]["what"]) if s < len(r) else None for r in records}) == 1
                   for s in range(seq + 1))
    if same_ops and (got is None or got[0] != seq):
        return say("at #{seq} every rank issued {op} of '{what}', but rank {rank}'s carries {numel} elements: "
                   "compare the size too", seq=seq, op=records[0][seq]['op'], what=records[0][seq]['what'],
                   rank=rank, numel=records[rank][seq]['numel'])
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) for v in got)):
        return say("return a tuple (sequence number, rank) of two ints; got {got!r:.60}", got=got)
    shortest = min(range(len(records)), key=lambda r: len(records[r]))
    if got[1] == shortest and got[1] != rank:
        return say("you named rank {named}, whose record stops earliest. A rank's record stops where it waits for "
                   "the others: that rank is stuck, not wrong. Name the rank whose record at the divergence differs "
                   "from the others'", named=got[1])
    if got[0] != seq:
        if got[0] > seq:
            return say("the records first differ at #{seq}, you returned #{got}: the first difference is the "
                       "evidence", seq=seq, got=got[0])
        return say("the records are still equal at #{got}; they first differ at #{seq}", got=got[0], seq=seq)
    return say("right place (#{seq}), wrong rank: rank {rank}'s record there differs from the most common one; "
               "rank {named}'s is like the others'", seq=seq, rank=rank, named=got[1])


def check_culprit(fn, seed: int | None = None) -> Passed:
    """Chapter 09's exercise: ``fn(records)`` → ``(seq, rank)``: where the ranks' records first diverge and
    the rank whose record there differs from the others'."""
    if not callable(fn):
        raise TypeError(say("fn must be the function you wrote; got {type}", type=type(fn).__name__))
    rng = random.Random(seed)
    cases = list(_cases(rng))
    for records in cases:
        want = reference_culprit(records)
        why = say("this exercise asks you to find the divergence yourself; the chapter's own functions are refused")
        with without(debug, ["divergence"], why), without(sys.modules[__name__], ["reference_culprit"], why):
            got = _call(fn, [list(r) for r in records])
        if got != want:
            shown = "\n".join(f"  rank {r}: " + ", ".join(f"#{x['seq']} {x['op']}({x['numel']}, {x['what']})"
                                                         for x in recs) for r, recs in enumerate(records))
            raise ExerciseFailed(say("{fn} on these records:\n{shown}\nreturned {got!r}, expected {want!r}: {hint}",
                                     fn=_name(fn), shown=shown, got=got, want=want, hint=_hint(got, want, records)))
    return Passed(say("{fn} names where the records diverge and who took another path, in {count} hangs",
                      fn=_name(fn), count=len(cases)))


#: PaLM 540B's reported run (Chowdhery et al. 2022, "PaLM", Appendix B): 238.3K tokens per second for the whole
#: job on 6144 TPU v4 chips of 275 TFLOP/s peak each; 540.35 B parameters, 118 layers of 48 heads of width 256,
#: sequences of 2048 tokens. The paper's MFU: 46.2 % (45.7 % without attention's FLOPs).
PALM_540B = dict(tokens_per_second=238.3e3, params=540.35e9, layers=118, attention_width=48 * 256, seq_len=2048,
                 chips=6144, peak_flops=275e12)
_MFU_ARGS = tuple(PALM_540B)


def reference_mfu(tokens_per_second, params, layers, attention_width, seq_len, chips, peak_flops) -> float:
    """MFU as a fraction: the model's FLOPs per token (6Ψ, plus attention's 12·L·H·Q·T, PaLM's convention)
    times the job's tokens per second, over the peak of all its chips."""
    per_token = 6 * params + 12 * layers * attention_width * seq_len
    return per_token * tokens_per_second / (chips * peak_flops)


def _mfu_cases(rng: random.Random):
    yield dict(PALM_540B)
    for _ in range(3):  # fresh runs: long sequences, so that attention's share is large enough to see
        layers = rng.randint(16, 96)
        width = 128 * rng.randint(16, 128)
        yield dict(tokens_per_second=rng.uniform(2e3, 5e5), params=12 * layers * width**2 * rng.uniform(1.0, 1.2),
                   layers=layers, attention_width=width, seq_len=2 ** rng.randint(13, 17),
                   chips=rng.choice([8, 64, 512, 2048, 16384]), peak_flops=rng.choice([312e12, 989e12, 2250e12]))


def _mfu_mistakes(case) -> dict:
    """What the usual mistakes return on ``case``, each with its hint."""
    n, t = case["params"], case["tokens_per_second"]
    attention = 12 * case["layers"] * case["attention_width"] * case["seq_len"]
    all_chips = case["chips"] * case["peak_flops"]
    want = reference_mfu(*case.values())
    return {
        "forward only": ([(2 * n + attention / 3) * t / all_chips, (2 * n + attention) * t / all_chips],
                         say("you counted the forward's FLOPs only (2Ψ per token). Backward costs twice the forward "
                             "(a product for the input's gradient and one for the weight's): 6Ψ per token, and "
                             "attention's 12·L·H·Q·T covers both passes too")),
        "one chip": ([want * case["chips"]],
                     say("you divided by one chip's peak. The tokens per second are the whole job's: divide by all "
                         "{chips:,} chips' peak", chips=case['chips'])),
        "chips twice": ([want / case["chips"]],
                        say("you divided by the chips twice: the tokens per second are already the whole job's")),
        "no attention": ([6 * n * t / all_chips],
                         say("you left out attention: its two products per layer cost 12·L·H·Q·T FLOPs per token "
                             "(forward and backward), which 6Ψ does not count")),
        "percent": ([100 * want], say("return a fraction (0.46), not a percentage (46)")),
    }


def check_mfu(fn, seed: int | None = None) -> Passed:
    """Chapter 09's exercise: ``fn(tokens_per_second, params, layers, attention_width, seq_len, chips,
    peak_flops)`` → the run's MFU as a fraction, called positionally, on PaLM 540B's reported run (46.2 %)
    and on fresh ones."""
    if not callable(fn):
        raise TypeError(say("fn must be the function you wrote; got {type}", type=type(fn).__name__))
    cases = list(_mfu_cases(random.Random(seed)))
    assert round(100 * reference_mfu(*cases[0].values()), 1) == 46.2  # the paper's number, from its own inputs
    why = say("this exercise asks you to do the arithmetic yourself; the chapter's own functions are refused")
    for case in cases:
        want = reference_mfu(*case.values())
        with without(mfu, ["utilization", "narayanan_flops"], why), \
                without(sys.modules[__name__], ["reference_mfu"], why):
            got = _call(fn, *case.values())
        shown = ", ".join(f"{k}={v:,.6g}" for k, v in case.items())
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
            raise ExerciseFailed(say("{fn}({shown}) returned {got!r:.60}: return a number, the MFU as a fraction",
                                     fn=_name(fn), shown=shown, got=got))
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        hint = next((h for values, h in _mfu_mistakes(case).values()
                     if any(math.isclose(got, v, rel_tol=1e-6) for v in values)),
                    say("MFU is the model's FLOPs per second over the peak of every chip the job ran on"))
        raise ExerciseFailed(say("{fn}({shown}) returned {got:.6g}, expected {want:.6g}: {hint}", fn=_name(fn),
                                 shown=shown, got=got, want=want, hint=hint))
    return Passed(say("{fn} gives PaLM 540B's reported {mfu:.1%} MFU, and {count} fresh runs'", fn=_name(fn),
                      mfu=reference_mfu(*cases[0].values()), count=len(cases) - 1))
