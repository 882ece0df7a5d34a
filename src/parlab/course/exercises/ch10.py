"""Chapter 10's exercises: the online-softmax rule, run inside the ring on N ranks against full attention;
how many token slots each rank's experts receive from one rank, under top-k routing with a capacity; and a
dropless layer's dispatch plan (the order of the rows and the split sizes), sent by ``all_to_all_single``."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, _name, first_difference, refusing
from parlab.lab.language import say

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
        return say("combine is not written yet (it raises NotImplementedError)")
    except RuntimeError as error:
        if "ambiguous" not in str(error):
            raise
        return say("your combine compared whole tensors (Python's max(m1, m2) or an if on a tensor: 'Boolean "
                   "value of Tensor ... is ambiguous'); take the larger maximum row by row with torch.maximum(m1, m2)")
    if not (isinstance(got, tuple) and len(got) == 3):
        return say("combine returned {type}; return the tuple (m, l, acc)", type=type(got).__name__)
    m, l, acc = got
    if not torch.allclose(m, torch.maximum(m1, m2)):
        return say("m is not the larger of the two maxima")
    if torch.allclose(l, l1 + l2) or torch.allclose(acc, a1 + a2):
        return say("l or acc is a plain sum: each block's l and acc are relative to its own maximum; rescale each by "
                   "exp(its m − the new m) before adding")
    problem = first_difference(acc / l, out, atol=1e-9)
    if problem:
        return say("acc / l is not the softmax-weighted sum of both blocks' values: {problem}", problem=problem)
    problem = first_difference(m + torch.log(l), lse, atol=1e-9)
    return say("m + log l is not the log-sum-exp of both blocks' scores: {problem}",
               problem=problem) if problem else None


def _own_combine() -> str:
    """Why the package's combine is refused, in the learner's language."""
    return say("write the online-softmax rule yourself, from the two blocks' m, l and acc")


def _ring_with(fn):
    from parlab.lab.parallel import context as cpx

    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(4)
    q = torch.randn(B, HEADS, SEQ, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, KV_HEADS, SEQ, D, generator=g, dtype=torch.float64) for _ in range(2))
    layout = cpx.Layout(SEQ, n)
    try:
        with refusing("ch10.1", _own_combine()):
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
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    try:
        with refusing("ch10.1", _own_combine()):
            problem = _diagnose_two_blocks(fn)  # in this process first: a wrong rule fails without launching
    except ExerciseFailed as refused:
        problem = str(refused)
    if problem:
        raise ExerciseFailed(say("{fn}: {problem}", fn=_name(fn), problem=problem))
    results = parlab.launch(_ring_with, world_size=world_size, args=(fn,), output="none", announce=False)
    for rank, res in enumerate(results):
        if res["problem"]:
            raise ExerciseFailed(say("{fn} on rank {rank} of {world_size}: {problem}", fn=_name(fn), rank=rank,
                                     world_size=world_size, problem=res['problem']))
    return Passed(say("{fn}: two blocks combine exactly, and ring attention with it matches full attention on all "
                      "{world_size} ranks", fn=_name(fn), world_size=world_size))


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
        with refusing("ch10.2", say("count the slots yourself from routing.expert, in the priority order stated")):
            got = fn(routing.expert.clone(), EXPERTS, n, CAPACITY)
    except NotImplementedError:
        return {"problem": say("received is not written yet (it raises NotImplementedError)")}
    except ExerciseFailed as refused:
        return {"problem": str(refused)}
    got = [int(x) for x in got] if isinstance(got, (list, tuple, torch.Tensor)) else got
    if got == want:
        return {"problem": None}
    hint = next((why for wrong, why in _received_mistakes(routing.expert, n) if got == wrong), "")
    return {"problem": say("expected {want} slots per rank, got {got}{hint}", want=want, got=got, hint=hint)}


def _received_mistakes(expert, n):
    """(answer, why) of the plausible mistakes, in the order they are told apart."""
    from parlab.lab.parallel import expert as epx

    place = epx.placement(EXPERTS, n)

    def per_rank(counts, blocks=place, cap=CAPACITY):
        return [int(counts[list(b)].clamp(max=cap).sum()) for b in blocks]

    counts = torch.bincount(expert.flatten(), minlength=EXPERTS)
    whole = [int(counts[p.start:p.stop].sum()) for p in place]
    tokens = [sum(bool(((expert >= p.start) & (expert < p.stop))[t].any()) for t in range(len(expert)))
              for p in place]
    spread = [range(r, EXPERTS, n) for r in range(n)]  # expert e on rank e mod ep
    cap_rank = say(" (that caps each rank's total: the capacity is per expert; cap each expert's count at "
                   "capacity, then add up the experts a rank holds)")
    return [
        (whole, say(" (that counts dropped tokens too: an expert keeps at most capacity of them)")),
        ([min(c, CAPACITY) for c in whole], cap_rank),
        ([min(c, CAPACITY * len(p)) for c, p in zip(whole, place)], cap_rank),
        (per_rank(torch.bincount(expert[:, 0], minlength=EXPERTS)),
         say(" (that counts first choices only, column 0: each token makes k assignments, one per column)")),
        *((answer, say(" (that counts tokens: a token whose k choices land on one rank fills k slots there; count "
                       "assignments, each expert's capped at capacity)"))
          for answer in (tokens, [min(c, CAPACITY * len(p)) for c, p in zip(tokens, place)])),
        (per_rank(counts, spread),
         say(" (that places expert e on rank e mod ep: the experts sit in contiguous blocks, epx.placement)")),
        (counts.clamp(max=CAPACITY).tolist(),
         say(" (one count per expert: add up the experts each rank holds, one number per rank)")),
    ]


def check_received(fn, world_size: int = 2) -> Passed:
    """``fn(expert (T, k), num_experts, ep, capacity) -> [slots per rank]``: of this rank's assignments, how
    many each of the ``ep`` ranks' experts compute (contiguous placement; an expert keeps at most
    ``capacity``: the priority order decides which assignments are dropped, not how many). Checked on every
    rank's own routing."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    for rank, res in enumerate(parlab.launch(_counts_on_rank, world_size=world_size, args=(fn,), output="none",
                                             announce=False)):
        if res["problem"]:
            raise ExerciseFailed(say("{fn} on rank {rank} of {world_size}: {problem}", fn=_name(fn), rank=rank,
                                     world_size=world_size, problem=res['problem']))
    return Passed(say("{fn} counts every rank's slots right on {world_size} ranks", fn=_name(fn),
                      world_size=world_size))


