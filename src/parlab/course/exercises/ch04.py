"""Chapter 04's exercises (ZeRO, Rajbhandari et al. 2020). None is answered in the chapter, and none can be
passed by calling the package's own answer (each is listed in ``core.ANSWERS``, and
:func:`parlab.course.exercises.core.refusing` refuses it while the learner's function runs):

1. :func:`check_reduce_to_owners`: the paper's stage 2 (§5.2) reduces each rank's partition *to* that rank.
   Build a reduce-scatter out of ``dist.reduce`` alone, padded for an uneven number of ranks.
2. :func:`check_peak_gathered`: how many weights stage 3 holds gathered at once, with and without prefetch.
3. :func:`check_accumulation_volume`: the bytes each strategy moves per step under gradient accumulation.
4. :func:`check_keep_gathered`: which block to keep gathered from forward to backward, and what it saves.
"""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

import parlab
from parlab.course.exercises.core import (ExerciseFailed, Passed, _call, first_difference, later, record_group,
                                         refusing)
from parlab.lab.language import say
from parlab.lab.parallel.comm import _reduce_scatter

FLAT_SIZES = (10, 7, 12, 1)  # elements in the flat gradients the check reduces: most do not divide evenly


# -- 1. a reduce-scatter out of reduces -------------------------------------------------------------------------

