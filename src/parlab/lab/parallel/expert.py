"""Expert parallelism from scratch: a mixture-of-experts layer whose experts live on different ranks (chapter 10).

N. Shazeer et al., "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer", 2017
(arXiv:1701.06538); D. Lepikhin et al., "GShard", 2020 (arXiv:2006.16668), §2–3; W. Fedus, B. Zoph,
N. Shazeer, "Switch Transformers", 2021 (arXiv:2101.03961), §2.

A mixture of experts replaces one MLP by ``num_experts`` MLPs and a **router**, a linear layer that scores
every expert for every token. Each token goes to its ``top_k`` best experts and the layer's output is the
sum of their outputs weighted by the router's probabilities. Every expert has room for ``capacity`` tokens
per group of tokens, ``ceil(capacity_factor · tokens · top_k / num_experts)`` (GShard, Switch): the tokens
that arrive when it is full are **dropped** (their output from that expert is zero; the residual connection
around the layer carries them on). A **load-balancing loss** (Switch, eq. 4: ``E · Σ_e f_e · P_e``, the
share of assignments times the mean probability of each expert; 1 when balanced) pushes the router to
spread tokens evenly. The gates: top-1, the raw probability (Switch); top-k, the k probabilities
renormalised to sum to 1 (GShard, Mixtral).

One function does it all, :func:`moe_forward`: route, **dispatch** (each token copied into its expert's
slots: a tensor of shape (experts, capacity, hidden)), run the experts, **combine** (each token's outputs
weighted and summed). :class:`MoE` runs it in one process. :class:`ExpertParallelMoE` runs the same
function on each of ``ep`` ranks, each with its own tokens (a group, in GShard's sense) and its own
experts: between dispatch and the experts one all-to-all sends every expert's slots to the rank that holds
it, and after the experts a second one sends the results back. Nothing else changes, so the dense layer
with ``groups=ep`` is its exact single-process reference; :mod:`parlab.lab.parallel.expert_reference`, a loop
over tokens that shares none of these functions, checks both. Both all-to-alls go through
``parlab.lab.parallel.comm.communicate``, so any attached ``CommLog`` records them; in this capacity-based
layer each moves the whole (experts, capacity, hidden) buffer, whatever the routing. Dropless layers send
only what was routed (:mod:`parlab.lab.parallel.expert_practice`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.lab.checks import positive_int
from parlab.lab.parallel.comm import communicate


def capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for a group of ``tokens`` tokens (GShard, Switch): its even share × the factor."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / num_experts))


@dataclass
class Routing:
    """Where each of a group's T tokens goes: ``expert`` and ``weight`` (T, k) its choices and their gate
    values; ``slot`` (T, k) its place in that expert's buffer, −1 when the expert was full (dropped);
    ``probs`` (T, E) the router's probabilities; ``capacity`` slots per expert. A token makes k
    *assignments*, one per choice; an expert's capacity counts assignments."""

    expert: torch.Tensor
    weight: torch.Tensor
    slot: torch.Tensor
    probs: torch.Tensor
    capacity: int

    @property
    def kept(self) -> torch.Tensor:
        return self.slot >= 0

    def tokens_per_expert(self, num_experts: int) -> torch.Tensor:
        """Assignments each expert received, before the capacity cut (kept + dropped)."""
        return torch.bincount(self.expert.flatten(), minlength=num_experts)

    @property
    def dropped(self) -> int:
        """Assignments dropped (a token whose second choice was full counts once), not tokens."""
        return int((~self.kept).sum())

    @property
    def tokens_dropped(self) -> int:
        """Tokens that lost every choice: the layer adds nothing to them (only the residual carries them)."""
        return int((~self.kept).all(-1).sum())


