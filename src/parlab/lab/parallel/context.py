"""Context parallelism from scratch: ring attention with the online-softmax rule (chapter 10).

H. Liu, M. Zaharia, P. Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
2023 (arXiv:2310.01889); the online softmax of M. Milakov, N. Gimelshein, "Online normalizer calculation
for softmax", 2018 (arXiv:1805.02867), as FlashAttention uses it (T. Dao et al. 2022, arXiv:2205.14135);
the load-balanced causal layout of Llama 3 (Dubey et al. 2024, §3.3.2) and torchtitan.

The sequence is cut among the ``cp`` ranks of a context-parallel group. Every layer but attention works
on each token alone, so it runs on the rank's own tokens. Attention needs every key for every query: each
rank keeps its queries, and the K/V blocks travel around the ring. At step i rank r holds the block of
rank (r − i) mod cp, computes its queries' scores against it, passes it on to rank r + 1 and receives the
next from rank r − 1, while it computes (the transfer is issued before the computation that does not need
it: that is why it overlaps). After cp − 1 transfers every query has seen every key.

Blocks arrive one at a time, so the softmax over all keys is built as they come (:func:`combine`): keep,
per query, the running maximum m of its scores, the running sum l of exp(score − m) and the running
weighted sum of values; when a block with a larger maximum arrives, rescale what is kept by exp(m − m_new).
The result is exact, not an approximation: out = acc / l and log-sum-exp = m + log l.

Causal attention makes contiguous chunks unfair: rank 0's queries see only their own keys, the last
rank's see everything. :class:`Layout` with ``balanced=True`` cuts the sequence into 2·cp chunks and gives
rank r chunks r and 2·cp − 1 − r (a head and a tail): every rank then does the same work at every step.

Backward is a custom ``torch.autograd.Function`` (:class:`_RingAttention`): it keeps only this rank's q, k,
v, output and log-sum-exp (all ÷ cp), and passes K/V around the ring again, each block travelling with the
gradients dK, dV that its visits accumulate; one last transfer brings those home. Every transfer goes
through ``parlab.lab.parallel.comm.communicate_batch``, so any attached ``CommLog`` counts its bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist

from parlab.lab.checks import positive_int
from parlab.lab.parallel.comm import communicate_batch


# -- which tokens each rank holds --------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Which positions of a ``seq_len``-token sequence each of ``cp`` ranks holds.

    ``balanced=False``: cp contiguous chunks. ``balanced=True``: 2·cp chunks, rank r holding chunks r and
    2·cp − 1 − r (Llama 3's and torchtitan's load balancing for causal attention). Chunks may differ by one
    token when the sequence does not divide (``torch.tensor_split``'s rule)."""

    seq_len: int
    cp: int
    balanced: bool = True

    def __post_init__(self):
        positive_int("seq_len", self.seq_len, "tokens per sequence")
        positive_int("cp", self.cp, "ranks along the cp axis")
        if self.seq_len < self.chunks:
            raise ValueError(f"seq_len={self.seq_len} is shorter than the {self.chunks} chunks the layout cuts it "
                             f"into (cp={self.cp}, balanced={self.balanced})")

    @property
    def chunks(self) -> int:
        return 2 * self.cp if self.balanced else self.cp

    @cached_property
    def _positions(self) -> list[torch.Tensor]:
        parts = torch.tensor_split(torch.arange(self.seq_len), self.chunks)
        if not self.balanced:
            return list(parts)
        return [torch.cat([parts[r], parts[2 * self.cp - 1 - r]]) for r in range(self.cp)]

    def positions(self, rank: int) -> torch.Tensor:
        """The positions (token indices) rank ``rank`` holds, in the order it holds them."""
        return self._positions[rank]

    def shard(self, x: torch.Tensor, rank: int, dim: int = -2) -> torch.Tensor:
        """Rank ``rank``'s tokens of a whole sequence ``x`` (positions along ``dim``)."""
        return x.index_select(dim, self.positions(rank).to(x.device))

    def unshard(self, parts, dim: int = -2) -> torch.Tensor:
        """The whole sequence again, from every rank's part in rank order."""
        whole = torch.cat(list(parts), dim)
        order = torch.argsort(torch.cat(self._positions))
        return whole.index_select(dim, order.to(whole.device))

    def score_pairs(self, causal: bool = True) -> list[list[int]]:
        """[rank][step]: the (query, key) pairs rank computes at each ring step, the masked ones skipped:
        the work of a kernel that skips what the causal mask hides. Arithmetic, the same as what
        :func:`ring_attention` counts when given ``work=``."""
        out = []
        for r in range(self.cp):
            q = self.positions(r)
            out.append([int(_mask(q, self.positions((r - i) % self.cp), causal).sum()) if causal
                        else len(q) * len(self.positions((r - i) % self.cp)) for i in range(self.cp)])
        return out


    def computed_pairs(self, tiles: bool = False) -> list[list[int]]:
        """[rank][step]: the (query, key) pairs a causal kernel *computes*, masked ones included.
        ``tiles=False``: :func:`ring_attention`'s kernel, which computes a whole block unless the mask hides
        all of it. ``tiles=True``: a kernel that works chunk by chunk and skips the chunk pairs the mask
        hides: against an earlier rank's block (head j, tail 2·cp−1−j) only its head chunk of K/V is
        visible, against a later rank's only one's own tail queries, so it computes half a block; in
        balanced mode the whole-block kernel does about twice the needed work (:meth:`score_pairs`)."""
        parts = torch.tensor_split(torch.arange(self.seq_len), self.chunks)
        owned = [[parts[r], parts[2 * self.cp - 1 - r]] if self.balanced else [parts[r]] for r in range(self.cp)]
        out = []
        for r in range(self.cp):
            row = []
            for i in range(self.cp):
                qs, ks = (owned[r], owned[(r - i) % self.cp]) if tiles else ([self.positions(r)],
                                                                            [self.positions((r - i) % self.cp)])
                row.append(sum(len(q) * len(k) for q in qs for k in ks if bool(_mask(q, k, True).any())))
            out.append(row)
        return out