# -- 3. the dropless dispatch: what all_to_all_single sends where -------------------------------------

def _own_plan() -> str:
    """Why the package's dispatch is refused, in the learner's language."""
    return say("sort the assignments and count each rank's rows yourself, from expert")


def _plan_problem(got, expert, place, n):
    """Why (order, send) would not send each assignment's row to its expert's rank, grouped by expert."""
    tokens, k = expert.shape
    flat = expert.flatten()  # assignment a: token a // k, choice a % k
    rank_of = torch.tensor([r for r, block in enumerate(place) for _ in block])
    want = torch.bincount(rank_of[flat], minlength=n).tolist()
    if not (isinstance(got, tuple) and len(got) == 2):
        return say("returned {type}; return the tuple (order, send)", type=type(got).__name__)
    order, send = got
    order = torch.as_tensor(order).flatten().long()
    send = [int(x) for x in send] if isinstance(send, (list, tuple, torch.Tensor)) else send
    if not isinstance(send, list):
        return say("send is {type}; return one row count per rank, a list of {n} ints", type=type(send).__name__,
                   n=n)
    if len(send) == EXPERTS != n:
        return say("send has {experts} entries, one per expert: all_to_all_single takes one split per rank; add up "
                   "the experts each rank holds ({n} entries)", experts=EXPERTS, n=n)
    if len(send) != n:
        return say("send has {count} entries; all_to_all_single takes one split per rank: {n}", count=len(send),
                   n=n)
    if send != want:
        counts = torch.bincount(flat, minlength=EXPERTS)
        if sum(send) == tokens:
            return say("send {send} adds up to the {tokens} tokens: every token sends one row per choice, {rows} in "
                       "all (expected {want})", send=send, tokens=tokens, rows=tokens * k, want=want)
        if send == [sum(bool(((expert >= b.start) & (expert < b.stop))[t].any()) for t in range(tokens)) for b in place]:
            return say("send {send} counts tokens: a token whose k choices land on one rank sends k rows there, one "
                       "per assignment (expected {want})", send=send, want=want)
        if send == [int(counts[r::n].sum()) for r in range(n)]:
            return say("send {send} places expert e on rank e mod ep: the experts sit in contiguous blocks, "
                       "epx.placement (expected {want})", send=send, want=want)
        return say("send should be {want} rows per rank, got {send}", want=want, send=send)
    if order.numel() == tokens:
        return say("order has {tokens} entries, one per token: it needs {rows}, one per assignment (a token sends a "
                   "row to each of its k experts)", tokens=tokens, rows=tokens * k)
    if order.numel() == flat.numel() and torch.equal(order.sort().values, torch.arange(flat.numel()) // k):
        return say("order holds token indices (a // k): return the assignments a themselves, so that each row's "
                   "expert is known; the token is a // k")
    if order.numel() != flat.numel() or not torch.equal(order.sort().values, torch.arange(flat.numel())):
        return say("order must hold each assignment 0 … {last} once (T·k = {tokens}·{k}), got {order}",
                   last=flat.numel() - 1, tokens=tokens, k=k, order=order.tolist())
    if bool((flat[order].diff() >= 0).all()):
        return None
    if bool((expert.t().flatten()[order].diff() >= 0).all()):
        return say("order indexes expert.t().flatten(), choice by choice: index expert.flatten(), where assignment "
                   "a is token a // k's choice a % k")
    if torch.equal(order, torch.arange(flat.numel())):
        return say("order is the assignments as they come, token by token: sort them by expert, so that each "
                   "rank's rows are consecutive and all_to_all_single's splits cut them right")
    if bool((flat[order].diff() <= 0).all()):
        return say("order sorts the experts from last to first: the first send[0] rows go to rank 0, so ascending")
    if bool((rank_of[flat[order]].diff() >= 0).all()):
        return say("each rank's rows are together, but not sorted by expert within it: the receiving rank cuts its "
                   "rows into experts by their counts")
    return say("order does not sort the assignments by expert: flat[order] must never decrease")


def _routed(rank):
    """Rank ``rank``'s (T, k) expert choices; ranks hold different numbers of tokens, so every split differs."""
    g = torch.Generator().manual_seed(40 + rank)
    tokens = 10 + 3 * rank
    return (torch.randn(tokens, EXPERTS, generator=g) + torch.linspace(0, 2, EXPERTS)).topk(TOP_K, dim=-1).indices


def _plan_of(fn, rank, n):
    """(plan, problem) of ``fn`` on rank ``rank``'s routing, refused the package's answer."""
    from parlab.lab.parallel import expert as epx

    expert = _routed(rank)
    try:
        with refusing("ch10.3", _own_plan()):
            got = fn(expert.clone(), EXPERTS, n)
        return got, _plan_problem(got, expert, epx.placement(EXPERTS, n), n)
    except NotImplementedError:
        return None, say("dispatch_plan is not written yet (it raises NotImplementedError)")
    except ExerciseFailed as refused:
        return None, str(refused)


def _dispatch_on_rank(fn):
    from parlab.lab.parallel import expert as epx

    r, n = dist.get_rank(), dist.get_world_size()
    expert, place = _routed(r), epx.placement(EXPERTS, n)
    got, problem = _plan_of(fn, r, n)
    fine = torch.tensor([problem is None], dtype=torch.int64)
    dist.all_reduce(fine, op=dist.ReduceOp.MIN)  # every rank sends, or none: a bad plan must not hang the others
    if not fine.item():
        return {"problem": problem}
    order, send = torch.as_tensor(got[0]).flatten().long(), [int(x) for x in got[1]]
    recv = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(recv, torch.tensor(send, dtype=torch.int64))  # how many rows come from each rank
    rows = torch.stack([torch.full_like(order, r), order // TOP_K, expert.flatten()[order]], 1)  # (rank, token, e)
    arrived = rows.new_empty(int(recv.sum()), 3)
    dist.all_to_all_single(arrived, rows, recv.tolist(), send)
    mine = place[r]
    wrong = arrived[(arrived[:, 2] < mine.start) | (arrived[:, 2] >= mine.stop)]
    if len(wrong):
        return {"problem": say("received a row for expert {expert}, which rank {rank} does not hold",
                               expert=int(wrong[0, 2]), rank=r)}
    return {"problem": None, "arrived": arrived}


def _expected_arrivals(n):
    """(rank, token, expert) of every assignment each rank's experts receive, source by source."""
    from parlab.lab.parallel import expert as epx

    place, out = epx.placement(EXPERTS, n), [[] for _ in range(n)]
    for src in range(n):
        expert = _routed(src)
        for dst, block in enumerate(place):
            out[dst] += sorted((src, a // TOP_K, int(e)) for a, e in enumerate(expert.flatten().tolist()) if e in block)
    return out


def check_dispatch_plan(fn, world_size: int = 2) -> Passed:
    """``fn(expert (T, k), num_experts, ep) -> (order, send)``: a dropless layer's dispatch. ``order`` (T·k,)
    the assignments sorted by expert (assignment a is token a // k's choice a % k), ``send`` the rows for
    each of the ``ep`` ranks (contiguous placement, ``epx.placement``). Each rank holds another number of
    tokens; the check sends every assignment's (rank, token, expert) with ``all_to_all_single`` and your
    splits, and looks at what each rank's experts receive."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    name = _name(fn)
    _, problem = _plan_of(fn, 0, world_size)  # rank 0's plan in this process first: a wrong one fails at once
    if problem:
        raise ExerciseFailed(say("{fn} on rank {rank} of {world_size}: {problem}", fn=name, rank=0,
                                 world_size=world_size, problem=problem))
    results = parlab.launch(_dispatch_on_rank, world_size=world_size, args=(fn,), output="none", announce=False)
    for rank, res in enumerate(results):
        if res["problem"]:
            raise ExerciseFailed(say("{fn} on rank {rank} of {world_size}: {problem}", fn=name, rank=rank,
                                     world_size=world_size, problem=res['problem']))
    for rank, (res, want) in enumerate(zip(results, _expected_arrivals(world_size))):
        got = sorted(tuple(int(v) for v in row) for row in res["arrived"])
        if got != want:
            raise ExerciseFailed(say("{fn}: rank {rank}'s experts received {got} rows, expected {want}: (rank, "
                                     "token, expert) {missing} missing", fn=name, rank=rank, got=len(got),
                                     want=len(want), missing=sorted(set(want) - set(got))[:3]))
    return Passed(say("{fn}: every assignment reaches its expert's rank, grouped by expert, on {world_size} ranks",
                      fn=name, world_size=world_size))
