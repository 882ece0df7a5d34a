"""Expert parallelism (``parlab.lab.parallel.expert``, chapter 10) against the dense mixture of experts in one
process: outputs, the load-balancing loss, dropped tokens and every gradient, at ep 2, 3 and 4 (6 experts:
uneven placement at 4), top-1 and top-2, with and without dropping; all-to-all bytes against the formula;
a planted bug (slots handed to the experts in the wrong order) caught by a wide margin. Both layers against
an independent reference (``expert_reference.naive_moe``, token by token), with the three bugs it alone
catches planted; ranks with unequal token counts; dp × ep and dp 2 × cp 2 × ep 2 training like one
process; the loss against Switch by hand and Hugging Face's Mixtral; dropless dispatch, aux-loss-free
balancing and node-limited routing (``expert_practice``).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing import assert_close

import parlab
from parlab.lab.measure import CommLog
from parlab.lab.parallel import expert as epx
from parlab.lab.parallel.expert_reference import naive_moe

HIDDEN, FFN, EXPERTS, TOKENS, ALPHA = 8, 16, 6, 24, 0.01  # TOKENS per rank (one group each)
CASES = [(1, 1.0), (2, 1.0), (2, 4.0)]  # (top_k, capacity_factor): drops at 1.0, none at 4.0


def data(ep, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ep * TOKENS, HIDDEN, generator=g, dtype=torch.float64)
    return x, torch.randn(ep * TOKENS, HIDDEN, generator=g, dtype=torch.float64)


def dense(ep, top_k, cf):
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, top_k, cf, dtype=torch.float64)
    x, weigh = data(ep)
    x.requires_grad_()
    y, aux, routings = moe(x, groups=ep)
    ((y * weigh).sum() + ALPHA * ep * aux).backward()  # = the sum of the ranks' losses below
    return y.detach(), aux.item(), routings, {n: p.grad for n, p in moe.named_parameters()}, x.grad


def _on_ranks(cases, layer=epx.ExpertParallelMoE):
    r, n = dist.get_rank(), dist.get_world_size()
    out = []
    for top_k, cf in cases:
        moe = layer(epx.MoE(HIDDEN, FFN, EXPERTS, top_k, cf, dtype=torch.float64))
        x, weigh = (t.chunk(n)[r] for t in data(n))
        x = x.clone().requires_grad_()
        with CommLog() as log:
            y, aux, routing = moe(x)
            ((y * weigh).sum() + ALPHA * aux).backward()
        dist.all_reduce(moe.router.grad)  # the replicated router: its gradient summed over the ep group
        out.append({"y": y.detach(), "aux": aux.item(), "dropped": routing.dropped, "x_grad": x.grad,
                    "per_expert": routing.tokens_per_expert(EXPERTS), "capacity": routing.capacity,
                    "grads": {name: p.grad for name, p in moe.named_parameters()},
                    "records": [(rec.op, rec.bytes, rec.label) for rec in log.records]})
    return out


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"ep{n}")
def run(request):
    return request.param, parlab.launch(_on_ranks, world_size=request.param, args=(CASES,), announce=False,
                                        output="none")


def test_outputs_losses_drops_and_gradients_match_the_dense_layer(run):
    n, results = run
    place = epx.placement(EXPERTS, n)
    drops = 0
    for i, (top_k, cf) in enumerate(CASES):
        y, aux, routings, grads, x_grad = dense(n, top_k, cf)
        assert_close(torch.cat([results[r][i]["y"] for r in range(n)]), y)
        assert_close(torch.cat([results[r][i]["x_grad"] for r in range(n)]), x_grad)
        assert_close(sum(results[r][i]["aux"] for r in range(n)) / n, aux)
        assert [results[r][i]["dropped"] for r in range(n)] == [g.dropped for g in routings]
        drops += sum(g.dropped for g in routings)
        if cf * top_k >= EXPERTS:  # capacity ≥ the group's tokens: no expert can overflow
            assert sum(g.dropped for g in routings) == 0
        for r in range(n):
            assert torch.equal(results[r][i]["per_expert"], routings[r].tokens_per_expert(EXPERTS))
            mine = place[r]
            assert_close(results[r][i]["grads"]["router"], grads["router"])
            assert_close(results[r][i]["grads"]["w_in"], grads["w_in"][mine.start:mine.stop])
            assert_close(results[r][i]["grads"]["w_out"], grads["w_out"][mine.start:mine.stop])
    assert drops > 0  # capacity factor 1.0 drops some tokens: the parity above includes them


def test_two_all_to_alls_each_way_of_the_whole_buffer(run):
    n, results = run
    for i, (top_k, cf) in enumerate(CASES):
        c = epx.capacity(TOKENS, EXPERTS, top_k, cf)
        for r in range(n):
            assert results[r][i]["capacity"] == c
            records = results[r][i]["records"]
            assert records[0][::2] == ("all_reduce", "tokens (max)")  # the ranks agree on the capacity first
            records = records[1:]
            assert [(op, label) for op, _, label in records] == [
                ("all_to_all", "dispatch forward"), ("all_to_all", "combine forward"),
                ("all_to_all", "combine backward"), ("all_to_all", "dispatch backward")]
            expected = epx.all_to_all_bytes(epx.placement(EXPERTS, n), r, c, HIDDEN, 8)
            assert [b for _, b, _ in records] == [expected["dispatch"], expected["combine"]] * 2
            if EXPERTS % n == 0:
                assert expected["dispatch"] == expected["combine"] == EXPERTS * c * HIDDEN * 8


def test_placement_and_imbalance():
    assert epx.placement(6, 4) == [range(0, 2), range(2, 4), range(4, 5), range(5, 6)]
    assert epx.placement(6, 3) == [range(0, 2), range(2, 4), range(4, 6)]
    with pytest.raises(ValueError, match="ep=7 ranks for 6 experts"):
        epx.placement(6, 7)
    assert epx.busiest_over_mean([10, 10, 10]) == 1.0 and epx.busiest_over_mean([30, 10, 20]) == 1.5
    assert epx.capacity(24, 6, 2, 1.25) == 10  # ceil(1.25 · 24 · 2 / 6)


def test_routing_keeps_first_choices_first_and_balanced_loss_is_one():
    logits = torch.tensor([[3.0, 2.0, 0.0], [3.0, 0.0, 2.0], [3.0, 2.0, 0.0]])  # everyone's favourite: expert 0
    routing = epx.route(logits, top_k=2, capacity_=2)
    assert routing.expert[:, 0].tolist() == [0, 0, 0]
    assert routing.slot[:, 0].tolist() == [0, 1, -1]  # the third first choice finds expert 0 full
    assert routing.slot[:, 1].tolist() == [0, 0, 1]  # second choices: expert 1 (tokens 0, 2), 2 (token 1)
    assert routing.dropped == 1 and routing.tokens_dropped == 0  # token 2 lost its first choice only
    tight = epx.route(logits, top_k=2, capacity_=1)
    assert tight.dropped == 3 and tight.tokens_dropped == 1  # token 2 lost both choices
    even = epx.route(torch.zeros(4, 4) + torch.eye(4) * 1e-3, top_k=1, capacity_=1)
    assert epx.load_balancing_loss(even).item() == pytest.approx(1.0, abs=1e-3)


class _WrongOrder(epx.ExpertParallelMoE):
    def _experts(self, buffer):  # the arrived slots read as (experts, ranks) instead of (ranks, experts)
        e, c, h = buffer.shape
        local = len(self.placement[dist.get_rank(self.group)])
        sent, got = [len(p) * c for p in self.placement], [local * c] * self.ep
        arrived = epx._AllToAll.apply(buffer.flatten(0, 1), (sent, got), self.group, "dispatch")
        out = epx.run_experts(arrived.view(local, self.ep * c, h), self.w_in, self.w_out).flatten(0, 1)
        return epx._AllToAll.apply(out, (got, sent), self.group, "combine").view(e, c, h)


def test_a_planted_bug_is_caught_by_a_wide_margin():
    n = 2
    results = parlab.launch(_on_ranks, world_size=n, args=([(2, 4.0)], _WrongOrder), announce=False, output="none")
    y = dense(n, 2, 4.0)[0]
    error = (torch.cat([results[r][0]["y"] for r in range(n)]) - y).abs().max().item()
    assert error > 1e3 * 1e-7, f"max error {error:.3g} hides within assert_close's float64 tolerance"
    print(f"planted bug (slots in the wrong order): max error {error:.3g}, {error / 1e-7:.0f}× the 1e-7 tolerance")


def _dp_ep(steps, divide_by_edp=False, cp=1):
    from parlab.lab.topology import Topology

    topo = Topology.build(ep=2, cp=cp)  # dp × cp = world size; experts over pairs of ranks, replicated over edp
    layer = epx.ExpertParallelMoE(epx.MoE(HIDDEN, FFN, EXPERTS, 2, 1.0, dtype=torch.float64), topo.group("ep"))
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    r, n = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        x, weigh = (t.chunk(n)[r] for t in data(n, seed=10 + step))
        y, aux, _ = layer(x)
        ((y * weigh).mean() + ALPHA * aux).backward()
        epx.sync_gradients(layer, topo)
        if divide_by_edp:  # the planted bug: experts averaged over their edp replicas only
            for p in (layer.w_in, layer.w_out):
                p.grad *= topo.dp * topo.cp // (topo.dp * topo.cp // topo.ep)
        opt.step()
        opt.zero_grad()
    return {name: p.detach() for name, p in layer.named_parameters()}, epx.placement(EXPERTS, topo.ep)[topo.coord("ep")]


def dense_steps(n, steps):
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, 2, 1.0, dtype=torch.float64)
    opt = torch.optim.SGD(moe.parameters(), lr=0.5)
    for step in range(steps):
        x, weigh = data(n, seed=10 + step)
        y, aux, _ = moe(x, groups=n)
        ((y * weigh).mean() + ALPHA * aux).backward()  # the mean over every token, aux over groups
        opt.step()
        opt.zero_grad()
    return {name: p.detach() for name, p in moe.named_parameters()}


@pytest.mark.parametrize("bug, cp", [(False, 1), (True, 1), (False, 2)],
                         ids=["dp4xep2", "planted-divide-by-edp", "dp2xcp2xep2"])
def test_dp_times_ep_trains_like_one_process(bug, cp):
    # dp 2 × cp 2 × ep 2: the router's gradient must be summed over dp × cp (dp_cp), not dp alone
    n, steps = 4, 2
    expected = dense_steps(n, steps)
    errors = []
    for params, mine in parlab.launch(_dp_ep, world_size=n, args=(steps, bug, cp), announce=False, output="none"):
        got = {"router": params["router"], "w_in": params["w_in"], "w_out": params["w_out"]}
        want = {"router": expected["router"], "w_in": expected["w_in"][mine.start:mine.stop],
                "w_out": expected["w_out"][mine.start:mine.stop]}
        errors += [(got[k] - want[k]).abs().max().item() for k in got]
        if not bug:
            for k in got:
                assert_close(got[k], want[k])
    if bug:
        assert max(errors) > 1e3 * 1e-7
        print(f"planted bug (experts divided by edp, not dp): max parameter error {max(errors):.3g}")


def _unequal_tokens(counts, cf):
    r = dist.get_rank()
    moe = epx.ExpertParallelMoE(epx.MoE(HIDDEN, FFN, EXPERTS, 2, cf, dtype=torch.float64))
    x, weigh = (t[sum(counts[:r]):sum(counts[:r + 1])] for t in data(len(counts)))
    x = x.clone().requires_grad_()
    y, aux, routing = moe(x)
    ((y * weigh).sum() + ALPHA * aux).backward()
    dist.all_reduce(moe.router.grad)
    return y.detach(), x.grad, routing.capacity, {name: p.grad for name, p in moe.named_parameters()}


@pytest.mark.parametrize("counts", [(8, 6), (8, 6, 7), (21, 22)], ids=["8-and-6", "8-6-7", "layout-43-cp2"])
def test_ranks_with_unequal_token_counts_agree_on_the_capacity(counts):
    # 8 tokens on one rank, 6 on the other: each used to compute its own capacity, and the all-to-all's
    # sizes disagreed (gloo aborts, NCCL hangs). The ranks agree on the largest count's capacity. (21, 22):
    # what the course's own Layout(43, cp=2) gives its two ranks.
    if counts == (21, 22):
        from parlab.lab.parallel import context as cpx

        assert counts == tuple(len(cpx.Layout(43, 2).positions(r)) for r in range(2))
    n, cf = len(counts), 1.0
    results = parlab.launch(_unequal_tokens, world_size=n, args=(counts, cf), announce=False, output="none")
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, 2, cf, dtype=torch.float64)
    x, weigh = (t[:sum(counts)] for t in data(n))
    x.requires_grad_()
    y, aux, routings = moe(x, groups=list(counts))
    ((y * weigh).sum() + ALPHA * n * aux).backward()
    assert [g.capacity for g in routings] == [epx.capacity(max(counts), EXPERTS, 2, cf)] * n
    assert_close(torch.cat([res[0] for res in results]), y.detach())
    assert_close(torch.cat([res[1] for res in results]), x.grad)
    place = epx.placement(EXPERTS, n)
    for r, (_, _, cap, grads) in enumerate(results):
        assert cap == routings[0].capacity
        assert_close(grads["router"], moe.router.grad)
        assert_close(grads["w_in"], moe.w_in.grad[place[r].start:place[r].stop])


# -- against an independent reference: the layer token by token (parlab.lab.parallel.expert_reference) ----------

def _naive(moe, x, groups, cf):
    return naive_moe(x, moe.router, moe.w_in, moe.w_out, moe.top_k, cf, groups)


@pytest.mark.parametrize("top_k, cf", CASES + [(2, None)], ids=["top1-cf1", "top2-cf1", "top2-cf4", "dropless"])
def test_dense_layer_matches_the_token_by_token_reference(top_k, cf):
    groups = [8, 6, 10]  # unequal groups: capacity from the largest
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, top_k, cf if cf is not None else 100.0, dtype=torch.float64)
    x = data(1)[0][:sum(groups)].requires_grad_()
    y, aux, routings = moe(x, groups=groups)
    want_y, want_aux, kept = _naive(moe, x, groups, cf)
    assert_close(y, want_y)
    assert_close(aux, want_aux)
    starts = [sum(groups[:i]) for i in range(len(groups))]
    served = sorted((start + t, e) for start, g in zip(starts, routings)
                    for t, e in zip(g.kept.nonzero()[:, 0].tolist(), g.expert[g.kept].tolist()))
    assert served == kept
    assert (sum(g.dropped for g in routings) > 0) == (cf == 1.0)  # cf 1.0 drops; the reference dropped them too
    mine = torch.autograd.grad((y * data(1)[1][:len(y)]).sum() + aux, [x, moe.router, moe.w_in])
    theirs = torch.autograd.grad((want_y * data(1)[1][:len(y)]).sum() + want_aux, [x, moe.router, moe.w_in])
    for a, b in zip(mine, theirs):
        assert_close(a, b)


def test_expert_parallel_layer_matches_the_token_by_token_reference(run):
    n, results = run
    for i, (top_k, cf) in enumerate(CASES):
        moe = epx.MoE(HIDDEN, FFN, EXPERTS, top_k, cf, dtype=torch.float64)
        with torch.no_grad():
            want_y, want_aux, kept = _naive(moe, data(n)[0], n, cf)
        assert_close(torch.cat([results[r][i]["y"] for r in range(n)]), want_y)
        assert_close(sum(results[r][i]["aux"] for r in range(n)) / n, float(want_aux))
        assert sum(results[r][i]["dropped"] for r in range(n)) == n * TOKENS * top_k - len(kept)


def test_balancing_loss_is_one_when_balanced_and_switch_eq4_by_hand():
    even = epx.route(torch.zeros(4, 4) + torch.eye(4) * 1e-3, top_k=1, capacity_=1)  # f = P = 1/4 each
    assert epx.load_balancing_loss(even).item() == pytest.approx(1.0, abs=1e-3)
    # three tokens, two experts, top-1: f = (2/3, 1/3), P = (1.7/3, 1.3/3); E·Σ f·P = 2·(3.4 + 1.3)/9 = 47/45
    probs = torch.tensor([[0.8, 0.2], [0.6, 0.4], [0.3, 0.7]], dtype=torch.float64)
    hand = epx.route(probs.log(), top_k=1, capacity_=3)
    assert epx.load_balancing_loss(hand).item() == pytest.approx(47 / 45)
    router = torch.eye(2, dtype=torch.float64)  # so that each token's scores are its log probabilities
    no_experts = torch.zeros(2, 2, 1, dtype=torch.float64), torch.zeros(2, 1, 2, dtype=torch.float64)
    _, aux, _ = naive_moe(probs.log(), router, *no_experts, top_k=1, capacity_factor=None)
    assert float(aux) == pytest.approx(47 / 45)


def _combine_ignoring_gates(buffer, routing):
    tokens, choice = routing.kept.nonzero(as_tuple=True)
    where = routing.expert[tokens, choice] * routing.capacity + routing.slot[tokens, choice]
    picked = buffer.flatten(0, 1)[where]
    return picked.new_zeros(routing.expert.shape[0], buffer.shape[-1]).index_add(0, tokens, picked)


def _route_token_major(logits, top_k, capacity_):
    probs = logits.softmax(-1)
    weight, expert = probs.topk(top_k, dim=-1)
    if top_k > 1:
        weight = weight / weight.sum(-1, keepdim=True)
    one_hot = F.one_hot(expert.flatten(), logits.shape[-1])  # token-major: token 0's choices, then token 1's
    slot = (one_hot.cumsum(0) - 1).mul(one_hot).sum(-1).view(-1, top_k)
    slot = torch.where(slot < capacity_, slot, torch.full_like(slot, -1))
    return epx.Routing(expert, weight, slot, probs, capacity_)


_ORIGINAL_LOSS = epx.load_balancing_loss
PLANTED = {"combine-ignores-gates": ("combine", _combine_ignoring_gates),
           "aux-without-factor-E": ("load_balancing_loss", lambda routing: _ORIGINAL_LOSS(routing) / EXPERTS),
           "token-major-priority": ("route", _route_token_major)}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_each_planted_moe_bug_is_caught_by_the_reference(bug, monkeypatch):
    # Planted in expert.py's functions, each bug is in MoE and ExpertParallelMoE alike (they share them):
    # only the reference, which shares nothing, can see it.
    name, planted = PLANTED[bug]
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, 2, 1.0, dtype=torch.float64)
    x = data(1)[0][:2 * TOKENS]
    with torch.no_grad():
        want_y, want_aux, _ = _naive(moe, x, 2, 1.0)
        monkeypatch.setattr(epx, name, planted)
        y, aux, _ = moe(x, groups=2)
    error = max((y - want_y).abs().max().item(), abs(float(aux) - float(want_aux)))
    assert error > 1e3 * 1e-7, f"{bug}: max error {error:.3g} hides within assert_close's float64 tolerance"
    print(f"planted {bug}: max error {error:.3g}, {error / 1e-7:.0f}× the 1e-7 tolerance")


# -- today's practice (parlab.lab.parallel.expert_practice) ---------------------------------------------------

def _dropless_on_ranks():
    from parlab.lab.parallel.expert_practice import DroplessExpertParallelMoE

    r, n = dist.get_rank(), dist.get_world_size()
    layer = DroplessExpertParallelMoE(epx.MoE(HIDDEN, FFN, EXPERTS, 2, dtype=torch.float64))
    x, weigh = (t.chunk(n)[r] for t in data(n))
    x = x.clone().requires_grad_()
    with CommLog() as log:
        y, aux, routing = layer(x)
        ((y * weigh).sum() + ALPHA * aux).backward()
    dist.all_reduce(layer.router.grad)
    return {"y": y.detach(), "x_grad": x.grad, "aux": aux.item(), "dropped": routing.dropped,
            "grads": {name: p.grad for name, p in layer.named_parameters()},
            "records": [(rec.label, rec.bytes) for rec in log.records]}


@pytest.mark.parametrize("n", [2, 3, 4], ids=lambda n: f"ep{n}")
def test_dropless_expert_parallelism_matches_the_reference_and_sends_no_padding(n):
    from parlab.lab.parallel.expert_practice import dropless_bytes

    results = parlab.launch(_dropless_on_ranks, world_size=n, announce=False, output="none")
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, 2, dtype=torch.float64)
    x, weigh = data(n)
    x.requires_grad_()
    y, aux, _ = naive_moe(x, moe.router, moe.w_in, moe.w_out, 2, None, n)  # dropless: no capacity
    ((y * weigh).sum() + ALPHA * n * aux).backward()
    assert_close(torch.cat([res["y"] for res in results]), y.detach())
    assert_close(torch.cat([res["x_grad"] for res in results]), x.grad)
    assert_close(sum(res["aux"] for res in results) / n, aux.item())
    place = epx.placement(EXPERTS, n)
    for r, res in enumerate(results):
        assert res["dropped"] == 0
        assert_close(res["grads"]["router"], moe.router.grad)
        for name in ("w_in", "w_out"):
            assert_close(res["grads"][name], getattr(moe, name).grad[place[r].start:place[r].stop])
        expected = dropless_bytes(TOKENS, 2, HIDDEN, EXPERTS, 8)
        sent = dict(res["records"][:2])
        assert sent == {"counts": expected["counts"], "dispatch forward": expected["dispatch"]}
        padded = epx.all_to_all_bytes(place, r, epx.capacity(TOKENS, EXPERTS, 2, 1.25), HIDDEN, 8)["dispatch"]
        assert expected["dispatch"] < padded  # capacity 1.25 pads a quarter more, and still drops


def test_aux_loss_free_bias_reduces_the_imbalance():
    from parlab.lab.parallel.expert_practice import biased_top_k, update_bias

    g = torch.Generator().manual_seed(5)
    skew = torch.linspace(0, 2, EXPERTS)  # a router that prefers the last experts
    bias, imbalance = torch.zeros(EXPERTS), []
    for _ in range(300):
        scores = torch.sigmoid(torch.randn(2048, EXPERTS, generator=g) + skew)  # DeepSeek-V3's affinities
        expert, weight = biased_top_k(scores, bias, 2)
        assert_close(weight.sum(-1), torch.ones(2048))
        imbalance.append(epx.busiest_over_mean(torch.bincount(expert.flatten(), minlength=EXPERTS)))
        bias = update_bias(bias, expert, gamma=0.002)
    assert imbalance[0] > 2 and sum(imbalance[-20:]) / 20 < 1.1 and max(imbalance[-20:]) < 1.15
    assert bias[0] > 0 > bias[-1]  # the unpopular expert raised, the popular one lowered


def test_node_limited_routing_bounds_the_fan_out():
    from parlab.lab.parallel.expert_practice import node_limited_top_k

    scores = torch.randn(64, 16, generator=torch.Generator().manual_seed(6))  # 4 nodes of 4 experts
    for max_nodes in (1, 2):
        expert = node_limited_top_k(scores, 4, nodes=4, max_nodes=max_nodes)
        assert all(len(set((row // 4).tolist())) <= max_nodes for row in expert)
    assert sum(len(set((row // 4).tolist())) > 2 for row in scores.topk(4, dim=-1).indices) > 10  # unlimited: more
    plain = node_limited_top_k(scores, 4, nodes=4, max_nodes=4)  # every node allowed: plain top-k
    assert torch.equal(plain.sort(-1).values, scores.topk(4, dim=-1).indices.sort(-1).values)
    with pytest.raises(ValueError, match="nodes=3, max_nodes=1, top_k=4 for 16 experts"):
        node_limited_top_k(scores, 4, nodes=3, max_nodes=1)


@pytest.mark.parametrize("top_k", [1, 2])
def test_a_coefficient_ported_from_hugging_face_mixtral_is_multiplied_by_k(top_k):
    # HF's f_e counts assignments per token (it sums to k); ours per assignment (it sums to 1): its loss, and
    # its gradient, are k times ours. A coefficient ported from a Mixtral config (router_aux_loss_coef) gives
    # the router the same push here multiplied by k, not divided (chapter 10, under the hood J).
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    logits = torch.randn(TOKENS, EXPERTS, generator=torch.Generator().manual_seed(7), requires_grad=True)
    ours = epx.load_balancing_loss(epx.route(logits, top_k, TOKENS))
    theirs = mixtral.load_balancing_loss_func((logits,), EXPERTS, top_k)
    assert_close(theirs, top_k * ours)
    coef = 0.02  # Mixtral's router_aux_loss_coef
    (g_theirs,), (g_ours,) = (torch.autograd.grad(loss, logits, retain_graph=True) for loss in (coef * theirs, coef * top_k * ours))
    assert_close(g_theirs, g_ours)
    if top_k > 1:
        (g_divided,) = torch.autograd.grad(coef / top_k * ours, logits)
        assert (g_theirs - g_divided).abs().max() > 0.5 * g_theirs.abs().max()  # dividing is k² too weak


def test_grouped_mm_on_cpu_equals_the_loop_over_experts():
    from parlab.lab.parallel.expert_practice import grouped_mlp

    g = torch.Generator().manual_seed(8)
    sizes = [5, 0, 7, 3]
    rows = torch.randn(sum(sizes), HIDDEN, generator=g, requires_grad=True)
    w_in = torch.randn(len(sizes), HIDDEN, FFN, generator=g, requires_grad=True)
    w_out = torch.randn(len(sizes), FFN, HIDDEN, generator=g, requires_grad=True)
    dout = torch.randn(sum(sizes), HIDDEN, generator=g)
    outs = [grouped_mlp(rows, sizes, w_in, w_out, grouped=grouped) for grouped in (True, False)]
    assert_close(outs[0], outs[1])
    grads = [torch.autograd.grad(out, (rows, w_in, w_out), dout) for out in outs]
    for a, b in zip(*grads):
        assert_close(a, b)


def _dropless_unequal(counts):
    from parlab.lab.parallel.expert_practice import DroplessExpertParallelMoE

    r = dist.get_rank()
    layer = DroplessExpertParallelMoE(epx.MoE(HIDDEN, FFN, EXPERTS, 2, dtype=torch.float64))
    return layer(data(len(counts))[0][sum(counts[:r]):sum(counts[:r + 1])])[0]


def test_dropless_takes_unequal_token_counts():
    counts = (8, 6)  # the splits say how many rows each rank sends: no agreement needed
    got = torch.cat(parlab.launch(_dropless_unequal, world_size=2, args=(counts,), announce=False, output="none"))
    moe = epx.MoE(HIDDEN, FFN, EXPERTS, 2, dtype=torch.float64)
    with torch.no_grad():
        want = naive_moe(data(2)[0][:14], moe.router, moe.w_in, moe.w_out, 2, None, list(counts))[0]
    assert_close(got.detach(), want)


def test_capacity_rounds_a_fraction_up():
    # chapter 10's parameters make the share a fraction (default, CI, 12 experts): a floor would fail these
    for tokens, experts, want in ((30, 8, 10), (14, 8, 5), (30, 12, 7)):
        share = 1.25 * tokens * 2 / experts
        assert share != int(share) and epx.capacity(tokens, experts, 2, 1.25) == want
