"""Chapter 04's exercises (ZeRO, Rajbhandari et al. 2020): shard and gather a flat buffer with padding over an
uneven number of ranks; how many weights stage 3 holds gathered at once, with and without prefetch; the
smallest stage whose model states fit a GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist

import parlab
from parlab.exercises.core import ExerciseFailed, Passed, first_difference

FLAT_SIZES = (10, 7, 12, 1)  # elements in the flat buffers the check shards: most do not divide evenly


def reference_shard(flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's ⌈numel / world_size⌉ elements of ``flat``, the last shards padded with zeros."""
    per = -(-flat.numel() // world_size)
    padded = torch.zeros(per * world_size, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    return padded[rank * per:(rank + 1) * per].clone()


def reference_gather(shard: torch.Tensor, numel: int) -> torch.Tensor:
    """On every rank: every rank's shard, in rank order, without the padding."""
    whole = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype)
    dist.all_gather(list(whole.chunk(dist.get_world_size())), shard)
    return whole[:numel]


def _flat_on_rank(shard_fn, gather_fn) -> list[str]:
    rank, n = parlab.rank(), parlab.world_size()
    findings = []
    for numel in FLAT_SIZES:
        flat = torch.arange(1.0, numel + 1)  # no zeros: padding cannot pass for data
        want = reference_shard(flat, rank, n)
        got = shard_fn(flat.clone(), rank, n)
        problem = first_difference(got, want)
        if problem and isinstance(got, torch.Tensor) and got.numel() != want.numel():
            problem += (f": every rank's shard has ⌈{numel}/{n}⌉ = {want.numel()} elements, so that all are equal "
                        f"(the collectives need that); pad the buffer with zeros to {want.numel() * n} first")
        if problem:
            findings.append(f"shard of a {numel}-element buffer: {problem}")
        whole = gather_fn(want.clone(), numel)  # from the right shards, so that its own mistakes show
        problem = first_difference(whole, flat)
        if problem and isinstance(whole, torch.Tensor) and whole.numel() == want.numel() * n != numel:
            problem += ": the padding is still there; return only the first numel elements"
        if problem:
            findings.append(f"gather to {numel} elements: {problem}")
    return findings


def check_flat_sharding(shard_fn, gather_fn, world_size: int = 3) -> Passed:
    """Chapter 04: ``shard_fn(flat, rank, world_size)`` → this rank's padded shard; ``gather_fn(shard, numel)``
    on every rank → the whole buffer. Run on ``world_size`` ranks over buffers of 10, 7, 12 and 1 elements."""
    for name, fn in (("shard_fn", shard_fn), ("gather_fn", gather_fn)):
        if not callable(fn):
            raise TypeError(f"{name} must be the function you wrote; got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2; got {world_size!r}")
    per_rank = parlab.launch(_flat_on_rank, world_size=world_size, args=(shard_fn, gather_fn), announce=False)
    report = [f"rank {r}: {line}" for r, lines in enumerate(per_rank) for line in lines]
    if report:
        raise ExerciseFailed("not right yet:\n  " + "\n  ".join(report[:8]))
    return Passed(f"every rank's shard and every gathered buffer are right on {world_size} ranks, "
                  f"for {len(FLAT_SIZES)} buffer sizes")


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
    """Chapter 04: ``fn(block_numels, root_numel, prefetch, world_size)`` → the most weights (elements) stage 3
    holds gathered at once."""
    cases = [([100, 300, 200], 50, False, 2), ([100, 300, 200], 50, True, 2), ([10, 10, 10, 10], 0, True, 3),
             ([7, 20, 5, 30], 11, True, 4), ([7, 20, 5, 30], 11, False, 4), ([1000], 9, True, 3),
             ([12704, 12704], 5184, True, 3), ([544, 64, 2112, 455], 0, True, 3)]
    for blocks, root, prefetch, n in cases:
        expected = reference_peak_gathered(blocks, root, prefetch, n)
        got = fn(list(blocks), root, prefetch, n)
        if got != expected:
            hint = ""
            if got == reference_peak_gathered(blocks, root, prefetch, 1):
                hint = " (the sizes need padding to a multiple of world_size first)"
            elif got == reference_peak_gathered(blocks, root, not prefetch, n):
                hint = " (that is the peak " + ("without" if prefetch else "with") + " prefetch)"
            raise ExerciseFailed(f"fn(block_numels={blocks}, root_numel={root}, prefetch={prefetch}, "
                                 f"world_size={n}): expected {expected}, got {got!r}{hint}")
    return Passed(f"fn agrees with the reference on all {len(cases)} cases")


def reference_smallest_stage(num_params: int, world_size: int, gpu_gb: float, precision: str = "bf16"):
    """The smallest ZeRO stage whose model states (Adam) fit in ``gpu_gb`` GB per rank, or ``None``."""
    from parlab.measure import estimate_memory

    for stage in range(4):
        need = estimate_memory(num_params=num_params, precision=precision, world_size=world_size,
                               zero_stage=stage).model_states
        if need <= gpu_gb * 1e9:
            return stage
    return None


def check_smallest_stage(fn) -> Passed:
    """Chapter 04: ``fn(num_params, world_size, gpu_gb, precision)`` → 0, 1, 2, 3 or ``None``."""
    cases = [(1_500_000_000, 8, 80, "bf16"), (7_000_000_000, 8, 80, "bf16"), (7_000_000_000, 2, 80, "bf16"),
             (13_000_000_000, 8, 80, "fp32"), (13_000_000_000, 8, 40, "bf16"), (70_000_000_000, 8, 80, "bf16"),
             (70_000_000_000, 64, 80, "bf16"), (175_000_000_000, 8, 80, "bf16")]
    for num_params, n, gb, precision in cases:
        expected = reference_smallest_stage(num_params, n, gb, precision)
        got = fn(num_params, n, gb, precision)
        if got != expected:
            raise ExerciseFailed(f"fn(num_params={num_params:_}, world_size={n}, gpu_gb={gb}, "
                                 f"precision={precision!r}): expected {expected!r}, got {got!r}")
    return Passed(f"fn agrees with the reference on all {len(cases)} cases")