def imbalance(pairs) -> float:
    """The busiest rank's work over the mean (``pairs``: :meth:`Layout.score_pairs`): how much longer the
    layer takes than it would if the work were shared evenly, since the next collective waits for the last
    rank. 1.0 for the balanced layout; about 2 − 1/cp for contiguous causal chunks."""
    totals = [sum(row) for row in pairs]
    return max(totals) / (sum(totals) / len(totals))


def _mask(q_pos, k_pos, causal):
    """(n_q, n_k) True where query may see key: every key, or (causal) those at or before it."""
    if not causal:
        return None
    return q_pos[:, None] >= k_pos[None, :]


# -- one block, and the online-softmax rule -----------------------------------------------------------

def block_attention(q, k, v, mask, scale):
    """One query block against one key block: (m, l, acc), the block's own running state.

    m: (b, h, n, 1) the row maxima of the scores; l: Σ exp(score − m); acc: Σ exp(score − m)·v, (b, h, n, d).
    A row that the mask hides entirely has m = −inf, l = 0 and acc = 0."""
    s = (q @ k.transpose(-1, -2)) * scale  # (b, h, n_q, n_k)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))  # a hidden row: exp(−inf) = 0, not nan
    return m, p.sum(-1, keepdim=True), p @ v


def combine(m1, l1, acc1, m2, l2, acc2):
    """The online-softmax rule: the state of two key blocks together from each one's (m, l, acc).

    Both are rescaled to the larger maximum: exp(m1 − m) and exp(m2 − m) are at most 1, so nothing
    overflows, and the result is exact (Milakov & Gimelshein 2018)."""
    m = torch.maximum(m1, m2)
    m_safe = torch.where(torch.isinf(m), 0.0, m)  # both rows hidden so far: keep zeros, not nan
    a1, a2 = torch.exp(m1 - m_safe), torch.exp(m2 - m_safe)
    return m, l1 * a1 + l2 * a2, acc1 * a1 + acc2 * a2


