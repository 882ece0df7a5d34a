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
from parlab.course.exercises.core import ExerciseFailed, Passed, first_difference, record_group, refusing
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
        try:
            with record_group() as seen, refusing("ch04.1", "write it with dist.reduce, not with the check's own "
                                                             "reference"):
                got = fn(flat.clone())
        except ExerciseFailed as refused:
            return {"findings": [str(refused)], "ops": []}
        ops |= {r.op for r in seen.records}
        roots = sorted(r.peer for r in seen.records if r.op == "reduce")
        if not seen.records:
            findings.append(f"{numel}-element gradient: no communication was recorded on the process group: every "
                            f"rank's shard needs the other ranks' gradients (one dist.reduce per owner)")
        elif not {r.op for r in seen.records} - {"reduce"} and roots != list(range(n)):
            findings.append(f"{numel}-element gradient: the reduces had roots {roots}; each of the {n} ranks owns "
                            f"one shard, so each is the root (dst) of exactly one reduce")
        problem = first_difference(got, want)
        if problem and isinstance(got, torch.Tensor) and got.numel() != want.numel():
            problem += (f": every rank's shard has ⌈{numel}/{n}⌉ = {want.numel()} elements (pad the gradient with "
                        f"zeros to {want.numel() * n} first)")
        elif problem and isinstance(got, torch.Tensor) and torch.allclose(got, want * n):
            problem += ": that is the sum over ranks; the optimizer needs the average"
        if problem:
            findings.append(f"{numel}-element gradient: {problem}")
    return {"findings": findings, "ops": sorted(ops)}


def check_reduce_to_owners(fn, world_size: int = 3) -> Passed:
    """Chapter 04, exercise 1: ``fn(flat)`` on every rank → this rank's padded shard of the average of the
    ranks' 1-D ``flat`` gradients, using ``dist.reduce`` only (one call per owner). On ``world_size`` ranks,
    over gradients of 10, 7, 12 and 1 elements."""
    if not callable(fn):
        raise TypeError(f"fn must be the function you wrote; got {type(fn).__name__}")
    per_rank = parlab.launch(_owners_on_rank, world_size=world_size, args=(fn,), announce=False, timeout=60)
    report = [f"rank {r}: {line}" for r, out in enumerate(per_rank) for line in out["findings"]]
    if report:
        raise ExerciseFailed("not right yet:\n  " + "\n  ".join(report[:8]))
    other = sorted({op for out in per_rank for op in out["ops"]} - {"reduce"})
    if other:
        raise ExerciseFailed(f"right values, but through {', '.join(other)}: build it from dist.reduce alone "
                             f"(the point is that a reduce-scatter is N reduces, each rank the root of one)")
    return Passed(f"every rank holds its shard of the average on {world_size} ranks, for {len(FLAT_SIZES)} "
                  f"gradient sizes, from reduces alone")


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


def check_peak_gathered(fn) -> Passed:
    """Chapter 04, exercise 2: ``fn(block_numels, root_numel, prefetch, world_size)`` → the most weights
    (elements) stage 3 holds gathered at once."""
    cases = [([100, 300, 200], 50, False, 2), ([100, 300, 200], 50, True, 2), ([10, 10, 10, 10], 0, True, 3),
             ([7, 20, 5, 30], 11, True, 4), ([7, 20, 5, 30], 11, False, 4), ([1000], 9, True, 3),
             ([12704, 12704], 5184, True, 3), ([544, 64, 2112, 455], 0, True, 3)]
    draw = random.Random()  # and cases new at every call: a table harvested from this check's messages fails
    cases += [([draw.randrange(1, 5000) for _ in range(draw.randrange(1, 7))], draw.randrange(0, 500),
                draw.random() < 0.5, draw.randrange(2, 9)) for _ in range(4)]
    for blocks, root, prefetch, n in cases:
        expected = reference_peak_gathered(blocks, root, prefetch, n)
        with refusing("ch04.2", "work it out from the order stage 3 gathers and frees, not with the check's own "
                                "reference"):
            got = fn(list(blocks), root, prefetch, n)
        if got != expected:
            hint = ""
            if got == reference_peak_gathered(blocks, root, prefetch, 1):
                hint = " (the sizes need padding to a multiple of world_size first)"
            elif got == reference_peak_gathered(blocks, root, not prefetch, n):
                hint = " (that is the peak " + ("without" if prefetch else "with") + " prefetch)"
            raise ExerciseFailed(f"fn(block_numels={blocks}, root_numel={root}, prefetch={prefetch}, "
                                 f"world_size={n}): expected {expected}, got {got!r}{hint}")
    return Passed(f"fn agrees with the reference on all {len(cases)} cases, {len(cases) - 8} of them drawn anew")


