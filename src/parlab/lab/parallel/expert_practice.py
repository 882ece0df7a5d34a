"""Mixture of experts as large runs train it today (chapter 10, under the hood): dropless expert parallelism
with variable splits, DeepSeek-V3's auxiliary-loss-free balancing, and node-limited routing.

- **Dropless** (T. Gale et al., "MegaBlocks", 2022, arXiv:2211.15841; torchtitan's and Megatron-Core's
  ``alltoall`` token dispatchers): no capacity, no padding, nothing dropped. Each rank sorts its
  assignments by expert, tells every rank how many it will send to each of its experts, then sends exactly
  those rows (``all_to_all_single`` with those splits). The counts go by an all-to-all here, as in
  MegaBlocks and torchtitan (``_token_count_exchange``); Megatron-Core's dispatcher all-gathers every
  rank's counts over its tp × ep group instead (``MoEAlltoAllTokenDispatcher.preprocess``). Every expert
  then has a variable number of rows: one grouped GEMM runs them all (``torch._grouped_mm``; PyTorch 2.13
  runs it on CPU too, forward and backward, equal to a loop over experts: :func:`grouped_mlp`).
- **Auxiliary-loss-free balancing** (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, arXiv:2412.19437,
  §2.1.2): a per-expert bias b is added to the routing scores for the *choice* of experts only (the gates
  use the scores without it); after each step b_e ← b_e + γ·sign(mean load − load_e): an overloaded
  expert becomes less attractive, without a loss term that pulls the router's gradient away from the task.
- **Node-limited routing** (DeepSeek-V3 §2.1.2, M = 4 of 8 nodes): a token may reach experts on at most
  ``max_nodes`` nodes, chosen by the sum of its best scores there, so that the all-to-all's fan-out, and
  its inter-node bytes, are bounded whatever the router wants.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parlab.lab.parallel.comm import communicate
from parlab.lab.parallel.expert import ExpertParallelMoE, _AllToAll, load_balancing_loss, route


class DroplessExpertParallelMoE(ExpertParallelMoE):
    """``moe``'s experts over the ranks of ``group`` as in :class:`~parlab.lab.parallel.expert.ExpertParallelMoE`
    (same placement, same parameters), every assignment computed: no capacity.

    forward(x (T, h)) -> (y (T, h), aux, routing), as there, except that nothing is dropped and each
    all-to-all carries exactly this rank's T·k assignments (dispatch) and its experts' results (combine),
    no padding. Ranks may hold different numbers of tokens: the splits say how many rows each sends."""

    def forward(self, x):
        t, h = x.shape
        rank = dist.get_rank(self.group)
        routing = route(x @ self.router, self.top_k, capacity_=t)  # capacity T: an expert never overflows
        order = routing.expert.flatten().argsort(stable=True)  # (T·k,) assignments sorted by expert
        counts = torch.bincount(routing.expert.flatten(), minlength=self.num_experts)  # (E,)
        # 1. counts: each rank learns how many rows every rank sends to each of its experts
        local = len(self.placement[rank])
        theirs = counts.new_empty(self.ep * local)  # (ep, E_local): rank s's rows for my expert j
        communicate("all_to_all", counts, self.group, output=theirs,
                    splits=([len(p) for p in self.placement], [local] * self.ep), label="counts")
        send = [int(counts[p.start:p.stop].sum()) for p in self.placement]
        theirs = theirs.view(self.ep, local)
        recv = theirs.sum(1).tolist()
        # 2. the rows themselves, with those splits: (Σ recv, h), by source rank, then by expert
        arrived = _AllToAll.apply(x[order // self.top_k], (send, recv), self.group, "dispatch")
        by_expert = torch.arange(local, device=x.device).repeat(self.ep).repeat_interleave(theirs.flatten())
        regroup = by_expert.argsort(stable=True)  # rows of expert 0 (from every rank), then expert 1, ...
        rows = arrived[regroup]
        sizes = torch.bincount(by_expert, minlength=local).tolist()
        out = grouped_mlp(rows, sizes, self.w_in, self.w_out)
        back = _AllToAll.apply(out[regroup.argsort()], (recv, send), self.group, "combine")
        per_assignment = back[order.argsort()].view(t, self.top_k, h)  # each (token, choice) in place again
        y = (per_assignment * routing.weight[..., None]).sum(1)
        return y, load_balancing_loss(routing), routing


def grouped_mlp(rows: torch.Tensor, sizes: list[int], w_in: torch.Tensor, w_out: torch.Tensor,
                grouped: bool | None = None) -> torch.Tensor:
    """Each expert's MLP on its own rows: ``rows`` (Σ sizes, h) sorted by expert, ``sizes[j]`` rows for
    expert j, ``w_in`` (E, h, f), ``w_out`` (E, f, h). ``grouped``: one ``torch._grouped_mm`` per matrix
    (default on CPU in float32, bf16 or fp16, which PyTorch 2.13 runs there; not float64; on GPUs it wants
    bf16 and recent hardware), else a loop over experts. Both give the same rows and gradients (``tests/test_expert.py``)."""
    if grouped is None:
        grouped = (rows.device.type == "cpu" and hasattr(torch, "_grouped_mm")
                   and rows.dtype in (torch.float32, torch.bfloat16, torch.float16))
    if grouped:
        offs = torch.tensor(sizes, device=rows.device).cumsum(0).to(torch.int32)
        return torch._grouped_mm(nn.functional.gelu(torch._grouped_mm(rows, w_in, offs=offs)), w_out, offs=offs)
    return torch.cat([nn.functional.gelu(part @ w_in[j]) @ w_out[j] for j, part in enumerate(rows.split(sizes))])


def dropless_bytes(tokens: int, top_k: int, hidden: int, num_experts: int, element_size: int = 4) -> dict:
    """Bytes a rank sends in dropless dispatch: its T·k rows, whatever the routing, and the counts (E int64)
    before them; what it sends back in combine depends on the routing (its experts' rows)."""
    return {"counts": num_experts * 8, "dispatch": tokens * top_k * hidden * element_size}


# -- balancing without a loss, and routing limited to a few nodes ------------------------------------------

def biased_top_k(scores: torch.Tensor, bias: torch.Tensor, top_k: int):
    """DeepSeek-V3's selection: experts chosen by scores + bias, gates from the scores alone, renormalised
    over the chosen (``scores`` (T, E), the router's affinities; ``bias`` (E,)). Returns (expert, weight)."""
    expert = (scores + bias).topk(top_k, dim=-1).indices  # (T, k)
    weight = scores.gather(-1, expert)
    return expert, weight / weight.sum(-1, keepdim=True)


def update_bias(bias: torch.Tensor, expert: torch.Tensor, gamma: float) -> torch.Tensor:
    """One step of the bias rule: b_e + γ·sign(mean load − load_e), loads counted over this step's choices."""
    load = torch.bincount(expert.flatten(), minlength=bias.numel()).to(bias.dtype)
    return bias + gamma * torch.sign(load.mean() - load)


def node_limited_top_k(scores: torch.Tensor, top_k: int, nodes: int, max_nodes: int) -> torch.Tensor:
    """The top-k experts of each token among those on its ``max_nodes`` best nodes (experts placed in
    contiguous blocks, E/nodes per node; a node's worth for a token: the sum of its top_k/max_nodes best
    scores there). scores (T, E) -> expert (T, k)."""
    t, e = scores.shape
    if e % nodes or not 1 <= max_nodes <= nodes or top_k > max_nodes * (e // nodes):
        raise ValueError(f"nodes={nodes}, max_nodes={max_nodes}, top_k={top_k} for {e} experts: nodes must "
                         f"divide the experts, max_nodes be in 1..nodes, and top_k fit on max_nodes nodes")
    per_node = scores.view(t, nodes, e // nodes)
    worth = per_node.topk(max(1, top_k // max_nodes), dim=-1).values.sum(-1)  # (T, nodes)
    allowed = torch.zeros(t, nodes, dtype=torch.bool, device=scores.device)
    allowed.scatter_(1, worth.topk(max_nodes, dim=-1).indices, True)
    masked = scores.masked_fill(~allowed.repeat_interleave(e // nodes, dim=1), float("-inf"))
    return masked.topk(top_k, dim=-1).indices
