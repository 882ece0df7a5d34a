"""The cp and ep axes priced by the planner (``planner.predict`` with ``Layout(cp=, ep=)``), and chapter 10's
published inputs (``parlab.decide.planner_axes``), against the estimator and the package's own formulas."""

from __future__ import annotations

import math

import pytest
from transformers import LlamaConfig, MixtralConfig

from parlab.decide import planner
from parlab.decide import planner_axes as pa
from parlab.lab.parallel import context as cpx
from parlab.lab.parallel import expert as epx

SMALL = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=6, num_attention_heads=8,
                    num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)
SMALL_MOE = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=500,
                          max_position_embeddings=4096)
NODES = planner.cluster_of("h100", 2)  # 16 GPUs


def test_context_parallel_divides_activations_not_model_states():
    w = planner.Workload(SMALL, global_batch=8, seq_len=2048, sequence_parallel=True)
    one = planner.predict(w, planner.Layout(tp=2, dp=8, zero_stage=1), NODES).memory
    four = planner.predict(w, planner.Layout(tp=2, cp=4, dp=2, zero_stage=1), NODES).memory
    assert four.activations == math.ceil(one.activations / 4)
    assert four.model_states == one.model_states  # ZeRO shards over dp × cp = 8 ranks in both
    alone = planner.predict(w, planner.Layout(tp=2, dp=2, zero_stage=1), planner.cluster_of("h100", 1, gpus_per_node=4))
    assert alone.memory.optimizer == pytest.approx(4 * one.optimizer, rel=1e-3)  # over dp × cp, not dp alone


def test_expert_parallel_divides_expert_weights():
    w = planner.Workload(SMALL_MOE, global_batch=16, seq_len=64, precision="fp32", optimizer="sgd")
    psi, experts = w.num_params, w.expert_params
    assert w.experts[:2] == (8, 2) and 0 < experts < psi
    dense = planner.predict(w, planner.Layout(dp=16), NODES).memory
    split = planner.predict(w, planner.Layout(dp=16, ep=4), NODES).memory
    assert dense.params == 4 * psi
    assert split.params == pytest.approx(4 * (psi - experts) + 4 * experts / 4, abs=8)
    z = planner.predict(w, planner.Layout(dp=16, ep=4, zero_stage=3), NODES).memory  # dense /16, experts /4 then /4
    assert z.params == pytest.approx(4 * (psi - experts) / 16 + 4 * experts / 4 / 4, abs=8)
    with pytest.raises(ValueError, match="ep × etp = 3 must divide tp × cp × dp = 16"):
        planner.Layout(dp=16, ep=3)
    with pytest.raises(ValueError, match="ep=16 does not divide the model's 8 routed experts"):
        planner.predict(w, planner.Layout(dp=16, ep=16), NODES)


