"""Ring attention (``parlab.lab.parallel.context``, chapter 10) against full attention in one process
(PyTorch's ``scaled_dot_product_attention``): outputs and gradients of q, k, v, at cp 2, 3 and 4, with
grouped-query attention, causal (contiguous and load-balanced) and not, sequences that do not divide;
bytes sent against ``ring_bytes``, work per rank against ``Layout.score_pairs``, memory kept for backward
against the formula; a planted bug (the online softmax without its max correction) caught by a wide margin;
the pairs the kernel computes (whole blocks) against a head-and-tail-aware kernel's; the backward α-β model.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing import assert_close

import parlab
from parlab.lab.measure import CommLog
from parlab.lab.parallel import context as cpx

B, HEADS, KV_HEADS, D = 2, 4, 2, 8
CASES = [(s, causal, balanced) for s in (16, 19) for causal, balanced in ((True, True), (True, False), (False, True))]


def whole(seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HEADS, seq_len, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, KV_HEADS, seq_len, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, KV_HEADS, seq_len, D, generator=g, dtype=torch.float64)
    dout = torch.randn(B, HEADS, seq_len, D, generator=g, dtype=torch.float64)  # weighs every output
    return q, k, v, dout


def reference(seq_len, causal):
    q, k, v, dout = (t.requires_grad_() if i < 3 else t for i, t in enumerate(whole(seq_len)))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _on_ranks(cases, combine_fn=cpx.combine):
    r, n = dist.get_rank(), dist.get_world_size()
    results = []
    for seq_len, causal, balanced in cases:
        layout = cpx.Layout(seq_len, n, balanced)
        q, k, v, dout = (layout.shard(t, r).clone().requires_grad_(i < 3) for i, t in enumerate(whole(seq_len)))
        work, saved = [], []

        def pack(t):
            saved.append(t.untyped_storage().nbytes())
            return t

        with CommLog() as log:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = cpx.ring_attention(q, k, v, layout, causal=causal, work=work, combine_fn=combine_fn)
            n_forward = len(log.records)
            out.backward(dout)
        sent = [(rec.label, rec.bytes) for rec in log.records if rec.op == "send"]
        results.append({"out": out.detach(), "grads": (q.grad, k.grad, v.grad), "sent": sent,
                        "forward_records": n_forward, "work": work, "saved": sum(saved)})
    return results


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"cp{n}")
def run(request):
    return request.param, parlab.launch(_on_ranks, world_size=request.param, args=(CASES,), announce=False,
                                        output="none")


def test_outputs_and_gradients_match_full_attention(run):
    n, results = run
    for i, (seq_len, causal, balanced) in enumerate(CASES):
        layout = cpx.Layout(seq_len, n, balanced)
        ref = reference(seq_len, causal)
        got = [layout.unshard([results[r][i]["out"] for r in range(n)])]
        got += [layout.unshard([results[r][i]["grads"][j] for r in range(n)]) for j in range(3)]
        for name, g, e in zip(("out", "dq", "dk", "dv"), got, ref):
            assert_close(g, e, msg=lambda m: f"{name}, seq_len={seq_len} causal={causal} balanced={balanced}: {m}")


def test_bytes_per_step_match_the_formula(run):
    n, results = run
    for i, (seq_len, causal, balanced) in enumerate(CASES):
        layout = cpx.Layout(seq_len, n, balanced)
        for r in range(n):
            sent = results[r][i]["sent"]
            expected = cpx.ring_bytes(layout, r, B, KV_HEADS, D, element_size=8)
            forward = sum(b for label, b in sent if "forward" in label)
            assert forward == expected["forward"] and sum(b for _, b in sent) - forward == expected["backward"]
            assert sum("forward" in label for label, _ in sent) == n - 1  # cp − 1 K/V blocks forward
            if seq_len % (2 * n) == 0:  # even chunks: (cp − 1) · 2·b·g·(s/cp)·d values forward
                assert forward == (n - 1) * 2 * B * KV_HEADS * (seq_len // n) * D * 8


def test_work_per_rank_is_counted_and_balanced(run):
    n, results = run
    for i, (seq_len, causal, balanced) in enumerate(CASES):
        layout = cpx.Layout(seq_len, n, balanced)
        counted = [results[r][i]["work"] for r in range(n)]
        assert counted == layout.score_pairs(causal)
        total = seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len
        assert sum(map(sum, counted)) == total  # every visible pair once, none twice
    s = 8 * n  # chunks of whole tokens: contiguous c = s/cp, balanced s/(2·cp)
    contiguous, balanced = cpx.Layout(s, n, False).score_pairs(), cpx.Layout(s, n, True).score_pairs()
    assert len({sum(row) for row in balanced}) == 1  # every rank the same work in all
    assert all(len(set(step)) == 1 for step in zip(*balanced))  # ... at every step
    c = s // n  # contiguous: rank r sees r whole chunks before its own, and half of its own
    assert [sum(row) for row in contiguous] == [r * c * c + c * (c + 1) // 2 for r in range(n)]
    assert cpx.imbalance(balanced) == 1.0
    # the last rank's work, (cp−1)·c² + c(c+1)/2, over the mean
    assert cpx.imbalance(contiguous) == pytest.approx((c * (c + 1) / 2 + (n - 1) * c * c) / (s * (s + 1) / 2 / n))


def test_memory_kept_for_backward_is_this_ranks_share(run):
    n, results = run
    for i, (seq_len, causal, balanced) in enumerate(CASES):
        layout = cpx.Layout(seq_len, n, balanced)
        for r in range(n):
            t = len(layout.positions(r))
            # q, out (b, h, t, d); k, v (b, g, t, d); lse (b, h, t, 1); float64
            assert results[r][i]["saved"] == B * t * (2 * HEADS * D + 2 * KV_HEADS * D + HEADS) * 8


def test_a_planted_bug_is_caught_by_a_wide_margin():
    def no_max_correction(m1, l1, acc1, m2, l2, acc2):  # forgets to rescale by exp(m_old − m_new)
        return torch.maximum(m1, m2), l1 + l2, acc1 + acc2

    seq_len, n = 16, 2
    results = parlab.launch(_on_ranks, world_size=n, args=([(seq_len, True, True)], no_max_correction),
                            announce=False, output="none")
    layout = cpx.Layout(seq_len, n)
    got = layout.unshard([results[r][0]["out"] for r in range(n)])
    error = (got - reference(seq_len, True)[0]).abs().max().item()
    assert error > 1e3 * 1e-5, f"max error {error:.3g}: the bug hides within assert_close's tolerance"
    print(f"planted bug (no max correction): max error {error:.3g}, {error / 1e-5:.0f}× the 1e-5 tolerance")


def test_cp_model_overlaps_past_the_crossover():
    kw = dict(heads=32, kv_heads=8, head_dim=128, flops=400e12, bandwidth=50e9)
    n_star = cpx.overlap_chunk(**kw)
    below = cpx.cp_step(int(n_star / 2) * 8, 8, alpha=0.0, **kw)
    above = cpx.cp_step(int(n_star * 2) * 8, 8, alpha=0.0, **kw)
    assert not below.overlapped and above.overlapped
    at = cpx.cp_step(int(n_star) * 8, 8, alpha=0.0, **kw)
    assert at.compute_s == pytest.approx(at.comm_s, rel=0.01)


def test_layout_checks_its_input():
    with pytest.raises(ValueError, match="seq_len=3 is shorter than the 4 chunks"):
        cpx.Layout(3, 2)
    lay = cpx.Layout(10, 2)
    assert lay.positions(0).tolist() == [0, 1, 2, 8, 9] and lay.positions(1).tolist() == [3, 4, 5, 6, 7]
    x = torch.arange(10.0)[:, None]
    assert torch.equal(lay.unshard([lay.shard(x, 0), lay.shard(x, 1)]), x)


def test_backward_model_and_its_crossover():
    kw = dict(heads=32, kv_heads=8, head_dim=128, flops=400e12, bandwidth=50e9)
    fwd, bwd = cpx.overlap_chunk(**kw), cpx.overlap_chunk(backward=True, **kw)
    assert bwd == pytest.approx(fwd * 0.8)
    at = cpx.cp_step(int(bwd) * 8, 8, alpha=0.0, backward=True, **kw)
    assert at.compute_s == pytest.approx(at.comm_s, rel=0.01)
    step = cpx.cp_step(4096, 8, alpha=0.0, **kw)
    back = cpx.cp_step(4096, 8, alpha=0.0, backward=True, **kw)
    assert back.compute_s == pytest.approx(2.5 * step.compute_s) and back.comm_s == pytest.approx(2 * step.comm_s)


def _count_computed(seq_len):
    r, n, computed = dist.get_rank(), dist.get_world_size(), []
    layout = cpx.Layout(seq_len, n)
    real = cpx.block_attention

    def counting(q, k, v, mask, scale):  # the kernel computes every pair of the block it is handed
        computed.append(q.shape[-2] * k.shape[-2])
        return real(q, k, v, mask, scale)

    cpx.block_attention = counting
    q, k, v, _ = (layout.shard(t, r) for t in whole(seq_len))
    cpx.ring_attention(q, k, v, layout)
    return computed


@pytest.mark.parametrize("n", [2, 3, 4])
def test_head_and_tail_kernel_computes_half_of_what_whole_blocks_do(n):
    seq_len = 8 * n  # chunks of 4 tokens
    layout = cpx.Layout(seq_len, n)
    measured = parlab.launch(_count_computed, world_size=n, args=(seq_len,), announce=False, output="none")
    assert measured == layout.computed_pairs()  # every step computes a whole block: (2c)² pairs
    whole_blocks, tiles = (sum(map(sum, rows)) for rows in (layout.computed_pairs(), layout.computed_pairs(tiles=True)))
    visible, c = seq_len * (seq_len + 1) // 2, seq_len // (2 * n)
    assert whole_blocks == n * n * (2 * c) ** 2  # cp steps of (2c)² on each of cp ranks: ≈ 2 × visible
    assert tiles - visible == n * c * (c - 1)  # only the two diagonal tiles' hidden halves, per rank
    assert all(step == 2 * c * c for row in layout.computed_pairs(tiles=True) for step in row[1:])
