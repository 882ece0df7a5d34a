"""A mixture of experts the slow way, one token at a time: the independent reference of chapter 10.

:mod:`parlab.lab.parallel.expert` routes, dispatches and combines with tensors, and :class:`~parlab.lab.parallel.expert.
ExpertParallelMoE` shares those functions with the dense :class:`~parlab.lab.parallel.expert.MoE`: a bug in them
would be in both, and a comparison of the two would pass it. This file shares no code with them. It reads
as the papers state the layer (GShard §2.2, Switch eq. 4), with Python loops:

- each token's probabilities are the softmax of its router scores; its k experts the k largest (``sorted``);
- its gates: top-1, the raw probability (Switch); top-k, the k probabilities renormalised to sum to 1
  (GShard, Mixtral);
- capacity by priority, choice-major: every token's first choice is served, in token order, before any
  second choice; an expert that is full drops the assignment;
- the output of token x: Σᵢ gᵢ·Eᵢ(x) over its kept choices, Eᵢ(x) = GeLU(x·W_in[i])·W_out[i];
- the balancing loss E·Σₑ fₑ·Pₑ, fₑ the share of the group's T·k assignments that chose e, Pₑ the mean
  probability of e.

It is differentiable (the gates and the experts are torch operations on one token), so gradients can be
compared too. Slow on purpose: use it on tens of tokens, in tests and in the chapter's checks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def naive_moe(x, router, w_in, w_out, top_k: int, capacity_factor: float | None, groups=1):
    """The MoE layer token by token. x (T, h); router (h, E); w_in (E, h, f); w_out (E, f, h).

    ``groups``: an int (equal groups, ``tensor_split``) or a list of group sizes; each group has its own
    capacity, ⌈capacity_factor · T_max · k / E⌉ with T_max the largest group's tokens, and its own loss;
    ``capacity_factor=None``: no capacity (dropless). Returns (y (T, h), aux: the mean of the groups'
    losses, kept: a list of (token, expert) assignments served)."""
    num_experts = router.shape[1]
    sizes = [len(p) for p in torch.arange(len(x)).tensor_split(groups)] if isinstance(groups, int) else list(groups)
    biggest = max(sizes)
    cap = math.inf if capacity_factor is None else max(1, math.ceil(capacity_factor * biggest * top_k / num_experts))
    rows, aux, kept, start = [], 0.0, [], 0
    for size in sizes:
        tokens = range(start, start + size)
        probs = {t: torch.softmax(x[t] @ router, dim=-1) for t in tokens}
        chosen = {t: sorted(range(num_experts), key=lambda e: -float(probs[t][e].detach()))[:top_k] for t in tokens}
        served = {e: 0 for e in range(num_experts)}
        keep = set()
        for choice in range(top_k):  # priority: all first choices, then all second choices, ...
            for t in tokens:
                e = chosen[t][choice]
                if served[e] < cap:
                    served[e] += 1
                    keep.add((t, e))
        for t in tokens:
            gates = [probs[t][e] for e in chosen[t]]
            total = sum(gates) if top_k > 1 else 1.0
            out = torch.zeros_like(x[t])
            for e, g in zip(chosen[t], gates):
                if (t, e) in keep:
                    out = out + (g / total) * (F.gelu(x[t] @ w_in[e]) @ w_out[e])
            rows.append(out)
        share = [sum(chosen[t].count(e) for t in tokens) / (size * top_k) for e in range(num_experts)]
        mean_prob = [sum(probs[t][e] for t in tokens) / size for e in range(num_experts)]
        aux = aux + num_experts * sum(f * p for f, p in zip(share, mean_prob)) / len(sizes)
        kept += sorted(keep)
        start += size
    return torch.stack(rows), aux, kept