def _expand(kv, heads):
    """Grouped-query attention: each of the g K/V heads serves heads/g query heads. (b, g, n, d) -> (b, h, n, d)"""
    return kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _fold(grad, kv_heads):
    """The gradient of :func:`_expand`: sum each group's query heads. (b, h, n, d) -> (b, g, n, d)"""
    b, h, n, d = grad.shape
    return grad.view(b, kv_heads, h // kv_heads, n, d).sum(2)


# -- the ring ---------------------------------------------------------------------------------------------

def ring_source(rank: int, step: int, cp: int) -> int:
    """Whose K/V block ``rank`` holds at ring step ``step`` (0: its own): each step passes every block on to
    rank + 1, so the block of rank (rank − step) mod cp has arrived. The ring and its picture both use it."""
    return (rank - step) % cp


class _Ring:
    """This rank's place on the cp ring: pass a tensor on to rank r + 1, receive one from rank r − 1."""

    def __init__(self, group):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def source(self, step):
        return ring_source(self.rank, step, self.size)

    def shift(self, tensor, recv_shape, label):
        """Start sending ``tensor`` on and receiving the next; returns (buffer, wait). Read the buffer
        only after ``wait()``: until then the transfer runs beside whatever this rank computes."""
        buf = tensor.new_empty(recv_shape)
        works = communicate_batch([("send", tensor.contiguous(), (self.rank + 1) % self.size, label),
                                   ("recv", buf, (self.rank - 1) % self.size, label)], self.group)
        return buf, lambda: [w.wait() for w in works]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, group, causal, combine_fn, work):
        ring = _Ring(group)
        h, scale = q.shape[1], q.shape[-1] ** -0.5
        q_pos = layout.positions(ring.rank).to(q.device)
        kv = torch.stack([k, v])  # (2, b, g, n, d): one message per step
        state = None
        for step in range(ring.size):
            src = ring.source(step)
            if step + 1 < ring.size:  # the next block is on its way while this one is computed
                n_next = len(layout.positions(ring.source(step + 1)))
                nxt, wait = ring.shift(kv, (*kv.shape[:3], n_next, kv.shape[-1]), f"kv forward step {step}")
            mask = _mask(q_pos, layout.positions(src).to(q.device), causal)
            if mask is None or bool(mask.any()):  # a block the causal mask hides entirely is skipped
                block = block_attention(q, _expand(kv[0], h), _expand(kv[1], h), mask, scale)
                state = block if state is None else combine_fn(*state, *block)
            if work is not None:
                work.append(int(mask.sum()) if mask is not None else q.shape[-2] * kv.shape[-2])
            if step + 1 < ring.size:
                wait()
                kv = nxt
        m, l, acc = state
        out = acc / l
        lse = m + torch.log(l)  # (b, h, n, 1): all that backward needs of the softmax
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.group, ctx.causal = layout, group, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        layout, g, h, scale = ctx.layout, k.shape[1], q.shape[1], q.shape[-1] ** -0.5
        q_pos = layout.positions(ring.rank).to(q.device)
        delta = (dout * out).sum(-1, keepdim=True)  # (b, h, n, 1): Σ_j P_ij dP_ij, FlashAttention's D
        dq = torch.zeros_like(q)
        kv, dkv = torch.stack([k, v]), torch.zeros((2, *k.shape), dtype=k.dtype, device=k.device)
        for step in range(ring.size):
            src = ring.source(step)
            if step + 1 < ring.size:  # K/V go on ahead; their gradients follow once this step adds to them
                n_next = len(layout.positions(ring.source(step + 1)))
                nxt, wait = ring.shift(kv, (*kv.shape[:3], n_next, kv.shape[-1]), f"kv backward step {step}")
            mask = _mask(q_pos, layout.positions(src).to(q.device), ctx.causal)
            if mask is None or bool(mask.any()):
                kb, vb = _expand(kv[0], h), _expand(kv[1], h)
                s = (q @ kb.transpose(-1, -2)) * scale
                if mask is not None:
                    s = s.masked_fill(~mask, -math.inf)
                p = torch.exp(s - lse)  # the softmax itself, rebuilt from the log-sum-exp
                ds = p * (dout @ vb.transpose(-1, -2) - delta)
                dq += (ds @ kb) * scale
                dkv = dkv + torch.stack([_fold(ds.transpose(-1, -2) @ q * scale, g),
                                         _fold(p.transpose(-1, -2) @ dout, g)])
            # dK, dV of block ``src`` move on with it; after the last step one more transfer takes them home
            dkv_next, wait_grad = ring.shift(dkv, (*dkv.shape[:3], len(layout.positions(ring.source(step + 1))),
                                                   dkv.shape[-1]), f"dkv backward step {step}") \
                if ring.size > 1 else (dkv, lambda: None)
            if step + 1 < ring.size:
                wait()
                kv = nxt
            wait_grad()
            dkv = dkv_next
        return dq, dkv[0], dkv[1], None, None, None, None, None


