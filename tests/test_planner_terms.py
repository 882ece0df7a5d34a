"""The planner's newer terms (``parlab.decide.planner.terms``: FP8's casts, context parallelism's K/V exchange,
expert parallelism's all-to-alls; HSDP's composed reduction; NVLink domains larger than a node) checked as the
older ones are: the bytes it says each rank sends on the cp, ep and HSDP axes against what chapter 10's ring
attention and expert-parallel MoE layer, and FSDP2 on a 2-D mesh, send on gloo CPU ranks; what each term adds
(``predict(..., without=(term,))``) against its formula worked by hand; memory over ep, edp and cp; bad input
named; and ``candidates`` searching the new axes."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from transformers import LlamaConfig, MixtralConfig

import parlab
from parlab.decide import planner
from parlab.lab.measure import CommLog
from parlab.lab.measure.comm import record_comm
from parlab.lab.parallel import context as cpx
from parlab.lab.parallel import expert as epx

# -- small models ---------------------------------------------------------------------------------------------

H, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 4, 2, 16, 2  # a small Llama for CP and HSDP
SEQ, MICRO, M = 32, 2, 2  # tokens per sequence, sequences per micro-batch, micro-batches per step
MOE_H, MOE_FFN, EXPERTS, TOP_K, CF, MOE_LAYERS, MOE_TOKENS = 256, 512, 8, 2, 1.25, 4, 16


def _llama(**changes):
    return LlamaConfig(**{**dict(hidden_size=H, intermediate_size=128, num_hidden_layers=LAYERS,
                                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=128), **changes})


def _mixtral(**changes):
    return MixtralConfig(**{**dict(hidden_size=MOE_H, intermediate_size=MOE_FFN, num_hidden_layers=MOE_LAYERS,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                   num_local_experts=EXPERTS, num_experts_per_tok=TOP_K), **changes})


def _big_llama():  # two layers of a Llama 2 7B-like shape (GQA 32/8): where the terms are worth seconds
    return LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=32000)


# -- against chapter 10's code and FSDP2 on CPU ranks ---------------------------------------------------------

class _Unit(nn.Module):
    """Parameters of given shapes, each used once: FSDP2 gathers and reduces them as it would the model's."""

    def __init__(self, shapes):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(s)) for s in shapes)

    def forward(self, x):
        return x + sum(p.sum() for p in self.weights)


class _Shapes(nn.Module):
    """A stand-in with a transformers model's parameters, unit by unit (the root's, then each layer's), so that
    the ranks need not import transformers; FSDP2's bytes depend on the shapes and units alone."""

    def __init__(self, root, layers):
        super().__init__()
        self.root = _Unit(root)
        self.layers = nn.ModuleList(_Unit(shapes) for shapes in layers)

    def forward(self, x):
        x = self.root(x)
        for layer in self.layers:
            x = layer(x)
        return x


