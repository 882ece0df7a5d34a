"""The cost terms of the newer axes (chapter 07, priced as chapter 10 teaches them): FP8's casts, context
parallelism's exchange of keys and values, and a mixture of experts' all-to-alls, each per micro-batch on the
slowest stage's rank (:func:`~parlab.decide.planner.step.predict`)."""

from __future__ import annotations

from parlab.decide.planner.hardware import Cluster, collective_seconds, ring_costs
from parlab.decide.planner.layout import Layout
from parlab.decide.planner.workload import FP8_RECIPES, Workload


def fp8_cast_bytes(w: Workload) -> float:
    """Bytes one token's casts to FP8 read and write per layer, forward and backward (0 unless
    ``precision="fp8"``): each linear layer's input forward, its output's gradient backward and its input
    again for the weights' gradient, about 9·h + 4·f values for a layer of width h and MLP width f (the MLPs
    a token runs through), each at :data:`FP8_RECIPES`' bytes."""
    if w.precision != "fp8":
        return 0.0
    return (9 * w.hidden + 4 * w.dense.intermediate_size) * FP8_RECIPES[w.fp8_recipe]


def fp8_scaling(w: Workload, layers: int, tokens: float, layout: Layout, cluster: Cluster) -> float:
    """Seconds one micro-batch's casts to FP8 take on a rank (0 unless ``precision="fp8"``): the activations'
    (:func:`fp8_cast_bytes` per token and layer, over tp) and the weights', once forward and once
    transposed for backward, unless ZeRO-3 gathers them already in FP8 (``fp8_gather``)."""
    if w.precision != "fp8":
        return 0.0
    activations = layers * tokens * fp8_cast_bytes(w) / layout.tp
    weights = 0.0 if w.fp8_gather else 2 * layers * w.rank_layer_params(layout) * FP8_RECIPES[w.fp8_recipe]
    return (activations + weights) / cluster.gpu.memory_bandwidth


def kv_block(w: Workload, layout: Layout) -> float:
    """Bytes of one rank's keys and values for one layer and micro-batch: b · (s/cp) · g · (d_k + d_v) over tp."""
    return (w.micro_batch * w.seq_len / layout.cp * w.kv_heads / layout.tp * sum(w.head_dims) * w.value_bytes)


def context(w: Workload, layout: Layout, cluster: Cluster, layers: int, attention_s: float, off):
    """(forward, backward) seconds context parallelism exposes per micro-batch on the slowest stage. Ring: cp − 1
    steps per layer, each passing one K/V block (backward: the block and its gradient) beside the attention
    of the block before, so only what a step's message exceeds its computation is exposed (chapter 10's
    ``cp_step``). All-gather: the whole K/V gathered before attention, their gradients reduce-scattered after,
    nothing beside them (Llama 3)."""
    cp = layout.cp
    if cp == 1 or "cp" in off:
        return 0.0, 0.0
    block, group = kv_block(w, layout), layout.group("cp")
    costs = ring_costs(cluster.span_link(group), cp)
    if layout.cp_kind == "all_gather":
        gather = collective_seconds("all_gather", cp * block, costs)
        scatter = collective_seconds("reduce_scatter", cp * block, costs)
        return layers * gather, layers * (scatter + (gather if w.recompute == "full" else 0.0))
    send = collective_seconds("send", block, costs)
    backward_attention = attention_s * (2 + w.fused_backward_flops / w.attention_flops)
    forward = (cp - 1) * max(0.0, send - attention_s / cp)
    backward = (cp - 1) * max(0.0, 2 * send - backward_attention / cp)
    return layers * forward, layers * (backward + (forward if w.recompute == "full" else 0.0))


def experts(w: Workload, layout: Layout, cluster: Cluster, layers: int, off) -> tuple[float, float]:
    """(forward, backward) seconds a MoE's expert parallelism adds per micro-batch on the slowest stage: per
    layer the dispatch and combine all-to-alls over the ep group (each rank's tokens × k × h, its share for its
    own experts kept), forward and again backward, :meth:`Cluster.all_to_all_seconds`; with etp = tp > 1 the
    routed tokens are also all-gathered and reduce-scattered over tp; and the permutations that sort the
    tokens by expert and back, memory-bound. The router's work is left out (h × E FLOPs per token)."""
    if not w.experts or "ep" in off:
        return 0.0, 0.0
    tokens = w.micro_batch * w.seq_len / (layout.cp * layout.tp)  # sequence-parallel: each tp rank its share
    routed = tokens * w.experts[1] * (w.capacity_factor or 1.0) * w.hidden * w.value_bytes
    exchange = 2 * cluster.all_to_all_seconds(layout.group("ep"), routed)  # dispatch, combine
    if layout.etp > 1:
        costs = ring_costs(cluster.link(layout.topology, "tp"), layout.tp)
        exchange += (collective_seconds("all_gather", layout.tp * routed, costs)
                     + collective_seconds("reduce_scatter", layout.tp * routed, costs))
    permute = 4 * routed / cluster.gpu.memory_bandwidth  # read and write, there and back
    return layers * (exchange + permute), layers * (exchange + permute)


def expert_fixed(w: Workload, layout: Layout, cluster: Cluster, layers: int, off) -> tuple[float, float]:
    """(forward, backward) seconds a MoE's experts cost per micro-batch on the slowest stage beyond their FLOPs
    and bytes: per layer, each of the rank's E/ep local experts costs :attr:`Cluster.expert_seconds` (a third
    forward, two thirds backward, as its matrix products split), however many tokens it got. This is why a
    run with many small experts on each rank is slower than its FLOPs say, and why a larger ep helps it."""
    if not w.experts or "expert_fixed" in off:
        return 0.0, 0.0
    fixed = layers * w.experts[0] / layout.ep * cluster.expert_seconds
    return fixed / 3, 2 * fixed / 3