def ring_attention(q, k, v, layout: Layout, group=None, *, causal: bool = True, combine_fn=combine,
                   work: list | None = None):
    """Attention of this rank's queries over the whole sequence, K/V blocks passed around the cp ring.

    q: (b, heads, n, d), this rank's n tokens (``layout.positions(rank)``); k, v: (b, kv_heads, n, d), the
    same tokens' keys and values (grouped-query attention when kv_heads < heads). Returns (b, heads, n, d):
    this rank's rows of softmax(q·kᵀ/√d)·v over all seq_len keys (causal: those at or before each query).
    group: the cp group (``Topology.group("cp")``; default every rank). combine_fn: the online-softmax rule
    (:func:`combine`; chapter 10's exercise passes its own). work: a list to which each step appends the
    visible (query, key) pairs of its block: the work of a kernel that skips masked tiles (this one skips
    only blocks the mask hides entirely, and masks the rest)."""
    n = dist.get_world_size(group)
    if layout.cp != n:
        raise ValueError(f"layout.cp={layout.cp} but the cp group has {n} ranks")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"heads={q.shape[1]} is not a multiple of kv_heads={k.shape[1]}")
    mine = len(layout.positions(dist.get_rank(group)))
    if q.shape[-2] != mine or k.shape[-2] != mine or v.shape[-2] != mine:
        raise ValueError(f"this rank holds {mine} tokens of the layout; got q, k, v with {q.shape[-2]}, "
                         f"{k.shape[-2]}, {v.shape[-2]} (shape (batch, heads, tokens, head_dim))")
    return _RingAttention.apply(q, k, v, layout, group, causal, combine_fn, work)


# -- what it costs: bytes, memory, and when it pays ------------------------------------------------------

def ring_bytes(layout: Layout, rank: int, batch: int, kv_heads: int, head_dim: int, element_size: int = 4) -> dict:
    """Bytes rank ``rank`` sends per attention layer: forward, K and V of each block it holds but the
    last (cp − 1 messages); backward, K/V again (cp − 1) and their gradients dK, dV (cp messages)."""
    per_token = 2 * batch * kv_heads * head_dim * element_size  # K and V of one token
    held = [len(layout.positions((rank - i) % layout.cp)) for i in range(layout.cp)]  # block at each step
    if layout.cp == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": per_token * sum(held[:-1]), "backward": per_token * (sum(held[:-1]) + sum(held))}


@dataclass(frozen=True)
class CPStep:
    """One ring step of one attention layer, forward, by the α-β model: ``compute_s`` (this rank's scores
    and weighted values against one block), ``comm_s`` (one K/V block to the next rank), and what is
    exposed when the transfer runs beside the computation."""

    chunk: int
    compute_s: float
    comm_s: float

    @property
    def exposed_s(self) -> float:
        return max(0.0, self.comm_s - self.compute_s)

    @property
    def overlapped(self) -> bool:
        return self.comm_s <= self.compute_s


