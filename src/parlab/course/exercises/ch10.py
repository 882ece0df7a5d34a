"""Chapter 10's exercises: the online-softmax rule, run inside the ring on N ranks against full attention;
and how many token slots each rank's experts receive from one rank, under top-k routing with a capacity."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, first_difference, refusing

B, HEADS, KV_HEADS, D, SEQ = 2, 4, 2, 8, 24


def _two_blocks():
    g = torch.Generator().manual_seed(3)
    s1 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    s2 = torch.randn(3, 4, generator=g, dtype=torch.float64) + torch.tensor([[-4.0], [0.0], [6.0]], dtype=torch.float64)
    v1, v2 = (torch.randn(n, 2, generator=g, dtype=torch.float64) for n in (5, 4))
    state = [(s.amax(-1, keepdim=True), torch.exp(s - s.amax(-1, keepdim=True))) for s in (s1, s2)]
    blocks = [(m, p.sum(-1, keepdim=True), p @ v) for (m, p), v in zip(state, (v1, v2))]
    whole = torch.cat([s1, s2], -1)
    return blocks, whole.softmax(-1) @ torch.cat([v1, v2]), torch.logsumexp(whole, -1, keepdim=True)


def _diagnose_two_blocks(fn) -> str | None:
    blocks, out, lse = _two_blocks()
    (m1, l1, a1), (m2, l2, a2) = blocks
    try:
        got = fn(m1, l1, a1, m2, l2, a2)
    except NotImplementedError:
        return "combine is not written yet (it raises NotImplementedError)"
    except RuntimeError as error:
        if "ambiguous" not in str(error):
            raise
        return ("your combine compared whole tensors (Python's max(m1, m2) or an if on a tensor: 'Boolean value "
                "of Tensor ... is ambiguous'); take the larger maximum row by row with torch.maximum(m1, m2)")
    if not (isinstance(got, tuple) and len(got) == 3):
        return f"combine returned {type(got).__name__}; return the tuple (m, l, acc)"
    m, l, acc = got
    if not torch.allclose(m, torch.maximum(m1, m2)):
        return "m is not the larger of the two maxima"
    if torch.allclose(l, l1 + l2) or torch.allclose(acc, a1 + a2):
        return ("l or acc is a plain sum: each block's l and acc are relative to its own maximum; rescale "
                "each by exp(its m − the new m) before adding")
    problem = first_difference(acc / l, out, atol=1e-9)
    if problem:
        return f"acc / l is not the softmax-weighted sum of both blocks' values: {problem}"
    problem = first_difference(m + torch.log(l), lse, atol=1e-9)
    return f"m + log l is not the log-sum-exp of both blocks' scores: {problem}" if problem else None


OWN_COMBINE = "write the online-softmax rule yourself, from the two blocks' m, l and acc"


def _ring_with(fn):
    from parlab.lab.parallel import context as cpx

    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(4)
    q = torch.randn(B, HEADS, SEQ, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, KV_HEADS, SEQ, D, generator=g, dtype=torch.float64) for _ in range(2))
    layout = cpx.Layout(SEQ, n)
    try:
        with refusing("ch10.1", OWN_COMBINE):
            problem = _diagnose_two_blocks(fn)
            if problem:
                return {"problem": problem}
            out = cpx.ring_attention(*(layout.shard(t, r) for t in (q, k, v)), layout, combine_fn=fn)
    except ExerciseFailed as refused:
        return {"problem": str(refused)}
    want = layout.shard(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), r)
    return {"problem": first_difference(out, want, atol=1e-9)}


def check_online_softmax_combine(fn, world_size: int = 2) -> Passed:
    """``fn(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``: two key blocks' running states as one. Checked on
    two blocks in one process, then inside ``ring_attention`` on ``world_size`` ranks against full causal
    attention (PyTorch's ``scaled_dot_product_attention``) over a 24-token sequence."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote")
    try:
        with refusing("ch10.1", OWN_COMBINE):
            problem = _diagnose_two_blocks(fn)  # in this process first: a wrong rule fails without launching
    except ExerciseFailed as refused:
        problem = str(refused)
    if problem:
        raise ExerciseFailed(f"{getattr(fn, '__name__', fn)}: {problem}")
    results = parlab.launch(_ring_with, world_size=world_size, args=(fn,), output="none", announce=False)
    for rank, res in enumerate(results):
        if res["problem"]:
            raise ExerciseFailed(f"{getattr(fn, '__name__', fn)} on rank {rank} of {world_size}: {res['problem']}")
    return Passed(f"{getattr(fn, '__name__', fn)}: two blocks combine exactly, and ring attention with it matches "
                  f"full attention on all {world_size} ranks")


# -- 2. where the tokens go ---------------------------------------------------------------------------

EXPERTS, TOKENS, TOP_K, CAPACITY = 6, 20, 2, 5


def _counts_on_rank(fn):
    from parlab.lab.parallel import expert as epx

    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(20 + r)
    logits = torch.randn(TOKENS, EXPERTS, generator=g) + torch.linspace(0, 2, EXPERTS)  # popular experts exist
    routing = epx.route(logits, TOP_K, CAPACITY)
    kept = torch.bincount(routing.expert[routing.kept], minlength=EXPERTS)
    want = [int(kept[p.start:p.stop].sum()) for p in epx.placement(EXPERTS, n)]
    try:
        with refusing("ch10.2", "count the slots yourself from routing.expert, in the priority order stated"):
            got = fn(routing.expert.clone(), EXPERTS, n, CAPACITY)
    except NotImplementedError:
        return {"problem": "received is not written yet (it raises NotImplementedError)"}
    except ExerciseFailed as refused:
        return {"problem": str(refused)}
    got = [int(x) for x in got] if isinstance(got, (list, tuple, torch.Tensor)) else got
    if got == want:
        return {"problem": None}
    before = torch.bincount(routing.expert.flatten(), minlength=EXPERTS)
    ignored = [int(before[p.start:p.stop].sum()) for p in epx.placement(EXPERTS, n)]
    per_rank = [[min(c, CAPACITY), min(c, CAPACITY * len(p))] for c, p in zip(ignored, epx.placement(EXPERTS, n))]
    hint = ""
    if got == ignored:
        hint = " (that counts dropped tokens too: an expert keeps at most capacity of them)"
    elif got in ([a for a, _ in per_rank], [b for _, b in per_rank]):
        hint = (" (that caps each rank's total: the capacity is per expert; cap each expert's count at "
                "capacity, then add up the experts a rank holds)")
    return {"problem": f"expected {want} slots per rank, got {got}{hint}"}


def check_received(fn, world_size: int = 2) -> Passed:
    """``fn(expert (T, k), num_experts, ep, capacity) -> [slots per rank]``: of this rank's assignments, how
    many each of the ``ep`` ranks' experts compute (contiguous placement; an expert keeps at most
    ``capacity``: the priority order decides which assignments are dropped, not how many). Checked on every
    rank's own routing."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote")
    for rank, res in enumerate(parlab.launch(_counts_on_rank, world_size=world_size, args=(fn,), output="none",
                                             announce=False)):
        if res["problem"]:
            raise ExerciseFailed(f"{getattr(fn, '__name__', fn)} on rank {rank} of {world_size}: {res['problem']}")
    return Passed(f"{getattr(fn, '__name__', fn)} counts every rank's slots right on {world_size} ranks")