def test_cp_and_ep_bytes_follow_the_package_formulas():
    w = planner.Workload(SMALL, global_batch=4, seq_len=64, micro_batch=2)
    ring = planner.predict(w, planner.Layout(tp=2, cp=4, dp=2), NODES)
    m, layers = ring.micro_batches, ring.stages[0]
    per_layer = cpx.ring_bytes(cpx.Layout(64, 4), 0, 2, 1, 32, 2)  # 1 K/V head per tp rank, head_dim 32, bf16
    assert ring.bytes_by_axis["cp"] == m * layers * (per_layer["forward"] + per_layer["backward"])
    gather = planner.predict(w, planner.Layout(tp=2, cp=4, dp=2, cp_kind="all_gather"), NODES)
    block = 2 * 2 * (64 // 4) * 1 * 32 * 2  # K and V of s/cp tokens, b = 2
    assert gather.bytes_by_axis["cp"] == m * layers * 2 * 4 * block  # all-gather and reduce-scatter, nccl sizes
    moe = planner.Workload(SMALL_MOE, global_batch=16, seq_len=64, capacity_factor=1.25)
    p = planner.predict(moe, planner.Layout(dp=16, ep=8), NODES)
    capacity = epx.capacity(64, 8, 2, 1.25)  # 20 slots per expert: 64 tokens × 2 × 1.25 / 8
    dispatch = epx.all_to_all_bytes(epx.placement(8, 8), 0, capacity, 64, element_size=2)["dispatch"]
    assert p.bytes_by_axis["ep"] == 4 * p.micro_batches * 2 * dispatch  # 4 all-to-alls per layer and micro-batch


def test_the_ring_hides_past_its_chunk():
    """predict's ring term hides a step's K/V block behind its attention past n* = g·e·F/(2·h·B): attention
    counted unmasked (4·s·h per token) at the GPU's fused-kernel rate (α left out, as n* leaves it)."""
    w, cluster = pa.llama3_128k(), pa.llama3_cluster()
    gpu, link = cluster.gpu, cluster.inter
    n_star = cpx.overlap_chunk(heads=16, kv_heads=1, head_dim=128, flops=gpu.attention_flops["sdpa"],
                               bandwidth=link.bandwidth, causal=False)
    small = planner.cluster_of("h100", 16, inter=pa.LLAMA3_FABRIC)
    exposed = {}
    for n in (int(0.9 * n_star) // 2 * 2, int(1.1 * n_star) // 2 * 2):
        short = planner.Workload(w.config, global_batch=1, seq_len=16 * n, sequence_parallel=True)
        p = planner.predict(short, planner.Layout(tp=8, cp=16), small, without=("latency",))
        exposed[n] = p.parts["cp"]
    below, above = exposed.values()
    assert below > 0 and above == 0


def test_llama3_128k_layout():
    w, layout, cluster = pa.llama3_128k(), pa.LLAMA3_128K, pa.llama3_cluster()
    assert layout.world_size == cluster.world_size == 16384  # TP 8 × CP 16 × PP 16 × DP 8
    cp16 = planner.predict(w, layout, cluster)
    without = planner.predict(w, planner.Layout(tp=8, pp=16, dp=128, zero_stage=1), cluster)
    assert without.memory.activations == pytest.approx(16 * cp16.memory.activations, rel=1e-6)
    assert without.memory.model_states == cp16.memory.model_states  # ZeRO-1 over dp × cp = 128 in both
    block = 2 * 1 * 8192 * 1 * 128 * 2  # K and V of 8,192 tokens, 1 KV head per tp rank
    layers = max(cp16.stages)
    assert cp16.bytes_by_axis["cp"] == cp16.micro_batches * layers * 2 * 16 * block
    assert cluster.span_link(layout.group("cp")) == pa.LLAMA3_FABRIC  # one GPU per node in a cp group of 16
    assert pa.LLAMA3_FABRIC.bandwidth == 50e9  # Llama 3's 400 Gb/s per GPU, not an A100-era HDR adapter
    ring = planner.predict(w, planner.Layout(tp=8, cp=16, pp=16, dp=8, zero_stage=1), cluster)
    assert ring.parts["cp"] == 0 < cp16.parts["cp"]  # 8,192 tokens per rank: the ring hides, the gather does not


def test_llama3_128k_fits_its_h100s_only_with_recomputation():
    """The published run chapter 10 prices fits the 80 GB it ran on by the planner's memory only with full
    recomputation; CP alone leaves transformers' Llama activations above 80 GB. ZeRO-1 beside the pipeline,
    as the planner runs it: the fp32 gradients whole, the optimizer states over dp × cp = 128."""
    layout, cluster = pa.LLAMA3_128K, pa.llama3_cluster()
    plain = planner.predict(pa.llama3_128k(), layout, cluster)
    recomputed = planner.predict(pa.llama3_128k(checkpointing=True), layout, cluster)
    assert recomputed.fits and not plain.fits
    assert recomputed.memory.total <= cluster.gpu.memory < plain.memory.total
    m = plain.memory
    assert m.grads == pytest.approx(2 * m.params, rel=1e-6)  # fp32 gradients of bf16 weights, whole
    assert m.optimizer == pytest.approx(12 * m.params / 2 / 128, rel=1e-3)  # fp32 master + 2 moments, /128