def _measure(root, layers):
    """On 4 gloo ranks: bytes each sends per step under chapter 10's ring attention (cp 2 and 4) and
    expert-parallel MoE layer (ep 2 and 4), and under FSDP2's HSDP (2 replicas × 2 shards)."""
    r = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    out = {}
    for n in (2, 4):
        group = None if n == 4 else pairs[r // 2]
        layout = cpx.Layout(SEQ, n)
        mine = len(layout.positions(dist.get_rank(group)))
        with CommLog() as log:
            for _ in range(M * LAYERS):  # one ring attention per layer and micro-batch, forward and backward
                q = torch.randn(MICRO, HEADS, mine, HEAD_DIM, requires_grad=True)
                k, v = (torch.randn(MICRO, KV_HEADS, mine, HEAD_DIM, requires_grad=True) for _ in range(2))
                cpx.ring_attention(q, k, v, layout, group).sum().backward()
        out["cp", n] = sum(rec.bytes for rec in log.records if rec.op == "send")
        with CommLog() as log:
            for _ in range(M * MOE_LAYERS):  # one MoE layer per layer and micro-batch
                layer = epx.ExpertParallelMoE(epx.MoE(MOE_H, MOE_FFN, EXPERTS, TOP_K, CF), group)
                x = torch.randn(MOE_TOKENS, MOE_H, requires_grad=True)
                layer(x)[0].sum().backward()
        out["ep", n] = sum(rec.bytes for rec in log.records if rec.op == "all_to_all")
    from torch.distributed.fsdp import fully_shard

    from parlab.lab import runtime
    mesh = runtime.mesh((2, 2), ("replicate", "shard"))  # HSDP: ZeRO-3 over the shard dim, replicated over the other
    model = _Shapes(root, layers)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with record_comm() as log:
        model(torch.ones(())).backward()
    out["hsdp"] = [(rec.op, rec.bytes, rec.group_size) for rec in log.records]
    return out


def _units(config):
    from parlab.lab.measure.activations import config_json, meta_model

    model = meta_model(config_json(config))
    stack = model.model.layers
    in_layers = {id(p) for p in stack.parameters()}
    root = [tuple(p.shape) for p in model.parameters() if id(p) not in in_layers]
    return root, [[tuple(p.shape) for p in layer.parameters()] for layer in stack]


@pytest.fixture(scope="module")
def measured():
    results = parlab.launch(_measure, world_size=4, args=_units(_llama()), announce=False, output="none")
    assert all(res == results[0] for res in results)  # every rank sends as much
    return results[0]


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_bytes_are_what_chapter_10s_ring_attention_sends(measured, cp):
    w = planner.Workload(_llama(), global_batch=M * MICRO, micro_batch=MICRO, seq_len=SEQ, precision="fp32")
    p = planner.predict(w, planner.Layout(cp=cp), planner.Cluster(gpus_per_node=cp))
    block = 2 * MICRO * SEQ // cp * KV_HEADS * HEAD_DIM * 4  # one rank's K and V of one layer, fp32
    assert measured["cp", cp] == M * LAYERS * (3 * cp - 2) * block  # cp − 1 forward, cp − 1 + cp backward
    assert p.bytes_by_axis["cp"] == measured["cp", cp]
    assert measured["cp", cp] == M * LAYERS * sum(cpx.ring_bytes(cpx.Layout(SEQ, cp), 0, MICRO, KV_HEADS,
                                                                  HEAD_DIM).values())


@pytest.mark.parametrize("ep", [2, 4])
def test_ep_bytes_are_what_chapter_10s_moe_layer_sends(measured, ep):
    w = planner.Workload(_mixtral(), global_batch=M * ep, seq_len=MOE_TOKENS, precision="fp32", capacity_factor=CF)
    p = planner.predict(w, planner.Layout(dp=ep, ep=ep), planner.Cluster(gpus_per_node=ep))
    slots = epx.capacity(MOE_TOKENS, EXPERTS, TOP_K, CF) * EXPERTS  # 5 × 8 = 1.25 × 16 tokens × top-2
    assert slots == CF * MOE_TOKENS * TOP_K
    # dispatch and combine, forward and backward, of every expert's slots, per layer and micro-batch
    assert measured["ep", ep] == 4 * M * MOE_LAYERS * slots * MOE_H * 4
    assert p.bytes_by_axis["ep"] == measured["ep", ep]


def test_hsdp_bytes_on_each_dim_are_what_fsdp2_sends_and_the_replicas_all_reduce_is_priced(measured):
    records = measured["hsdp"]
    assert {size for _, _, size in records} == {2}
    shard = sum(b for op, b, _ in records if op in ("all_gather", "reduce_scatter"))
    replicate = sum(b for op, b, _ in records if op == "all_reduce")
    w = planner.Workload(_llama(), global_batch=4, seq_len=SEQ, precision="fp32")  # one micro-batch per rank
    layout = planner.Layout(dp=4, shard=2, zero_stage=3)
    cluster = planner.Cluster(gpus_per_node=2, nodes=2, overlap=False)  # shards in a node, replicas across
    p = planner.predict(w, layout, cluster, implementation="course")
    psi = w.num_params * 4
    # FSDP2 gathers each layer twice and the root once, reduce-scatters everything once, over the shard dim ...
    assert shard == 2 * psi - w.root_params * 4 + psi == p.bytes_by_axis["dp"]
    # ... and all-reduces each rank's 1/shard of the gradients across the replicas
    assert replicate == psi // 2
    # The planner prices that all-reduce inside the reduction (the composed β): the step moves with the
    # replicas' link by exactly these bytes' ring time, 2(r − 1)/r · bytes / B, r = 2.
    slow, fast = (replace(cluster, inter=planner.Link("test", 5e-6, bw, "test")) for bw in (1e9, 2e9))
    steps = [planner.predict(w, layout, c, implementation="course", without=("latency",)).step_s for c in (slow, fast)]
    torch.testing.assert_close(steps[0] - steps[1], replicate * (1 / 1e9 - 1 / 2e9), rtol=1e-9, atol=0)
