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
        layer = epx.ExpertParallelMoE(epx.MoE(MOE_H, MOE_FFN, EXPERTS, TOP_K, CF), group)
        with CommLog() as log:
            for _ in range(M * MOE_LAYERS):  # the layer run once per layer and micro-batch (the bytes are its shapes')
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


# -- what each term adds, against its formula by hand ---------------------------------------------------------

def _layer_params(h, f, heads, kv_heads):
    """One Llama layer's weights: q and o (h × h), k and v (h × kv_heads · head_dim), the MLP's three h × f,
    two norms."""
    kv = kv_heads * h // heads
    return 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h


@pytest.mark.parametrize("recipe, gather", [("tensorwise", False), ("delayed", False), ("tensorwise", True)])
def test_fp8_casts_add_what_their_bytes_take_at_memory_bandwidth(recipe, gather):
    seq, m, h, f, layers = 512, 2, 4096, 11008, 2
    w = planner.Workload(_big_llama(), global_batch=m, seq_len=seq, precision="fp8", fp8_recipe=recipe,
                         fp8_gather=gather)
    cluster = planner.Cluster(gpu=planner.H100, gpus_per_node=1)
    added = (planner.predict(w, planner.Layout(), cluster).step_s
             - planner.predict(w, planner.Layout(), cluster, without=("fp8_scaling",)).step_s)
    per_value = planner.FP8_RECIPES[recipe]  # bytes per value cast: the FP8 copy, and tensorwise's amax read
    activations = layers * seq * (9 * h + 4 * f) * per_value  # each linear layer's inputs and output gradients
    weights = 0 if gather else 2 * layers * _layer_params(h, f, 32, 8) * per_value  # forward, and transposed
    torch.testing.assert_close(added, m * (activations + weights) / 3.35e12, rtol=1e-9, atol=0)
    assert added > 0


def test_fp8_casts_are_a_third_forward_and_two_thirds_backward():
    """Under DDP whose all-reduce outlasts the last backward, the step is forward + backward − its last pass +
    the all-reduce: the casts add a third of each pass forward, two thirds of every backward pass but the last."""
    seq, m, h, f, layers = 512, 2, 4096, 11008, 2
    w = planner.Workload(_big_llama(), global_batch=2 * m, seq_len=seq, precision="fp8", fp8_recipe="delayed")
    cluster = planner.Cluster(gpu=planner.H100, gpus_per_node=1, nodes=2)  # 2.7 GB of gradients over HDR
    added = (planner.predict(w, planner.Layout(dp=2), cluster).step_s
             - planner.predict(w, planner.Layout(dp=2), cluster, without=("fp8_scaling",)).step_s)
    per_value = planner.FP8_RECIPES["delayed"]
    casts = (layers * seq * (9 * h + 4 * f) + 2 * layers * _layer_params(h, f, 32, 8)) * per_value / 3.35e12
    torch.testing.assert_close(added, m * casts / 3 + (m - 1) * 2 * casts / 3, rtol=1e-9, atol=0)

def test_fp8_runs_the_linear_layers_at_the_fp8_rate_and_the_rest_at_16_bits():
    seq, m, h, f, layers = 512, 2, 4096, 11008, 2
    cluster = planner.Cluster(gpu=planner.H100, gpus_per_node=1)
    compute = {p: planner.predict(planner.Workload(_big_llama(), global_batch=m, seq_len=seq, precision=p,
                                                   attention="eager"),
                                  planner.Layout(), cluster, without=("fp8_scaling",)).parts["compute"]
               for p in ("bf16", "fp8")}
    linear = 2 * _layer_params(h, f, 32, 8) * layers * seq  # FLOPs of the linear layers, one forward
    r16, r8 = 989e12 * planner.UTILIZATIONS["h100", "bf16"], 1979e12 * planner.UTILIZATIONS["h100", "fp8"]
    saved = m * 3 * linear * (1 / r16 - 1 / r8)  # forward and twice it backward, the attention core unchanged
    torch.testing.assert_close(compute["bf16"] - compute["fp8"], saved, rtol=1e-9, atol=0)