def _reference_owner_shards(flat: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's ⌈numel / N⌉ elements of the average of ``flat`` over the ranks (zeros past the end)."""
    n = dist.get_world_size(group)
    per = -(-flat.numel() // n)
    padded = torch.zeros(per * n, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    out = torch.empty(per, dtype=flat.dtype)
    _reduce_scatter(out, padded, group=group)  # PyTorch 2.13's name where it has one: the old one warns
    return out / n


def _owners_on_rank(fn) -> dict:
    rank, n = parlab.rank(), parlab.world_size()
    findings, ops = [], set()
    for numel in FLAT_SIZES:
        flat = torch.arange(1.0, numel + 1) * (rank + 1)  # distinct per rank: a sum or a wrong rank shows
        want = _reference_owner_shards(flat.clone())
        shard_bytes = want.numel() * want.element_size()
        try:
            with record_group() as seen, refusing("ch04.1", say("write it with dist.reduce, not with the check's "
                                                                 "own reference")):
                got = _call(fn, flat.clone())
        except ExerciseFailed as refused:  # refused, or raised in the learner's code
            return {"findings": [str(refused)], "ops": []}
        ops |= {r.op for r in seen.records}
        roots = sorted(r.peer for r in seen.records if r.op == "reduce")
        if not seen.records:
            findings.append(say("{numel}-element gradient: no communication was recorded on the process group: "
                                "every rank's shard needs the other ranks' gradients (one dist.reduce per owner)",
                                numel=numel))
        elif not {r.op for r in seen.records} - {"reduce"} and roots != list(range(n)):
            findings.append(say("{numel}-element gradient: the reduces had roots {roots}; each of the {n} ranks owns "
                                "one shard, so each is the root (dst) of exactly one reduce", numel=numel,
                                roots=roots, n=n))
        elif any(r.bytes > shard_bytes for r in seen.records if r.op == "reduce"):
            sent = sum(r.bytes for r in seen.records if r.op == "reduce")
            sizes = ", ".join(str(r.bytes) for r in seen.records if r.op == "reduce")
            findings.append(say("{numel}-element gradient: the reduces sent {sizes} bytes, {sent} in all, but an "
                                "owner needs only its shard, {shard} elements ({shard_bytes} bytes). Reducing the "
                                "whole buffer to every owner moves {times:.3g}× the traffic of a reduce-scatter: "
                                "reduce only chunk k of the padded buffer to owner k", numel=numel, sizes=sizes,
                                sent=sent, shard=want.numel(), shard_bytes=shard_bytes,
                                times=sent / (n * shard_bytes)))
        problem = first_difference(got, want)
        if problem and isinstance(got, torch.Tensor) and got.numel() != want.numel():
            problem += say(": every rank's shard has ⌈{numel}/{n}⌉ = {shard} elements (pad the gradient with "
                           "zeros to {padded} first)", numel=numel, n=n, shard=want.numel(),
                           padded=want.numel() * n)
        elif problem and isinstance(got, torch.Tensor) and torch.allclose(got, want * n):
            problem += say(": that is the sum over ranks; the optimizer needs the average")
        if problem:
            findings.append(say("{numel}-element gradient: {problem}", numel=numel, problem=problem))
    return {"findings": findings, "ops": sorted(ops)}


def check_reduce_to_owners(fn, world_size: int = 3) -> Passed:
    """Chapter 04, exercise 1: ``fn(flat)`` on every rank → this rank's padded shard of the average of the
    ranks' 1-D ``flat`` gradients, using ``dist.reduce`` only (one call per owner). On ``world_size`` ranks,
    over gradients of 10, 7, 12 and 1 elements."""
    if not callable(fn):
        raise TypeError(say("fn must be the function you wrote; got {kind}", kind=type(fn).__name__))
    per_rank = parlab.launch(_owners_on_rank, world_size=world_size, args=(fn,), announce=False, timeout=60)
    report = [say("rank {rank}: {finding}", rank=r, finding=line) for r, out in enumerate(per_rank)
              for line in out["findings"]]
    if report:
        raise ExerciseFailed(say("not right yet:") + "\n  " + "\n  ".join(report[:8]))
    other = sorted({op for out in per_rank for op in out["ops"]} - {"reduce"})
    if other:
        raise ExerciseFailed(say("right values, but through {ops}: build it from dist.reduce alone (the point is "
                                 "that a reduce-scatter is N reduces, each rank the root of one)",
                                 ops=", ".join(other)))
    return Passed(say("every rank holds its shard of the average on {world_size} ranks, for {sizes} gradient sizes, "
                      "from reduces alone", world_size=world_size, sizes=len(FLAT_SIZES)))


# -- 2. what prefetch costs ---------------------------------------------------------------------------------------

def reference_peak_gathered(block_numels, root_numel: int, prefetch: bool, world_size: int = 1) -> int:
    """Elements of gathered weights ``ZeroStage3`` holds at once: the root for the whole forward and backward,
    one block (without prefetch) or two neighbours (with: the next is gathered while this one runs), each
    group padded to a multiple of ``world_size``."""
    pad = [-(-b // world_size) * world_size for b in block_numels]
    root = -(-root_numel // world_size) * world_size
    if not prefetch or len(pad) == 1:
        return root + max(pad)
    return root + max(a + b for a, b in zip(pad, pad[1:]))


def _peak_mistake(got, blocks, root, prefetch, n) -> str:
    """The hints naming the mistakes ``got`` makes, when they are ones a learner makes, else ''. Two mistakes
    can give the same number in one case: then both are named."""
    def pad(k):
        return -(-k // n) * n

    def pairs(sizes):  # what is held at once in forward order: one block, or (prefetch) a block and the next
        return [a + b for a, b in zip(sizes, sizes[1:])] if prefetch and len(sizes) > 1 else list(sizes)

    held = pairs(blocks)
    padded = [pad(b) for b in blocks]
    held_padded = pairs(padded)
    tail = say(": {once}", once=say("each group is gathered into its own padded buffer: pad every block and the "
                                    "root on its own, then add"))
    mistakes = [
        (reference_peak_gathered(blocks, root, prefetch, 1), say("no padding: the sizes need padding to a multiple "
                                                                 "of world_size first")),
        (reference_peak_gathered(blocks, root, prefetch, n + 1), say("padded to a multiple of world_size + 1: pad "
                                                                     "to a multiple of world_size itself")),
        (reference_peak_gathered(blocks, root, prefetch, max(1, n - 1)), say("padded to a multiple of world_size "
                                                                             "− 1: pad to a multiple of world_size "
                                                                             "itself")),
        (reference_peak_gathered(blocks, root, not prefetch, n),
         say("that is the peak without prefetch: prefetch gathers the next block while this one computes, so two "
             "neighbours are held at once") if prefetch else
         say("that is the peak with prefetch: without it, one block at a time")),
        (root + max(held_padded),
         say("the root is unpadded: the root's weights are gathered into a padded buffer too, so pad root_numel to "
             "a multiple of world_size")),
        (max(held_padded), say("the root is forgotten: the root's weights (the embeddings and final norm) stay "
                               "gathered through the whole forward and backward; add them")),
        (pad(root) + max(pad(h) for h in held), say("padding applied once, to the two blocks together") + tail),
        (pad(root + max(held)), say("padding applied once, to the total") + tail),
        (pad(root + max(held_padded)), say("padding applied once, to the root and blocks together") + tail),
        (reference_peak_gathered(blocks, root, prefetch, n) // n, say("that counts one rank's shards: a gathered "
                                                                      "buffer holds the whole block, every rank's "
                                                                      "shard")),
        (pad(root) // n + max(held_padded), say("the root counted as one rank's shard: the root is gathered whole "
                                                "too")),
        (root // n * n + max(pairs([b // n * n for b in blocks])),
         say("rounded down: padding rounds each size *up* to a multiple of world_size (⌈numel / N⌉ · N)")),
        (pad(root) + 2 * max(padded), say("the largest block counted twice: prefetch holds a block and the *next* "
                                          "one, in forward order, not two copies of the largest")),
        (pad(root) + sum(sorted(padded)[-2:]), say("the two largest blocks: prefetch holds a block and the next one "
                                                   "in forward order, which need not be the two largest")),
        (pad(root) + max(sum(padded[max(0, i - 1):i + 2]) for i in range(len(padded))),
         say("three blocks at once: the previous block is freed after its forward, before the next is gathered")),
        (pad(root) + sum(padded), say("every block at once: stage 3 frees each block after it computes")),
    ]
    expected = reference_peak_gathered(blocks, root, prefetch, n)
    named = list(dict.fromkeys(hint for value, hint in mistakes if value != expected and got == value))
    named = [h[:-len(tail)] if h.endswith(tail) and any(g.endswith(tail) for g in named[:k]) else h
             for k, h in enumerate(named)]  # the shared explanation once, with the first padding hint
    return say(" ({hints})", hints=say("; or ").join(named)) if named else ""


def check_peak_gathered(fn) -> Passed:
    """Chapter 04, exercise 2: ``fn(block_numels, root_numel, prefetch, world_size)`` → the most weights
    (elements) stage 3 holds gathered at once."""
    # the first prefetching case tells apart the ways of holding too many blocks (neighbours, the largest
    # twice, three at once, all), which three blocks of 100, 300, 200 do not
    cases = [([100, 300, 200], 50, False, 2), ([7, 20, 5, 30], 11, True, 4), ([100, 300, 200], 50, True, 2),
             ([10, 10, 10, 10], 0, True, 3), ([7, 20, 5, 30], 11, False, 4), ([1000], 9, True, 3),
             ([12704, 12704], 5184, True, 3), ([544, 64, 2112, 455], 0, True, 3)]
    draw = random.Random()  # and cases new at every call: a table harvested from this check's messages fails
    cases += [([draw.randrange(1, 5000) for _ in range(draw.randrange(1, 7))], draw.randrange(0, 500),
                draw.random() < 0.5, draw.randrange(2, 9)) for _ in range(4)]
    for blocks, root, prefetch, n in cases:
        expected = reference_peak_gathered(blocks, root, prefetch, n)
        with refusing("ch04.2", say("work it out from the order stage 3 gathers and frees, not with the check's "
                                    "own reference")):
            got = _call(fn, list(blocks), root, prefetch, n)
        if got != expected:
            raise ExerciseFailed(say("fn(block_numels={blocks}, root_numel={root}, prefetch={prefetch}, "
                                     "world_size={n}): expected {expected}, got {got!r}{hint}", blocks=blocks,
                                     root=root, prefetch=prefetch, n=n, expected=expected, got=got,
                                     hint=_peak_mistake(got, blocks, root, prefetch, n)))
    return Passed(say("fn agrees with the reference on all {cases} cases, {drawn} of them drawn anew",
                      cases=len(cases), drawn=len(cases) - 8))


# -- 3. gradient accumulation ---------------------------------------------------------------------------------------

ACCUMULATING = ("ddp", "zero1", "zero2", "zero3", "zero3_keep")


def _accumulation_volume(strategy: str, micro_batches: int) -> float:
    m = micro_batches
    return {"ddp": 2, "zero1": 2, "zero2": m + 1, "zero3": 3 * m, "zero3_keep": 2 * m}[strategy]


#: strategy -> (the volume a plausible mistake gives for m micro-batches, the hint naming it, said in the learner's
#: language where it is shown)
_NO_GATHER_AFTER = later.say("stage 3 has no all-gather after the step: each rank updates its own shard of the "
                             "weights, and the next forward gathers them")
_ACCUMULATION_MISTAKES = {
    "ddp": [(lambda m: 2 * m, later.say("with no_sync, DDP all-reduces only after the last micro-batch; the "
                                        "gradients accumulate locally before it")),
            (lambda m: 1, later.say("an all-reduce moves 2Ψ per rank (a reduce-scatter, then an all-gather, Ψ "
                                    "each)"))],
    "zero1": [(lambda m: 2 * m, later.say("stage 1 keeps whole gradients, so they accumulate locally: one "
                                          "reduce-scatter and one all-gather per step, as DDP")),
              (lambda m: m + 1, later.say("stage 1 keeps whole gradients (it shards only the optimizer state), so "
                                          "they accumulate locally and are reduce-scattered once, before the step")),
              (lambda m: 1, later.say("the all-gather is missing: after the step every rank all-gathers the updated "
                                      "weights (Ψ)"))],
    "zero2": [(lambda m: 2, later.say("that counts stage 2 as stage 1, whose whole gradients accumulate locally. "
                                      "Stage 2 keeps only its shard of the gradients, so where does the next "
                                      "micro-batch's gradient go before the step? Each is reduce-scattered during "
                                      "its own backward")),
              (lambda m: 2 * m, later.say("the updated weights are all-gathered once, after the step, not after every "
                                          "micro-batch")),
              (lambda m: m, later.say("the all-gather is missing: after the step every rank all-gathers the updated "
                                      "weights (Ψ), once"))],
    "zero3": [(lambda m: 3, later.say("that counts one micro-batch: does every micro-batch's forward find the weights "
                                      "gathered? Stage 3 frees them after each block, so every micro-batch's forward "
                                      "and backward gather them again, and every backward reduce-scatters")),
              (lambda m: 2 * m + 1, later.say("stage 3 keeps only its shard of the gradients, as stage 2: every "
                                              "micro-batch's backward reduce-scatters (Ψ each)")),
              (lambda m: 2 * m, later.say("stage 3 frees the weights after each block's forward, so backward gathers "
                                          "them again: two gathers per micro-batch, and a reduce-scatter")),
              (lambda m: 3 * m + 1, _NO_GATHER_AFTER)],
    "zero3_keep": [(lambda m: 2, later.say("that counts one micro-batch: does every micro-batch's forward find the "
                                           "weights gathered? They are freed after each backward, so every "
                                           "micro-batch's forward gathers them again, and every backward "
                                           "reduce-scatters")),
                   (lambda m: 3 * m, later.say("reshard_after_forward=False keeps the weights gathered from forward "
                                               "into backward: one gather per micro-batch, not two")),
                   (lambda m: m + 1, later.say("reshard_after_forward=False keeps a block from its forward to its "
                                               "backward, not from one micro-batch to the next: each micro-batch "
                                               "gathers again")),
                   (lambda m: 2 * m + 1, _NO_GATHER_AFTER)],
}


def _accumulation_mistake(got, strategy: str, m: int) -> str:
    """The hints naming the mistakes ``got`` makes, when they are ones a learner makes, else '' (two that give
    the same number are both named)."""
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return say(": return a number, the volume in units of Ψ (one model's worth of values per rank)")
    named = [say(hint) for mistake, hint in _ACCUMULATION_MISTAKES.get(strategy, ())
             if mistake(m) != _accumulation_volume(strategy, m) and abs(got - mistake(m)) < 1e-9]
    return say(": {hints}", hints=say("; or ").join(named)) if named else ""


def check_accumulation_volume(fn) -> Passed:
    """Chapter 04, exercise 3: ``fn(strategy, micro_batches)`` → the communication volume per rank and step, in
    units of Ψ, when gradients are accumulated over ``micro_batches`` forward/backward passes before one
    optimizer step: DDP with ``no_sync``, and the course's ``ZeroStage1``, ``ZeroStage2``, ``ZeroStage3``
    (``"zero3"``) and ``ZeroStage3(reshard_after_forward=False)`` (``"zero3_keep"``)."""
    for strategy in ACCUMULATING:
        for m in (3, 1, 8, 2):  # 3 first: there every mistake in _ACCUMULATION_MISTAKES gives its own number
            expected = _accumulation_volume(strategy, m)
            with refusing("ch04.3", say("count the collectives yourself, not with the planner or the check's own "
                                        "answer")):
                got = _call(fn, strategy, m)
            if not isinstance(got, (int, float)) or abs(got - expected) > 1e-9:
                raise ExerciseFailed(say("fn({strategy!r}, micro_batches={m}): expected {expected}Ψ, got {got!r}"
                                         "{hint}", strategy=strategy, m=m, expected=expected, got=got,
                                         hint=_accumulation_mistake(got, strategy, m)))
    return Passed(say("the volumes of all {strategies} strategies, for 1 to 8 micro-batches, are right",
                      strategies=len(ACCUMULATING)))


# -- 4. which block to keep ------------------------------------------------------------------------------------------

def check_keep_gathered(block: int, bytes_saved: int, sizes: dict, world_size: int) -> Passed:
    """Chapter 04, exercise 4: ``ZeroStage3`` (fp32) frees every block after its forward and gathers it again
    for backward. Keeping *one* block gathered from forward to backward: which (its index in
    ``model.transformer.h``), and how many bytes of all-gather per step does it save on each rank (count
    what this rank receives into its gathered buffer, padding included)? ``sizes``: ``tiny_gpt2``'s."""
    from parlab.lab.models import tiny_gpt2

    model = tiny_gpt2(**sizes)
    blocks = len(model.transformer.h)
    last = blocks - 1
    numel = sum(p.numel() for p in model.transformer.h[last].parameters())
    padded = -(-numel // world_size) * world_size
    if isinstance(block, bool) or not isinstance(block, int) or not -blocks <= block < blocks:
        raise ExerciseFailed(say("block={block!r}: give an index into model.transformer.h, 0 to {last} (or -1 for "
                                 "the last, as Python counts)", block=block, last=last))
    if block % blocks != last:  # -1 is Python's last block: the same block
        question = say("every block's backward gathers its weights again; which one's backward comes first, right "
                       "after the forward has used it?")
        raise ExerciseFailed(say("block {block!r} (block {index}): {question}", block=block, index=block % blocks,
                                 question=question) if block < 0 else
                             say("block {block!r}: {question}", block=block, question=question))
    right = 4 * padded
    if bytes_saved != right:
        shard = padded // world_size
        mistakes = [  # (the value a plausible mistake gives, what it is): two may coincide at some world sizes
            (4 * numel, say("the block's bytes unpadded; the gathered buffer is padded to a multiple of world_size")),
            (8 * padded, say("two gathers; only one gather is skipped, the one before its backward")),
            (padded, say("the gathered buffer's elements; bytes_saved is in bytes, and the weights are fp32 (4 bytes "
                         "each)")),
            (4 * shard, say("one rank's shard in bytes; the all-gather fills the whole gathered buffer, all "
                            "{world_size} shards (this rank's own included)", world_size=world_size)),
            (shard, say("one rank's shard in elements; count the whole gathered buffer, in bytes (fp32: 4 each)")),
            (4 * (padded - shard), say("what the other ranks send; count the whole gathered buffer, this rank's "
                                       "own shard included")),
            (2 * padded, say("the buffer in 2-byte values; ZeroStage3 here is fp32: 4 bytes each")),
        ]
        named = [what for value, what in mistakes if value == bytes_saved and value != right]
        hint = say(" (that is {hints})", hints=say("; or ").join(named)) if named else ""
        raise ExerciseFailed(say("block {block} is right; bytes_saved={bytes_saved!r} is not{hint}", block=block,
                                 bytes_saved=bytes_saved, hint=hint))
    return Passed(say("keep block {block} (backward starts with it): {saved:,} B less all-gather per step, for one "
                      "block's weights held a little longer", block=last, saved=4 * padded))