def route(logits: torch.Tensor, top_k: int, capacity_: int) -> Routing:
    """Top-k routing with a capacity (GShard §2.2): first choices take their slots before second choices,
    and within a choice earlier tokens first. logits: (T, E). Gates: top-1, the raw probability (Switch);
    top-k, the chosen probabilities renormalised to sum to 1 (GShard, Mixtral)."""
    probs = logits.softmax(-1)  # (T, E)
    weight, expert = probs.topk(top_k, dim=-1)  # (T, k)
    if top_k > 1:  # GShard, Mixtral: the chosen experts' gates renormalised to sum to 1
        weight = weight / weight.sum(-1, keepdim=True)
    one_hot = F.one_hot(expert.t().flatten(), logits.shape[-1])  # (k·T, E), choice-major: priority order
    position = (one_hot.cumsum(0) - 1).mul(one_hot).sum(-1)  # each assignment's place in its expert's queue
    slot = position.view(top_k, -1).t()  # (T, k)
    slot = torch.where(slot < capacity_, slot, torch.full_like(slot, -1))
    return Routing(expert, weight, slot, probs, capacity_)


def load_balancing_loss(routing: Routing) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, E · Σ_e f_e · P_e: f_e the share of the group's assignments that
    chose expert e (not differentiable), P_e the mean router probability of e. 1.0 when both are uniform.
    Hugging Face's Mixtral (``load_balancing_loss_func``) divides the counts by tokens, not assignments:
    its loss is k times this one (k when balanced), and so are its gradients. A coefficient ported from it
    is therefore *multiplied* by k here, to give the router the same push (``tests/test_expert.py``)."""
    num_experts = routing.probs.shape[-1]
    f = routing.tokens_per_expert(num_experts).to(routing.probs.dtype) / routing.expert.numel()
    return num_experts * (f * routing.probs.mean(0)).sum()


def dispatch(x: torch.Tensor, routing: Routing, num_experts: int) -> torch.Tensor:
    """Copy each kept (token, choice) into its expert's slot. x (T, h) -> (E, capacity, h), zeros where unused."""
    tokens, choice = routing.kept.nonzero(as_tuple=True)
    where = routing.expert[tokens, choice] * routing.capacity + routing.slot[tokens, choice]
    buffer = x.new_zeros(num_experts * routing.capacity, x.shape[-1]).index_add(0, where, x[tokens])
    return buffer.view(num_experts, routing.capacity, x.shape[-1])