# -- 3. gradient accumulation ---------------------------------------------------------------------------------------

ACCUMULATING = ("ddp", "zero1", "zero2", "zero3", "zero3_keep")


def _accumulation_volume(strategy: str, micro_batches: int) -> float:
    m = micro_batches
    return {"ddp": 2, "zero1": 2, "zero2": m + 1, "zero3": 3 * m, "zero3_keep": 2 * m}[strategy]


def check_accumulation_volume(fn) -> Passed:
    """Chapter 04, exercise 3: ``fn(strategy, micro_batches)`` → the communication volume per rank and step, in
    units of Ψ, when gradients are accumulated over ``micro_batches`` forward/backward passes before one
    optimizer step: DDP with ``no_sync``, and the course's ``ZeroStage1``, ``ZeroStage2``, ``ZeroStage3``
    (``"zero3"``) and ``ZeroStage3(reshard_after_forward=False)`` (``"zero3_keep"``)."""
    for strategy in ACCUMULATING:
        for m in (1, 2, 8, 5):
            expected = _accumulation_volume(strategy, m)
            with refusing("ch04.3", "count the collectives yourself, not with the planner or the check's own answer"):
                got = fn(strategy, m)
            if not isinstance(got, (int, float)) or abs(got - expected) > 1e-9:
                hint = ""
                if strategy == "zero2" and got == 2:
                    hint = (": stage 2 keeps only its shard of the gradients, so where does the next micro-batch's "
                            "gradient go before the step?")
                elif strategy.startswith("zero3") and got == _accumulation_volume(strategy, 1):
                    hint = ": does every micro-batch's forward find the weights gathered?"
                raise ExerciseFailed(f"fn({strategy!r}, micro_batches={m}): expected {expected}Ψ, got {got!r}{hint}")
    return Passed(f"the volumes of all {len(ACCUMULATING)} strategies, for 1 to 8 micro-batches, are right")


# -- 4. which block to keep ------------------------------------------------------------------------------------------

def check_keep_gathered(block: int, bytes_saved: int, sizes: dict, world_size: int) -> Passed:
    """Chapter 04, exercise 4: ``ZeroStage3`` (fp32) frees every block after its forward and gathers it again
    for backward. Keeping *one* block gathered from forward to backward: which (its index in
    ``model.transformer.h``), and how many bytes of all-gather per step does it save on each rank (count
    what this rank receives into its gathered buffer, padding included)? ``sizes``: ``tiny_gpt2``'s."""
    from parlab.lab.models import tiny_gpt2

    model = tiny_gpt2(**sizes)
    last = len(model.transformer.h) - 1
    numel = sum(p.numel() for p in model.transformer.h[last].parameters())
    padded = -(-numel // world_size) * world_size
    if block != last:
        raise ExerciseFailed(f"block {block!r}: every block's backward gathers its weights again; which one's "
                             f"backward comes first, right after the forward has used it?")
    if bytes_saved != 4 * padded:
        hint = ""
        if bytes_saved == 4 * numel:
            hint = " (close: the gathered buffer is padded to a multiple of world_size)"
        elif bytes_saved == 8 * padded:
            hint = " (only one gather is skipped: the one before its backward)"
        elif bytes_saved == padded:
            hint = " (that is elements; the weights are fp32)"
        raise ExerciseFailed(f"block {block} is right; bytes_saved={bytes_saved!r} is not{hint}")
    return Passed(f"keep block {last} (backward starts with it): {4 * padded:,} B less all-gather per step, "
                  f"for one block's weights held a little longer")