CP_SEQ = 2048  # attention (∝ s²) of a half-sequence vs one K/V block (∝ s): hidden on NVLink, not over InfiniBand


@pytest.mark.parametrize("kind", ["ring", "all_gather"])
def test_cp_adds_its_exposed_exchange_over_a_slow_link_and_less_over_nvlink(kind):
    w = planner.Workload(_big_llama(), global_batch=1, seq_len=CP_SEQ, attention="eager")
    layout = planner.Layout(cp=2, cp_kind=kind)
    nvlink = planner.Cluster(gpus_per_node=2, overlap=False)  # A100s; collectives taking turns: additive
    infiniband = planner.Cluster(gpus_per_node=1, nodes=2, overlap=False)  # the ring crosses nodes
    block = 2 * (CP_SEQ // 2) * 8 * 128 * 2  # K and V of one layer's half-sequence, bf16: 4 MiB
    attention = 4 * CP_SEQ * 4096 * (CP_SEQ // 2) / (312e12 * 0.61)  # QKᵀ and ·V of a rank's queries, forward
    added = {}
    for name, cluster, alpha, bandwidth in (("nvlink", nvlink, 2e-6, 230e9), ("ib", infiniband, 5e-6, 25e9)):
        send = alpha + block / bandwidth
        if kind == "ring":  # one block per step beside a block's attention; backward: the block and its gradient
            forward, backward = max(0.0, send - attention / 2), max(0.0, 2 * send - 2 * attention / 2)
        else:  # gather the other's block before attention, reduce-scatter the gradients after: all exposed
            forward = backward = send
        p = planner.predict(w, layout, cluster)
        added[name] = p.step_s - planner.predict(w, layout, cluster, without=("cp",)).step_s
        torch.testing.assert_close(p.parts["cp"], 2 * (forward + backward), rtol=1e-9, atol=0)  # 2 layers
        torch.testing.assert_close(added[name], p.parts["cp"], rtol=1e-9, atol=1e-12)
    assert added["ib"] > 1e-4 and added["ib"] > added["nvlink"]
    assert (added["nvlink"] == 0) == (kind == "ring")  # the ring hides behind attention on NVLink


def test_cp_splits_the_computation_and_the_activations():
    w = planner.Workload(_llama(), global_batch=2, seq_len=64)
    one = planner.predict(w, planner.Layout(), planner.Cluster(gpus_per_node=1))
    two = planner.predict(w, planner.Layout(cp=2), planner.Cluster(gpus_per_node=2))
    torch.testing.assert_close(two.parts["compute"], one.parts["compute"] / 2, rtol=1e-12, atol=0)
    assert two.memory.activations == math.ceil(one.memory.activations / 2)


@pytest.mark.parametrize("across", [False, True])
def test_ep_adds_its_all_to_alls_inside_a_node_or_across_two(across):
    seq, cf, layers, h = 1024, 1.25, MOE_LAYERS, MOE_H
    w = planner.Workload(_mixtral(), global_batch=16, seq_len=seq, capacity_factor=cf)
    cluster = planner.cluster_of("h100", **(dict(gpus_per_node=4, nodes=2) if across else {}), overlap=False)
    layout = planner.Layout(dp=8, ep=8)  # two micro-batches per replica
    p = planner.predict(w, layout, cluster)
    added = p.step_s - planner.predict(w, layout, cluster, without=("ep",)).step_s
    routed = seq * 2 * cf * h * 2  # each rank's tokens × top-2 × capacity factor × h, bf16
    if across:  # 3 of the 7 other ranks in the node over NVLink 4, 4 in the other over its NDR adapter, at once
        a2a = 7 * 5e-6 + max(3 / 8 * routed / 370e9, 4 / 8 * routed / 50e9)
    else:
        a2a = 7 * 2e-6 + 7 / 8 * routed / 370e9
    permute = 4 * routed / 3.35e12  # sort by expert and back, read and written
    expected = 2 * layers * 2 * (2 * a2a + permute)  # micro-batches × layers × (forward, backward) × …
    torch.testing.assert_close(p.parts["ep"], expected, rtol=1e-9, atol=0)
    torch.testing.assert_close(added, expected, rtol=1e-9, atol=0)


def test_ep_all_to_alls_across_nodes_cost_more_than_inside():
    w = planner.Workload(_mixtral(), global_batch=16, seq_len=1024, capacity_factor=1.25)
    inside = planner.predict(w, planner.Layout(dp=8, ep=8), planner.cluster_of("h100"))
    across = planner.predict(w, planner.Layout(dp=8, ep=8), planner.cluster_of("h100", gpus_per_node=4, nodes=2))
    assert across.parts["ep"] > 2 * inside.parts["ep"]  # half the shares over 50 GB/s, not 7/8 over 370


@pytest.mark.parametrize("ep, recompute", [(1, "none"), (4, "none"), (2, "full")])
def test_each_local_expert_costs_its_fixed_seconds_per_layer_and_micro_batch(ep, recompute):
    """The experts' fixed cost: layers × E/ep local experts × ``expert_seconds`` per micro-batch (a third forward,
    two thirds backward), the forward's third again under full recomputation, on every pipeline slot."""
    c = 1e-4
    w = planner.Workload(_mixtral(), global_batch=16, seq_len=256, recompute=recompute)
    cluster = planner.cluster_of("h100", overlap=False, expert_seconds=c)
    layout = planner.Layout(dp=4, pp=2, ep=ep)  # two layers a stage, four micro-batches per replica, bubble 1
    p = planner.predict(w, layout, cluster)
    added = p.step_s - planner.predict(w, layout, cluster, without=("expert_fixed",)).step_s
    per_micro_batch = MOE_LAYERS // 2 * EXPERTS / ep * c * (4 / 3 if recompute == "full" else 1)
    torch.testing.assert_close(added, (4 + 1) * per_micro_batch, rtol=1e-9, atol=0)
    assert planner.predict(w, layout, replace(cluster, expert_seconds=0.0)).step_s == pytest.approx(p.step_s - added)
    dense = planner.Workload(_llama(), global_batch=16, seq_len=256)
    assert planner.predict(dense, planner.Layout(dp=8), cluster).parts == \
        planner.predict(dense, planner.Layout(dp=8), cluster, without=("expert_fixed",)).parts


def test_a_larger_ep_pays_fewer_local_experts_fixed_costs():
    w = planner.Workload(_mixtral(), global_batch=16, seq_len=256)
    cluster = planner.cluster_of("b200", overlap=False)
    assert cluster.expert_seconds == planner.EXPERT_SECONDS["blackwell"] < planner.cluster_of("h100").expert_seconds
    compute = {ep: planner.predict(w, planner.Layout(dp=8, ep=ep), cluster).parts["compute"] for ep in (1, 2, 8)}
    assert compute[1] > compute[2] > compute[8]


class _Trace(torch.utils._python_dispatch.TorchDispatchMode):
    """Each op a forward runs, with its outputs, in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if torch.is_tensor(t)]))
        return out


def test_op_recompute_keeps_what_torchtitans_policy_saves_of_a_llama_layer():
    """``recompute="op"``: torchtitan's policy (its ``_save_list``, every second ``aten.mm`` left out; on CPU
    its flash attention is spelled ``_scaled_dot_product_flash_attention_for_cpu``) applied to the ops a
    transformers Llama layer runs in bf16, plus the layer's input, keeps the bytes the planner counts."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = _llama(intermediate_size=96)
    config._attn_implementation = "sdpa"
    layer, rope = LlamaDecoderLayer(config, 0).to(torch.bfloat16), LlamaRotaryEmbedding(config)
    x = torch.randn(MICRO, SEQ, H, dtype=torch.bfloat16)
    with torch.no_grad(), _Trace() as trace:
        layer(x, position_embeddings=rope(x, torch.arange(SEQ)[None]), attention_mask=None)
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    kept, mms = x.nbytes, 0
    for func, outputs in trace.ops:
        mms += func == torch.ops.aten.mm.default
        if func in save and not (func == torch.ops.aten.mm.default and mms % 2 == 0):
            kept += sum(t.nbytes for t in outputs)
    assert mms == 7
    w = planner.Workload(config, global_batch=MICRO, seq_len=SEQ, micro_batch=MICRO, recompute="op")
    assert w.op_layer_bytes() == kept
    assert w.op_recompute_flops == 2 * (H * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * H + H * 96)  # k, o, up


def test_elementwise_traffic_counts_what_each_op_reads_and_writes():
    """The counter's mode, on ops whose bytes are known: SiLU reads and writes x (2·t·h values), the product reads
    two and writes one (3·t·h), both on the (tokens, h) activation; a view moves nothing; a (tokens, 2h) op is
    the split kind. bf16: two bytes a value."""
    from parlab.decide.planner.counting import _traffic_mode

    t, h = 8, 16
    x, wide = torch.randn(t, h, dtype=torch.bfloat16), torch.randn(t, 2 * h, dtype=torch.bfloat16)
    with _traffic_mode(t, h) as mode:
        torch.nn.functional.silu(x) * x.view(t, h)
        wide.mul(2.0).t()
    assert (mode.replicated, mode.split) == (5 * t * h * 2, 2 * t * 2 * h * 2)


def test_eager_elementwise_bytes_per_token_and_over_tp():
    """Eager: counted per token, the same at any length under a fused attention kernel; transformers' own
    attention adds its s × s scores, so it grows with the length. Over tp the MLP's and attention's ops split,
    the (tokens, h) ones only under sequence parallelism. Fused: what the layer saves, once forward and twice
    backward."""
    w = planner.Workload(_llama(), global_batch=4, seq_len=64, micro_batch=2)
    forward, backward = w.elementwise_bytes()
    assert w.elementwise is None and backward > 2 * forward > 0
    longer = replace(w, seq_len=256).elementwise_bytes()
    torch.testing.assert_close(longer, (4 * forward, 4 * backward), rtol=2e-2, atol=0)
    scores = [replace(w, seq_len=s, attention="eager").elementwise_bytes()[0] / s for s in (64, 256)]
    assert scores[1] > scores[0] * 1.5 and scores[0] > forward / 64
    sp = replace(w, sequence_parallel=True)
    torch.testing.assert_close(sp.elementwise_bytes(2), tuple(b / 2 for b in sp.elementwise_bytes()))
    assert all(b2 > b / 2 for b2, b in zip(w.elementwise_bytes(2), w.elementwise_bytes()))
    fused = replace(w, elementwise="fused")
    assert fused.elementwise_bytes() == (w.layer_bytes(), 2 * w.layer_bytes())
    assert replace(w, fused=True).elementwise_bytes() == fused.elementwise_bytes()  # fused=True: fused, unasked


@pytest.mark.parametrize("changes, named", [(dict(elementwise="compiled"), "elementwise='compiled'"),
                                            (dict(elementwise="eager", fused=True), "elementwise='eager'")])
def test_elementwise_refuses_what_it_cannot_price(changes, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        planner.Workload(_llama(), global_batch=4, seq_len=SEQ, **changes)


def test_op_recompute_prices_its_memory_and_its_rerun_products():
    """Memory: what the policy keeps, plus one layer whole while it is recomputed; time: k, o and up again,
    and the memory-bound pass."""
    w = planner.Workload(_big_llama(), global_batch=8, seq_len=4096, recompute="op")
    none = replace(w, recompute="none")
    cluster = planner.cluster_of("h100", overlap=False)
    p, q = (planner.predict(x, planner.Layout(dp=8), cluster) for x in (w, none))
    assert p.memory.activations < q.memory.activations
    redo = p.step_s - planner.predict(w, planner.Layout(dp=8), cluster, without=("recompute",)).step_s
    tokens = 4096
    expected = 2 * (tokens * w.op_recompute_flops / cluster.rate("bf16")
                    + w.elementwise_bytes()[0] / cluster.gpu.memory_bandwidth)  # two layers, one micro-batch
    torch.testing.assert_close(redo, expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("changes", [dict(fused=True), dict(checkpointing=True), dict(recompute="op")])
def test_offloaded_layers_leave_their_activations_but_one_in_flight(changes):
    """``offload_layers``: that many layers' activations in host memory, for each of the p micro-batches the first
    stage holds, one layer's back on the GPU at a time; never more than the stage's layers but one."""
    config = _llama(num_hidden_layers=8)
    w = planner.Workload(config, global_batch=8, seq_len=SEQ, micro_batch=2, **changes)
    cluster = planner.Cluster(gpus_per_node=2)
    kept = {0: None, 3: None, 7: None}
    for n in kept:
        kept[n] = planner.predict(replace(w, offload_layers=n), planner.Layout(pp=2), cluster).memory.activations
    per_layer = (w.op_layer_bytes() if w.recompute == "op" else w.fused_layer_bytes())
    assert kept[0] - kept[3] == pytest.approx(5 * per_layer, abs=2)  # 3 offloaded × 2 micro-batches, one in flight
    assert kept[0] - kept[7] == pytest.approx(5 * per_layer, abs=2)  # a stage of 4 layers: 3 at most


def test_recompute_layers_prices_each_chunks_first_layers_between_none_and_all():
    """``recompute_layers`` (Megatron-Core's ``recompute_method="block"``): that many layers of each model chunk
    recompute, the others keep theirs. The step, its parts and the activations are weighted between no
    recomputation and all of it by layers: 3 of a stage's 4; with 2 chunks a stage, 2 of each is all 4."""
    w = planner.Workload(_llama(num_hidden_layers=8), global_batch=8, seq_len=SEQ, micro_batch=2, recompute="full",
                         fused=True)
    cluster, layout = planner.Cluster(gpus_per_node=2), planner.Layout(pp=2)
    none, full = (planner.predict(x, layout, cluster) for x in (replace(w, recompute="none", checkpointing=False), w))
    some = planner.predict(replace(w, recompute_layers=3), layout, cluster)
    assert none.step_s < some.step_s < full.step_s and full.memory.activations < some.memory.activations
    assert some.step_s == pytest.approx(none.step_s + 0.75 * (full.step_s - none.step_s), rel=1e-12)
    assert some.memory.activations == pytest.approx(
        none.memory.activations + 0.75 * (full.memory.activations - none.memory.activations), abs=1)
    assert some.parts == pytest.approx({k: none.parts[k] + 0.75 * (full.parts[k] - none.parts[k]) for k in full.parts})
    chunks = planner.Layout(pp=2, vp=2)
    assert planner.predict(replace(w, recompute_layers=2), chunks, cluster).step_s == planner.predict(w, chunks, cluster).step_s
    assert planner.predict(replace(w, recompute_layers=1), chunks, cluster).step_s < planner.predict(w, chunks, cluster).step_s
    partial = replace(w, recompute_layers=3)  # the search prices it as predict does; HFU counts 3 of each stage's 4
    searched = {p.layout: p for p in planner.candidates(partial, cluster, zero_stages=(0,))}
    assert searched[layout].step_s == some.step_s and searched[layout].memory == some.memory
    assert some.hfu == pytest.approx(some.mfu * partial.hardware_flops(2) / partial.model_flops(), rel=1e-12)
    assert partial.hardware_flops(2) - partial.model_flops() == pytest.approx(
        0.75 * (w.hardware_flops() - w.model_flops()) + 0.25 * (replace(w, recompute="none", checkpointing=False)
                                                               .hardware_flops() - w.model_flops()), rel=1e-12)


@pytest.mark.parametrize("changes, message", [
    (dict(recompute="none", recompute_layers=3), "recompute_layers=3: 1 to 8 layers of each model chunk, with "
                                                  "recompute='full' (got 'none')"),
    (dict(recompute="full", recompute_layers=0), "recompute_layers=0: 1 to 8"),
    (dict(checkpointing=True, recompute_layers=9), "recompute_layers=9: 1 to 8"),
])
def test_recompute_layers_refuses_a_count_it_cannot_price(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        planner.Workload(_llama(num_hidden_layers=8), global_batch=8, seq_len=SEQ, **changes)


# -- memory: the experts over ep × etp, sharded over edp --------------------------------------------------------

@pytest.mark.parametrize("axes, edp", [(dict(dp=8, ep=4), 2), (dict(dp=4, tp=2, ep=4, etp=2), 1),
                                       (dict(dp=8, ep=2, shard=4), 2)])
def test_experts_memory_is_split_over_ep_and_sharded_over_edp(axes, edp):
    w = planner.Workload(_mixtral(), global_batch=8, seq_len=64)
    layout = planner.Layout(zero_stage=3, **axes)
    p = planner.predict(w, layout, planner.Cluster(gpus_per_node=8), implementation="course")
    experts = w.expert_params
    dense = w.num_params - experts
    tp, ep, etp = layout.tp, layout.ep, layout.etp
    shard = layout.shard or layout.dp  # ZeRO-3 over the shard group (HSDP) or every dp rank
    expected = 2 * (dense / tp / shard + experts / (ep * etp) / edp)  # bf16 weights, each share sharded
    torch.testing.assert_close(float(p.memory.params), expected, rtol=1e-6, atol=4)
    assert len(layout.group("edp")) == (edp * layout.replicas if layout.shard else edp)


def test_a_kind_of_node_with_fewer_gpus_has_a_domain_of_its_own_size():
    """``cluster_of(kind, gpus_per_node=...)``: the NVLink domain follows the node unless the kind names one."""
    assert planner.cluster_of("h100", gpus_per_node=4, nodes=2).domain == 4
    assert planner.cluster_of("gb200", nodes=18).domain == 72
    assert planner.cluster_of("gb200", nodes=18, gpus_per_node=2).domain == 72


# -- bad input named --------------------------------------------------------------------------------------------

def _dense(**changes):
    return planner.Workload(_llama(), **{**dict(global_batch=4, seq_len=SEQ), **changes})


def _moe(**changes):
    return planner.Workload(_mixtral(), **{**dict(global_batch=8, seq_len=64), **changes})


@pytest.mark.parametrize("make, message", [
    (lambda: planner.Layout(dp=4, ep=3), "ep × etp = 3 must divide tp × cp × dp = 4"),
    (lambda: planner.predict(_moe(global_batch=6), planner.Layout(dp=6, ep=6), planner.Cluster(gpus_per_node=6)),
     "ep=6 does not divide the model's 8 routed experts"),
    (lambda: planner.Layout(dp=2, tp=2, etp=4), "etp=4: expert tensor parallelism is 1 (each expert whole) or tp=2"),
    (lambda: planner.Layout(dp=4, shard=3, zero_stage=3), "shard=3: HSDP shards a ZeRO stage (zero_stage=3) over "
                                                          "groups of shard dp ranks, so shard must divide dp=4"),
    (lambda: planner.Layout(dp=4, shard=2), "shard=2: HSDP shards a ZeRO stage (zero_stage=0)"),
    (lambda: planner.Layout(cp=2, cp_kind="ulysses"), "cp_kind='ulysses'; choose one of 'ring', 'all_gather'"),
    (lambda: planner.Layout(ep=0), "ep"),
    (lambda: planner.predict(_dense(), planner.Layout(dp=2, ep=2), planner.Cluster(gpus_per_node=2)),
     "ep=2: this model has no experts to split (a dense config); use ep=1"),
    (lambda: planner.predict(_dense(precision="fp8"), planner.Layout(), planner.Cluster(gpus_per_node=1)),
     "precision='fp8' on the A100 SXM4 80 GB: it has no FP8 tensor cores"),
    (lambda: _dense(precision="fp8", fp8_recipe="perchannel"), "fp8_recipe='perchannel'; choose one of 'tensorwise'"),
    (lambda: _moe(capacity_factor=0.5), "capacity_factor=0.5: at least 1"),
    (lambda: _dense(capacity_factor=1.25), "capacity_factor=1.25: at least 1, and only for a mixture of experts "
                                          "(this config has none)"),
    (lambda: planner.predict(_dense(seq_len=6), planner.Layout(cp=2), planner.Cluster(gpus_per_node=2)),
     "cp=2: seq_len=6 must split into 2 × cp chunks"),
    (lambda: planner.cluster_of("h100", domain=0), "domain"),
    (lambda: planner.cluster_of("h100", expert_seconds=-1e-3), "expert_seconds=-0.001: a local expert's fixed cost"),
    (lambda: _moe(recompute="op"), "recompute='op' counts a dense Llama-style layer"),
    (lambda: _dense(offload_layers=LAYERS), f"offload_layers={LAYERS}: the layers whose activations go to host memory"),
    (lambda: _dense(offload_layers=-1), "offload_layers=-1"),
])
def test_bad_input_to_the_new_axes_is_named(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


# -- candidates searches the new axes -----------------------------------------------------------------------------

def test_candidates_try_expert_parallelism_with_and_without_expert_tp():
    layouts = [p.layout for p in planner.candidates(_moe(), planner.Cluster(gpus_per_node=8), zero_stages=(1,))]
    assert {lay.ep for lay in layouts} == {1, 2, 4, 8}
    assert all(lay.etp in (1, lay.tp) for lay in layouts)
    assert any(lay.etp == lay.tp > 1 and lay.ep > 1 for lay in layouts)


@pytest.mark.parametrize("seq_len, cps", [(64, {1, 2}), (6, {1})])
def test_candidates_try_cp_where_the_sequence_splits_into_2_cp_chunks(seq_len, cps):
    found = planner.candidates(_dense(seq_len=seq_len), planner.Cluster(gpus_per_node=4), zero_stages=(1,), cp=(1, 2))
    assert {p.layout.cp for p in found} == cps


def test_candidates_try_hsdp_with_one_nvlink_domain_per_shard_group():
    cluster = planner.Cluster(gpus_per_node=4, nodes=2)
    found = [p.layout for p in planner.candidates(_dense(global_batch=8), cluster, zero_stages=(3,), hsdp=True)]
    hsdp = [lay for lay in found if lay.shard]
    assert hsdp and all(lay.shard * lay.cp * lay.tp == cluster.domain for lay in hsdp)
    for lay in hsdp:  # the shard group inside a node, the replicas across
        assert cluster.span_link(lay.group("shard")) == cluster.intra
        assert cluster.span_link(lay.group("replicate")) != cluster.intra


def test_an_nvl72_rack_keeps_tp_and_ep_beyond_8_on_nvlink_and_8_gpu_nodes_do_not():
    wide = _mixtral(num_attention_heads=24, num_key_value_heads=24, hidden_size=384, intermediate_size=64,
                    num_hidden_layers=2, num_local_experts=48)
    w = planner.Workload(wide, global_batch=72, seq_len=64)
    rack = planner.cluster_of("gb200", nodes=18)  # 18 trays of 4: one 72-GPU domain
    found = [p.layout for p in planner.candidates(w, rack, zero_stages=(1,), ep=(24,))]
    assert any(lay.tp == 12 for lay in found) and any(lay.ep == 24 for lay in found)
    assert rack.link(planner.Layout(dp=6, tp=12).topology, "tp") == rack.intra  # 12 GPUs over 3 trays
    group = planner.Layout(dp=72, ep=24).group("ep")
    assert rack.all_to_all_seconds(group, 1e8) == pytest.approx(23 * 2e-6 + 23 / 24 * 1e8 / 740e9)
    nodes = planner.cluster_of("b200", nodes=2)  # 8-GPU nodes: an ep group of 16 crosses InfiniBand
    w16 = planner.Workload(wide, global_batch=16, seq_len=64)
    found = [p for p in planner.candidates(w16, nodes, zero_stages=(1,), ep=(16,)) if p.layout.ep == 16]
    assert found
    group = found[0].layout.group("ep")
    assert nodes.all_to_all_seconds(group, 1e8) == pytest.approx(15 * 5e-6 + 8 / 16 * 1e8 / 50e9)