def combine(buffer: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Each token's expert outputs, weighted by its gates and summed. (E, capacity, h) -> (T, h)."""
    tokens, choice = routing.kept.nonzero(as_tuple=True)
    where = routing.expert[tokens, choice] * routing.capacity + routing.slot[tokens, choice]
    picked = buffer.flatten(0, 1)[where] * routing.weight[tokens, choice, None]
    return picked.new_zeros(routing.expert.shape[0], buffer.shape[-1]).index_add(0, tokens, picked)


def run_experts(buffer: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """Every expert's MLP on its slots at once: (e, c, h) @ (e, h, f) -> GeLU -> @ (e, f, h)."""
    return F.gelu(buffer @ w_in) @ w_out


class MoE(nn.Module):
    """A mixture-of-experts MLP in one process. ``groups``: the tokens are cut into this many equal groups,
    each with its own capacity and load-balancing loss (GShard's groups; under expert parallelism each rank's
    tokens are one group). forward(x (T, h)) -> (y (T, h), aux loss, [Routing per group])."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 2, capacity_factor: float = 1.25,
                 seed: int = 0, dtype=torch.float32):
        super().__init__()
        positive_int("num_experts", num_experts, "experts in the layer")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k!r} must be between 1 and num_experts={num_experts}")
        g = torch.Generator().manual_seed(seed)
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.router = nn.Parameter(torch.randn(hidden, num_experts, generator=g, dtype=dtype) / hidden ** 0.5)
        self.w_in = nn.Parameter(torch.randn(num_experts, hidden, ffn, generator=g, dtype=dtype) / hidden ** 0.5)
        self.w_out = nn.Parameter(torch.randn(num_experts, ffn, hidden, generator=g, dtype=dtype) / ffn ** 0.5)

    def forward(self, x, groups: int | list[int] = 1):
        parts = x.tensor_split(groups) if isinstance(groups, int) else x.split(list(groups))
        largest = max(len(part) for part in parts)  # every group's capacity from the largest, as EP ranks agree
        outs, aux, routings = [], 0.0, []
        for part in parts:
            y, loss, routing = moe_forward(part, self.router, self.num_experts, self.top_k, self.capacity_factor,
                                           lambda buf: run_experts(buf, self.w_in, self.w_out), tokens=largest)
            outs.append(y)
            aux = aux + loss / len(parts)
            routings.append(routing)
        return torch.cat(outs), aux, routings


def moe_forward(x, router, num_experts, top_k, capacity_factor, experts, tokens: int | None = None):
    """Route, dispatch, ``experts(buffer (E, C, h))``, combine: one group's MoE layer; capacity for
    ``tokens`` (default: this group's). Returns (y, aux, routing)."""
    tokens = x.shape[0] if tokens is None else tokens
    routing = route(x @ router, top_k, capacity(tokens, num_experts, top_k, capacity_factor))
    y = combine(experts(dispatch(x, routing, num_experts)), routing)
    return y, load_balancing_loss(routing), routing


# -- expert parallelism -----------------------------------------------------------------------------------

def placement(num_experts: int, ep: int) -> list[range]:
    """Which experts each of ``ep`` ranks holds: contiguous blocks, the first ones one larger when uneven."""
    positive_int("ep", ep, "ranks along the ep axis")
    if ep > num_experts:
        raise ValueError(f"ep={ep} ranks for {num_experts} experts: some ranks would hold none")
    sizes = [len(part) for part in torch.tensor_split(torch.arange(num_experts), ep)]
    starts = [sum(sizes[:i]) for i in range(ep + 1)]
    return [range(starts[i], starts[i + 1]) for i in range(ep)]


class _AllToAll(torch.autograd.Function):
    """An all-to-all whose backward is the all-to-all back: the gradient of a slot returns to its sender."""

    @staticmethod
    def forward(ctx, x, splits, group, label):
        ctx.splits, ctx.group, ctx.label = splits, group, label
        out = x.new_empty((sum(splits[1]), *x.shape[1:]))
        communicate("all_to_all", x.contiguous(), group, output=out, splits=splits, label=f"{label} forward")
        return out

    @staticmethod
    def backward(ctx, grad):
        ins, outs = ctx.splits
        back = grad.new_empty((sum(ins), *grad.shape[1:]))
        communicate("all_to_all", grad.contiguous(), ctx.group, output=back, splits=(outs, ins),
                    label=f"{ctx.label} backward")
        return back, None, None, None


class ExpertParallelMoE(nn.Module):
    """The experts of ``moe`` spread over the ``ep`` ranks of ``group``; the router replicated.

    Each rank routes its own tokens and dispatches them into (E, C, h) as the dense layer does. The first
    all-to-all sends rows e·C … (e+1)·C − 1 to the rank holding expert e; that rank now holds, for each of
    its experts, the slots of every rank, (ep, E_local, C, h); it runs its experts; the second all-to-all
    returns each slot to its token's rank, which combines. The router's gradient is this rank's tokens'
    share: sum it over the ep group (as data parallelism would) to get the dense layer's."""

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        self.group = group
        self.ep, rank = dist.get_world_size(group), dist.get_rank(group)
        self.placement = placement(moe.num_experts, self.ep)
        mine = self.placement[rank]
        self.num_experts, self.top_k, self.capacity_factor = moe.num_experts, moe.top_k, moe.capacity_factor
        self.router = nn.Parameter(moe.router.detach().clone())
        self.w_in = nn.Parameter(moe.w_in.detach()[mine.start:mine.stop].clone())  # (E/ep, h, f)
        self.w_out = nn.Parameter(moe.w_out.detach()[mine.start:mine.stop].clone())

    def forward(self, x):
        # Ranks may hold different numbers of tokens (an uneven Layout of a sequence, the last batch): each
        # would compute another capacity, and the all-to-all's splits would not match. They agree on the
        # largest count first, so that every buffer is (E, C, h) with the same C.
        count = torch.tensor([x.shape[0]], device=x.device)
        communicate("all_reduce", count, self.group, label="tokens (max)", reduce_op=dist.ReduceOp.MAX)
        return moe_forward(x, self.router, self.num_experts, self.top_k, self.capacity_factor, self._experts,
                           tokens=int(count))

    def _experts(self, buffer):
        e, c, h = buffer.shape  # (E, C, h): every expert's slots of this rank's tokens
        local = len(self.placement[dist.get_rank(self.group)])
        sent = [len(p) * c for p in self.placement]  # rows to each rank: its experts' slots
        got = [local * c] * self.ep  # rows from each rank: my experts' slots of its tokens
        arrived = _AllToAll.apply(buffer.flatten(0, 1), (sent, got), self.group, "dispatch")
        slots = arrived.view(self.ep, local, c, h).transpose(0, 1).flatten(1, 2)  # (E_local, ep·C, h)
        out = run_experts(slots, self.w_in, self.w_out)
        out = out.view(local, self.ep, c, h).transpose(0, 1).flatten(0, 2)  # back in the order they came
        return _AllToAll.apply(out, (got, sent), self.group, "combine").view(e, c, h)


def all_to_all_bytes(place: list[range], rank: int, capacity_: int, hidden: int, element_size: int = 4) -> dict:
    """Bytes ``rank`` sends in each all-to-all (nccl-tests' size, its own share included), ``place`` from
    :func:`placement`: dispatch sends its whole (E, C, h) buffer; combine sends back its experts' slots of
    every rank's tokens, (E_here · ep, C, h). Equal, E·C·h values, when every rank holds E/ep experts;
    (ep − 1)/ep of it leaves the rank. Backward sends the same again, each the other way round."""
    row = capacity_ * hidden * element_size
    return {"dispatch": place[-1].stop * row, "combine": len(place[rank]) * len(place) * row}


def busiest_over_mean(tokens_per_rank) -> float:
    """The cost of imbalance: every rank waits for the one whose experts received the most tokens."""
    t = [float(x) for x in tokens_per_rank]
    return max(t) / (sum(t) / len(t))


def sync_gradients(layer: ExpertParallelMoE, topology, dense_group=None) -> None:
    """Data parallelism around expert parallelism (``Topology(ep=...)``, chapter 10), each rank's loss the
    mean over its own tokens: the router's gradient is summed over every rank that holds the same dense
    weights, dp × cp of them (``dense_group``, default ``topology.group("dp_cp")``, torchtitan's
    ``dp_shard_cp``: each cp rank saw other tokens of the sequence, so summing over dp alone misses them),
    the experts' summed over ``edp`` (the ranks holding the same experts); both are divided by the *same*
    count, dp × cp, not by edp: each rank's expert gradient already sums the ep ranks whose tokens it served
    (torchtitan's ``fsdp_gradient_divide_factor`` until April 2026; since then it divides by the global token
    count in its training loop, the same step when every rank holds as many tokens)."""
    ranks = topology.dp * topology.cp
    if ranks > 1:
        dense_group = dense_group if dense_group is not None else topology.group("dp_cp")
        communicate("all_reduce", layer.router.grad, dense_group, label="router grad")
    layer.router.grad /= ranks
    for p in (layer.w_in, layer.w_out):
        if ranks // topology.ep > 1:
            communicate("all_reduce", p.grad, topology.group("edp"), label="expert grad")
        p.grad /= ranks