def cp_step(seq_len: int, cp: int, *, heads: int, kv_heads: int, head_dim: int, batch: int = 1,
            value_bytes: int = 2, flops: float, alpha: float, bandwidth: float, causal: bool = True,
            backward: bool = False) -> CPStep:
    """The α-β model of one ring step: a block of n = seq_len/cp queries against n keys costs
    4·b·h·n²·d FLOPs (two matmuls; half of it under a balanced causal mask) at ``flops`` FLOP/s, and its
    K/V block, 2·b·g·n·d values, takes α + bytes/B. Compute grows with n², traffic with n: past some
    chunk length the transfer hides behind the computation. ``backward=True``: the backward step, five
    matmuls instead of two (FlashAttention-2's count: 2.5× the FLOPs) and two blocks on the move, K/V
    and dK/dV (twice the bytes), if the dK/dV transfer overlaps too (in :class:`_RingAttention` it does
    not: it is sent after the step's computation and waited for before the next)."""
    n = seq_len / cp
    work = 4 * batch * heads * n * n * head_dim * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    traffic = 2 * batch * kv_heads * n * head_dim * value_bytes * (2 if backward else 1)
    return CPStep(int(n), work / flops, alpha + traffic / bandwidth)


def overlap_chunk(*, heads: int, kv_heads: int, head_dim: int, value_bytes: int = 2, flops: float,
                  bandwidth: float, causal: bool = True, backward: bool = False) -> float:
    """The chunk length n (tokens per rank) from which one step's compute covers its transfer (α ignored):
    4·h·n²·d·c / F = 2·g·n·d·e / B  ⇒  n = g·e·F / (2·h·c·B), c = ½ when causal. ``backward=True``
    (:func:`cp_step`'s backward: 2.5× the FLOPs, 2× the bytes): n* × 2 / 2.5."""
    c = 0.5 if causal else 1.0
    return kv_heads * value_bytes * flops / (2 * heads * c * bandwidth) * (2 / 2.5 if backward else 1.0)


def compare_with_pytorch(seq_len: int = 64, batch: int = 2, heads: int = 4, head_dim: int = 16, seed: int = 0) -> dict:
    """On every rank of a GPU process group (NCCL): PyTorch's own context parallelism
    (``torch.distributed.tensor.experimental.context_parallel``, which refuses CPU attention) beside
    :func:`ring_attention`, both against full causal attention. Returns whether PyTorch's shard of the
    sequence is this :class:`Layout`'s, and each one's largest difference from full attention (bf16 inputs)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    from parlab.lab import runtime
    device, r, n = runtime.device(), dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=g).to(device, torch.bfloat16) for _ in range(3))
    where = torch.arange(seq_len, dtype=torch.float32, device=device).view(1, 1, seq_len, 1)  # which token is where
    full = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    mesh = init_device_mesh(device.type, (n,), mesh_dim_names=("cp",))
    layout = Layout(seq_len, n)
    mine = ring_attention(*(layout.shard(t.float(), r) for t in (q, k, v)), layout, mesh.get_group())
    from parlab.lab.launch import simgpu

    if simgpu.active():  # simulated GPUs: the attention below would run CPU kernels, which CP refuses
        raise simgpu.NeedsRealGPU("PyTorch's context_parallel (it shards CUDA attention kernels only)")
    buffers = [q.clone(), k.clone(), v.clone(), where.clone()]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2]):  # shards them in place
        theirs = F.scaled_dot_product_attention(*buffers[:3], is_causal=True).float()
        positions = buffers[3][0, 0, :, 0].long().cpu()
    return {"same_layout": torch.equal(positions, layout.positions(r)),
            "pytorch_vs_full": (theirs - full[:, :, positions.to(device)]).abs().max().item(),
            "ring_vs_full": (mine - layout.shard(full, r)).abs().max().item()}
