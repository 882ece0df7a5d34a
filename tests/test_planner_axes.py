"""Pricing the cp and ep axes (``parlab.decide.planner_axes``, chapter 10) against the estimator and by hand."""

from __future__ import annotations

import math

import pytest
from transformers import LlamaConfig

from parlab.decide import planner_axes as pa
from parlab.lab.measure import estimate_memory
from parlab.lab.parallel import context as cpx

SMALL = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=6, num_attention_heads=8,
                    num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)


def test_by_layers_is_the_deep_estimate():
    kw = dict(world_size=8, tp_size=2, pp_size=2, micro_batch=1, seq_len=1024, precision="bf16", zero_stage=1)
    deep = estimate_memory(SMALL, **kw)
    assert pa.by_layers(estimate_memory, SMALL, **kw).as_dict() == pytest.approx(deep.as_dict(), abs=8)


def test_context_parallel_divides_activations_not_model_states():
    kw = dict(world_size=16, tp_size=2, micro_batch=1, seq_len=2048, precision="bf16", zero_stage=1)
    one, four = pa.estimate_memory_axes(SMALL, cp=1, **kw), pa.estimate_memory_axes(SMALL, cp=4, **kw)
    assert four.activations == math.ceil(one.activations / 4)
    assert four.model_states == one.model_states  # ZeRO shards over dp × cp = 8 ranks in both


def test_expert_parallel_divides_expert_weights():
    psi, experts = 10_000_000, 8_000_000
    kw = dict(num_params=psi, world_size=8, precision="fp32", optimizer="sgd")
    dense = pa.estimate_memory_axes(**kw)
    split = pa.estimate_memory_axes(ep=4, expert_params=experts, **kw)
    assert dense.params == 4 * psi and split.params == 4 * (psi - experts) + 4 * experts // 4
    z = pa.estimate_memory_axes(ep=4, expert_params=experts, zero_stage=3, **kw)  # dense /8, experts /4 then /2
    assert z.params == math.ceil(4 * (psi - experts) / 8) + math.ceil(4 * experts / 4 / 2)
    with pytest.raises(ValueError, match="ep=3 must divide dp × cp = 8"):
        pa.estimate_memory_axes(ep=3, expert_params=experts, **kw)


def test_cp_and_ep_bytes_follow_the_package_formulas():
    got = pa.cp_bytes(seq_len=64, cp=4, batch=2, kv_heads=2, head_dim=8, layers=3, value_bytes=4)
    ring = cpx.ring_bytes(cpx.Layout(64, 4), 0, 2, 2, 8, 4)
    assert (got["forward"], got["backward"]) == (3 * ring["forward"], 3 * ring["backward"])
    assert pa.ep_bytes(tokens=24, hidden=8, num_experts=6, top_k=2, capacity_factor=1.25, layers=2,
                       value_bytes=4) == 4 * 2 * 6 * 10 * 8 * 4


def test_llama3_128k_layout():
    r = pa.llama3_128k()
    assert r["world_size"] == 16384  # TP 8 × CP 16 × PP 16 × DP 8
    assert r["memory_without_cp"].activations == pytest.approx(16 * r["memory"].activations, rel=1e-6)
    assert r["bytes"]["block"] == 2 * 1 * 1 * 8192 * 128 * 2  # K and V of 8,192 tokens, 1 KV head per tp rank
    assert r["step"].chunk == 8192 and r["step"].overlapped and r["overlap_chunk"] < 8192
    assert r["link"].bandwidth == 50e9  # Llama 3's 400 Gb/s per GPU, not an A100-era HDR adapter


def test_llama3_128k_fits_its_h100s_only_with_recomputation():
    """The published run the course prices in chapter 10 fits the 80 GB it ran on by the estimate: with the
    paper's FSDP (optimizer states and fp32 gradients sharded over dp × cp, the weights whole) and
    recomputation; CP alone leaves transformers' Llama activations above 80 GB."""
    plain, recomputed = pa.llama3_128k(), pa.llama3_128k(checkpointing=True)
    gpu = pa.H100.memory
    assert recomputed["memory"].total <= gpu < plain["memory"].total
    assert plain["memory"].grads == math.ceil(4 * plain["memory"].params / 2 / 128)  # fp32, over dp × cp = 128
    zero1 = pa.llama3_128k(zero_stage=1, fp32_grads=False)
    assert zero1["memory"].grads == plain["memory"].params  # ZeRO-1 would keep bf16 gradients whole
