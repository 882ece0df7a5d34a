"""The course's one cost model (``parlab.decide.planner``): collectives on a ring, a data-parallel step, and a whole
layout's memory, bytes and step time, against hand-computed values; bad input named; and the chapters
taking their link figures from it rather than stating their own."""

from __future__ import annotations

import math
import pathlib
import re
from dataclasses import replace

import nbformat
import pytest

from parlab.decide import planner
from parlab.lab.measure import estimate_memory

ROOT = pathlib.Path(__file__).parent.parent
LINK = planner.Link("test", alpha=1e-5, bandwidth=1e9)


def test_ring_costs_are_chapter_02s_ring():
    costs = planner.ring_costs(LINK, 4)
    m = 8e6
    # all-gather / reduce-scatter: 3 steps, each 1/4 of the buffer over every link
    assert planner.collective_seconds("all_gather", m, costs) == pytest.approx(3 * 1e-5 + 0.75 * m / 1e9)
    assert planner.collective_seconds("reduce_scatter", m, costs) == planner.collective_seconds("all_gather", m, costs)
    # all-reduce: the two in turn
    assert planner.collective_seconds("all_reduce", m, costs) == pytest.approx(2 * (3 * 1e-5 + 0.75 * m / 1e9))
    assert planner.collective_seconds("send", m, costs) == pytest.approx(1e-5 + m / 1e9)
    one = planner.ring_costs(LINK, 1)  # a ring of one rank sends nothing
    assert planner.collective_seconds("all_reduce", m, one) == 0.0


def test_dp_step_matches_the_table_of_chapter_04():
    costs = planner.ring_costs(LINK, 4)
    g, f, b, o = 4e8, 0.1, 0.2, 0.04
    rs, ag, ar = (planner.collective_seconds(op, g, costs) for op in ("reduce_scatter", "all_gather", "all_reduce"))
    step = {s: planner.predict_dp_step(s, costs, g, 4, f, b, o, overlap=False) for s in planner.STRATEGIES}
    assert step["ddp"] == pytest.approx(f + b + ar + o)
    assert step["zero1"] == pytest.approx(f + b + rs + o / 4 + ag)
    assert step["zero2"] == pytest.approx(f + b + rs + o / 4 + ag)
    assert step["zero3"] == pytest.approx(f + ag + b + ag + rs + o / 4)
    hidden = planner.predict_dp_step("ddp", costs, g, 4, f, b, o, overlap=True)
    assert hidden == pytest.approx(f + max(b, ar) + o)


def test_micro_batches_cost_stage_2_and_3_per_pass_and_ddp_and_stage_1_once():
    costs = planner.ring_costs(LINK, 4)
    rs, ag = (planner.collective_seconds(op, 4e8, costs) for op in ("reduce_scatter", "all_gather"))

    def extra(strategy, m):  # communication added to the compute, without overlap
        return planner.predict_dp_step(strategy, costs, 4e8, 4, 0.0, 0.0, 0.0, overlap=False, micro_batches=m)

    for m in (1, 4, 8):
        assert extra("zero1", m) == pytest.approx(rs + ag)
        assert extra("zero2", m) == pytest.approx(m * rs + ag)
        assert extra("zero3", m) == pytest.approx(m * (2 * ag + rs))
        assert extra("ddp", m) == pytest.approx(extra("ddp", 1))


def _gpt2(layers):
    from transformers import GPT2Config

    return GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=128, n_positions=32, tie_word_embeddings=False)


def _workload(**kw):
    from parlab.lab.models import tiny_gpt2

    return planner.Workload(**{"model": tiny_gpt2(n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                                                  tie_word_embeddings=False).config,
                               "global_batch": 16, "seq_len": 32, "micro_batch": 2, **kw})


def test_a_layout_is_priced_part_by_part():
    w = _workload()
    cluster = planner.Cluster(gpus_per_node=4, nodes=2)
    p = planner.predict(w, planner.Layout(dp=2, tp=2, pp=2, zero_stage=1), cluster)
    m = 16 // (2 * 2)  # micro-batches per replica
    activation = 2 * 32 * 64 * 2  # micro-batch · seq · hidden · bf16
    assert p.micro_batches == m and p.bubble == pytest.approx(1 / (m + 1)) and p.stages == (2, 2)
    # the heaviest stage: the first, two layers and the embeddings (tokens, positions; the final norm counted
    # there too), a little more than the last's two layers and untied output layer
    heaviest = 2 * w.layer_params + w.root_params - w.output_params
    assert heaviest > 2 * w.layer_params + w.output_params
    assert max(planner.stage_params(w, 2)) == pytest.approx(heaviest)
    grads = heaviest / 2 * 2  # one TP rank's share, bf16
    # TP: four all-reduces of one activation per layer and micro-batch; PP: 1/t of one activation each way;
    # DP: Megatron reduce-scatters fp32 gradients (twice the bf16 bytes) and all-gathers bf16 weights
    assert p.bytes_by_axis == {"dp": pytest.approx(3 * grads), "tp": 4 * 2 * m * activation,
                               "pp": 2 * m * activation / 2}
    assert p.memory.model_states == estimate_memory(num_params=round(heaviest * 2), precision="bf16",
                                                    optimizer="adam", world_size=8, zero_stage=1, tp_size=2,
                                                    pp_size=2, fp32_grads=True).model_states
    # the course's ZeRO-1 hides nothing: its reduce-scatter and all-gather of this rank's gradients add
    costs = planner.ring_costs(cluster.intra, 2)
    course = planner.predict(w, planner.Layout(dp=2, tp=2, pp=2, zero_stage=1), cluster, implementation="course")
    assert course.parts["dp"] == pytest.approx(sum(planner.collective_seconds(op, grads, costs)
                                                   for op in ("reduce_scatter", "all_gather")))
    # Megatron's distributed optimizer hides both behind the first forward and the last backward
    assert p.parts["dp"] < course.parts["dp"] and p.step_s < course.step_s
    assert p.parts["tp"] == pytest.approx((m + 1) * 4 * 2 * planner.collective_seconds(
        "all_reduce", activation, planner.ring_costs(cluster.intra, 2)))
    assert str(p.layout) == "TP 2 × PP 2 × DP 2 + ZeRO-1"
    assert str(planner.Layout(pp=8, zero_stage=1)) == "PP 8"  # no ZeRO over one replica


def test_flops_are_narayanans_and_mfu_leaves_out_recomputation():
    from transformers import GPT2Config

    layers, h, V, s, B = 24, 2304, 51200, 2048, 8
    config = GPT2Config(n_layer=layers, n_embd=h, n_head=24, vocab_size=V, n_positions=s)
    w = planner.Workload(config, global_batch=B, seq_len=s, checkpointing=True, attention="eager")
    # eq. 3 counts 12h² weights per layer; GPT-2 adds biases and norms (13h), a few parts in 10⁴
    assert w.hardware_flops() == pytest.approx(planner.eq3_flops(B, s, layers, h, V), rel=2e-3)
    recompute = B * s * layers * w.layer_flops
    assert w.model_flops() == pytest.approx(w.hardware_flops() - recompute)
    p = planner.predict(w, planner.Layout(dp=8), planner.cluster_of("nvlink"))
    assert p.mfu == pytest.approx(p.hfu * w.model_flops() / w.hardware_flops())
    assert p.tflops(planner.A100.flops)["hardware"] == pytest.approx(p.hfu * 312)
    # a fused kernel's backward recomputes the scores: attention's backward 2.5 × its forward, not 2 ×
    fused = replace(w, attention="sdpa")
    assert fused.hardware_flops() - w.hardware_flops() == pytest.approx(B * s * layers * 0.5 * 4 * s * h)
    assert fused.model_flops() == w.model_flops()


def test_uneven_stages():
    w = planner.Workload("BLOOM 176B", global_batch=8, seq_len=2048)
    stages = planner.stage_layers(w, 12)
    assert sum(stages) == 70 and len(stages) == 12 and max(stages) - min(stages) <= 2
    # the last stage also runs BLOOM's 250,880-word output layer (1.4 layers of FLOPs): it takes fewer layers
    assert stages[-1] < max(stages)
    assert planner.stage_layers(w, 1) == (70,) and planner.stage_layers(w, 70) == (1,) * 70
    with pytest.raises(ValueError, match="pp=71 stages for 70 layers"):
        planner.stage_layers(w, 71)
    # the tied embedding: one copy on the first stage, one on the last (Megatron-LM's)
    params = planner.stage_params(w, 12)
    assert sum(params) == pytest.approx(w.num_params + w.output_params)


def test_links_between_nodes_add_up_over_a_nodes_adapters():
    cluster = planner.cluster_of("nvlink", nodes=4)
    whole = cluster.link(planner.Layout(dp=32).topology, "dp")  # 8 GPUs per node in the ring: 8 adapters
    assert whole.bandwidth == 8 * planner.LINKS["infiniband"].bandwidth
    two = cluster.link(planner.Layout(dp=8, tp=4).topology, "dp")  # TP 4 inside: 2 per node
    assert two.bandwidth == 2 * planner.LINKS["infiniband"].bandwidth
    assert cluster.link(planner.Layout(dp=4, tp=8).topology, "dp") == planner.LINKS["infiniband"]
    # never above the link inside a node
    fast = planner.Cluster(nodes=2, inter=planner.Link("fast", 1e-6, 100e9))
    assert fast.link(planner.Layout(dp=16).topology, "dp").bandwidth == planner.LINKS["nvlink"].bandwidth


def test_links_follow_the_mesh_and_slower_links_cost_time():
    w = _workload()
    cluster = planner.Cluster(gpus_per_node=4, nodes=2)
    topo = planner.Layout(dp=2, tp=2, pp=2).topology
    # tp innermost: its pairs stay in a node; pp outermost: its pairs cross nodes
    assert cluster.link(topo, "tp") == cluster.intra and cluster.link(topo, "pp") == cluster.inter
    assert cluster.link(topo, "dp") == cluster.intra
    fast = planner.predict(w, planner.Layout(dp=8), cluster)
    slow = planner.predict(w, planner.Layout(dp=8), planner.Cluster(gpus_per_node=4, nodes=2,
                                                                    inter=planner.LINKS["ethernet"]))
    assert slow.parts["dp"] > fast.parts["dp"]


def _llama_70b_without_gqa():
    """Llama 2 70B's shape with as many K/V heads as query heads, so that TP 16 can split its attention."""
    from parlab.decide.advice import preset

    config = preset("Llama 2 70B").to_dict()
    config["num_key_value_heads"] = config["num_attention_heads"]
    return type(preset("Llama 2 70B"))(**config)


def test_candidates_put_what_fits_first_then_the_fastest():
    w = planner.Workload(_llama_70b_without_gqa(), global_batch=64, seq_len=4096, checkpointing=True)
    ranked = planner.candidates(w, planner.cluster_of("nvlink", nodes=4))
    assert ranked and ranked[0].fits
    fitting = [p for p in ranked if p.fits]
    assert [p.step_s for p in fitting] == sorted(p.step_s for p in fitting)
    assert all(not p.fits for p in ranked[len(fitting):])
    assert {p.layout.tp for p in ranked} >= {1, 8, 16}  # TP across nodes is tried ...
    best_tp16 = next(p for p in fitting if p.layout.tp == 16)
    assert best_tp16.step_s > fitting[0].step_s  # ... and loses


@pytest.mark.parametrize("make, message", [
    (lambda: planner.predict(_workload(), planner.Layout(dp=3), planner.Cluster(gpus_per_node=4)),
     "uses 3 ranks; the cluster has 4"),
    (lambda: planner.predict(_workload(global_batch=6), planner.Layout(dp=4), planner.Cluster(gpus_per_node=4)),
     "global_batch=6 does not split into dp=4"),
    (lambda: planner.predict(_workload(), planner.Layout(dp=4, zero_stage=4), planner.Cluster(gpus_per_node=4)),
     "zero_stage=4"),
    (lambda: planner.predict_dp_step("zero4", {}, 1, 1, 0, 0, 0), "strategy='zero4'"),
    (lambda: planner.collective_seconds("all_to_all", 1, planner.ring_costs(LINK, 2)), "op='all_to_all'"),
    (lambda: planner.cluster_of("infiniband"), "name='infiniband'; choose one of 'nvlink', 'pcie', 'h100', 'h800', 'b200', 'gb200'"),
    # interleaving: every chunk of a pipeline rank needs a layer (24 layers on 4 stages: at most 6 chunks)
    (lambda: planner.predict(_workload(model=_gpt2(24)), planner.Layout(pp=4, vp=1000), planner.Cluster(gpus_per_node=4)),
     "vp=1000: each of a pipeline rank's chunks needs at least one layer; 24 layers on pp=4 stages give each 6"),
    (lambda: planner.predict(_workload(), planner.Layout(dp=4, vp=2), planner.Cluster(gpus_per_node=4)),
     "pp=1 has no pipeline to interleave"),
    (lambda: _workload(attention=None), "attention=None; choose one of 'sdpa', 'eager'"),
    (lambda: _workload(recompute="some"), "recompute='some'; choose one of 'none', 'selective', 'op', 'full'"),
    (lambda: _workload(checkpointing=True, recompute="selective"), "checkpointing=True means recompute='full'"),
    (lambda: planner.predict(_workload(), planner.Layout(dp=4), planner.Cluster(gpus_per_node=4), without=("io",)),
     "without=['io']: not cost terms"),
])
def test_bad_input_is_named(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_every_link_states_its_source():
    for link in planner.LINKS.values():
        assert link.source and link.bandwidth > 0 and link.alpha > 0, link


@pytest.mark.parametrize("chapter", ["04_zero", "05_tensor_parallel", "06_pipeline_parallel", "07_putting_it_together"])
def test_chapters_take_their_link_figures_from_the_planner(chapter):
    """One set of link figures in the course: a chapter's model cells name planner.LINKS, never a literal."""
    path = ROOT / "notebooks" / f"{chapter}.ipynb"
    if not path.exists():
        pytest.skip(f"{path.name} is not written yet")
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "planner.LINKS" in code
    for line in code.splitlines():
        assert not re.search(r"\d(\.\d+)?e9\b.*\d(\.\d+)?e-6\b|\d(\.\d+)?e-6\b.*\d(\.\d+)?e9\b", line), \
            f"{chapter}: a link figure stated in place: {line.strip()}"
        # a bandwidth beside a link's name (``pcie = 25e9``), other than a division for printing
        assert not re.search(r"(?i)(pcie|nvlink|infiniband|ethernet).*(?<![/.\w])(?<!/ )\d+(\.\d+)?e9\b", line), \
            f"{chapter}: a link's bandwidth stated in place: {line.strip()}"


def test_the_strategy_tools_labels_are_layouts():
    from parlab.course.bench.mixes import Mix, layout_on

    assert planner.layout_of("TP 8 × PP 2 × DP 2 + ZeRO-1") == planner.Layout(dp=2, tp=8, pp=2, zero_stage=1)
    assert planner.layout_of("DDP ×32") == planner.Layout(dp=32)
    assert planner.layout_of("ZeRO-3 ×8") == planner.Layout(dp=8, zero_stage=3)
    assert planner.layout_of("PP 8 × DP 1") == planner.Layout(pp=8)
    assert planner.layout_of("ZeRO ×8") is None  # the stage left open: measure
    with pytest.raises(ValueError, match="names no layout"):
        planner.layout_of("whatever fits")
    # on this machine's ranks: the same axes, model-parallel axes of 2, data parallel over the rest
    assert layout_on("TP 8 × PP 2 × DP 2 + ZeRO-1", 8) == Mix(dp=2, tp=2, pp=2, zero_stage=1)
    assert layout_on("TP 8 × PP 2 × DP 2 + ZeRO-1", 4) == Mix(tp=2, pp=2)  # no dp left: no ZeRO
    assert layout_on("PP 8 × DP 1", 8) == Mix(dp=4, pp=2)
    assert layout_on("ZeRO-3 ×256", 4) == Mix(dp=4, zero_stage=3)


def _ddp_rebuilt_buckets(caps_mb):
    # PyTorch's DDP on a small GPT-2; it rebuilds its buckets at the second forward (chapter 03)
    from torch.nn.parallel import DistributedDataParallel

    from parlab.lab.measure import ddp_buckets
    from parlab.lab.models import tiny_gpt2, token_batch

    out = {}
    for cap_mb in caps_mb:
        model = tiny_gpt2(n_layer=4, n_embd=128, n_head=2, vocab_size=256, n_positions=32)
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
        for step in range(2):
            x = token_batch(2, 32, 256, seed=step)
            ddp(input_ids=x, labels=x).loss.backward()
        out[cap_mb] = [nbytes for _, nbytes in ddp_buckets(ddp)]
    return out, model.config


def test_ddp_buckets_are_the_buckets_pytorchs_ddp_builds():
    import parlab

    assert planner.BUCKET_BYTES == 25 * 2**20  # the planner prices DDP's own cap: 25 MiB
    built, config = parlab.launch(_ddp_rebuilt_buckets, 2, args=((None, 0.5),), timeout=120, announce=False,
                                  output="none")[0]
    for cap_mb, got in built.items():
        want = planner.ddp_buckets(config, value_bytes=4, bucket_bytes=None if cap_mb is None else int(cap_mb * 2**20))
        assert want == got, (cap_mb, want, got)
        assert len(want) > 1  # more than one bucket: the assignment is tested, not one sum
    # GPT-2 XL in bf16 at DDP's default: every gradient once, in fewer buckets than bytes ÷ 25 MiB, since a
    # bucket closes only once it holds the cap or more
    buckets = planner.ddp_buckets("GPT-2 XL (1.5B)")
    psi = planner.Workload("GPT-2 XL (1.5B)", global_batch=1, seq_len=1).num_params
    assert sum(buckets) == 2 * psi and len(buckets) == 73 < math.ceil(2 * psi / 2**20 / 25)
    assert len(planner.ddp_buckets("GPT-2 XL (1.5B)", value_bytes=4)) == 145  # fp32 gradients: twice the bytes
    with pytest.raises(ValueError, match="value_bytes=3"):
        planner.ddp_buckets("GPT-2 XL (1.5B)", value_bytes=3)


def test_zero3s_root_is_on_the_critical_path():
    costs = planner.ring_costs(LINK, 4)
    g, r, f, b, o = 4e8, 4e7, 10.0, 20.0, 0.0  # compute long enough to hide every block's collective
    ag_r, rs_r = (planner.collective_seconds(op, r, costs) for op in ("all_gather", "reduce_scatter"))
    hidden = planner.predict_dp_step("zero3", costs, g, 4, f, b, o, blocks=2, overlap=True)
    assert hidden == pytest.approx(f + b)  # no root: all hidden
    fsdp2 = planner.predict_dp_step("zero3", costs, g, 4, f, b, o, blocks=2, overlap=True, root_bytes=r)
    assert fsdp2 == pytest.approx(f + b + ag_r + rs_r)  # the root gathered once, reduced once, both exposed
    ours = planner.predict_dp_step("zero3", costs, g, 4, f, b, o, blocks=2, overlap=True, root_bytes=r, root_gathers=2)
    assert ours == pytest.approx(f + b + 2 * ag_r + rs_r)
    # without overlap: every call priced once, the root's three calls besides the blocks' 2 × 3
    rs, ag = (planner.ring_costs(LINK, 4)[op] for op in ("reduce_scatter", "all_gather"))
    plain = planner.predict_dp_step("zero3", costs, g, 4, 0.0, 0.0, 0.0, blocks=2, overlap=False, root_bytes=r,
                                    root_gathers=2)
    assert plain == pytest.approx(6 * ag[0] + 3 * rs[0] + 2 * g * ag[1] + g * rs[1])
    for bad, message in (({"root_bytes": 2 * g}, "root_bytes="), ({"root_bytes": r, "root_gathers": 3}, "root_gathers=3")):
        with pytest.raises(ValueError, match=re.escape(message)):
            planner.predict_dp_step("zero3", costs, g, 4, f, b, o, **bad)


def test_a_fitted_collective_becomes_a_link_that_reproduces_it():
    for n in (2, 4, 8):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            link = planner.fitted_link(op, 3e-4, 2e-9, n)
            assert planner.ring_costs(link, n)[op] == pytest.approx((3e-4, 2e-9))
    # a ring of all-reduces: the per-message α is the call's intercept over its 2(n−1) steps
    assert planner.fitted_link("all_reduce", 6e-4, 1e-9, 4).alpha == pytest.approx(1e-4)
    assert planner.fitted_link("all_reduce", 1e-4, 0.0, 2).bandwidth == float("inf")
    with pytest.raises(ValueError, match="world_size=1"):
        planner.fitted_link("all_reduce", 1e-4, 1e-9, 1)


def test_root_params_are_what_the_layers_leave():
    from parlab.decide.advice import preset
    from parlab.lab.measure import count_params

    config = preset("Llama 2 7B")  # embedding and untied output layer, 32000 × 4096 each, and the final norm
    assert planner.root_params(config) == 2 * 32000 * 4096 + 4096
    assert planner.root_params(config) < count_params(config)


def test_what_real_implementations_overlap():
    costs = planner.ring_costs(LINK, 4)
    g, f, b, o, m = 4e8, 2.0, 4.0, 0.04, 4  # each pass long enough to hide any one collective
    rs, ag = (planner.collective_seconds(op, g, costs) for op in ("reduce_scatter", "all_gather"))

    def step(strategy, implementation, **kw):
        return planner.predict_dp_step(strategy, costs, g, 4, f, b, o, micro_batches=m,
                                       implementation=implementation, **kw)

    # Megatron's distributed optimizer: the reduce-scatter under the last backward, the gather under the next
    # forward; DeepSpeed's overlap_comm: the reduce-scatter only; the course's ZeRO-1: neither
    assert step("zero1", "megatron") == pytest.approx(f + b + o / 4)
    assert step("zero1", "deepspeed") == pytest.approx(f + b + o / 4 + ag)
    assert step("zero1", "course") == pytest.approx(f + b + rs + o / 4 + ag)
    # ZeRO-2 reduce-scatters under every backward (Ψ each, not DDP's 2Ψ); its gather as stage 1's
    assert step("zero2", "megatron") == pytest.approx(f + b + o / 4)
    assert step("zero2", "course") == step("zero2", "deepspeed") == pytest.approx(f + b + o / 4 + ag)
    # a gather or reduction longer than the one pass it can hide behind shows
    short = planner.predict_dp_step("zero1", costs, g, 4, f, 0.1 * rs * m, o, micro_batches=m)
    assert short == pytest.approx(f + 0.1 * rs * m * (m - 1) / m + rs + o / 4)
    for bad, message in (({"implementation": "apex"}, "implementation='apex'"), ({"reshard": "never"}, "reshard='never'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            planner.predict_dp_step("zero1", costs, g, 4, f, b, o, **bad)


def test_zero3_gathers_as_often_as_it_reshards():
    costs = planner.ring_costs(LINK, 4)
    rs, ag = (planner.collective_seconds(op, 4e8, costs) for op in ("reduce_scatter", "all_gather"))

    def extra(reshard, m):  # communication added to the compute, without overlap
        return planner.predict_dp_step("zero3", costs, 4e8, 4, 0.0, 0.0, 0.0, overlap=False, micro_batches=m,
                                       reshard=reshard)

    for m in (1, 4):
        assert extra("after_forward", m) == pytest.approx(m * (2 * ag + rs))  # FSDP2's default
        assert extra("after_backward", m) == pytest.approx(m * (ag + rs))  # kept from forward to backward
        assert extra("after_step", m) == pytest.approx(ag + rs)  # torch.distributed.pipelining: once per step
    # with overlap, the pipelined FSDP2's reduce-scatter comes after the last backward: nothing hides it
    hidden = planner.predict_dp_step("zero3", costs, 4e8, 4, 10.0, 20.0, 0.0, micro_batches=4, reshard="after_step")
    assert hidden == pytest.approx(30.0 + rs)


def test_zero3_beside_a_pipeline_is_priced_as_pytorchs_pipeline_runs_it():
    """FSDP2 under ``torch.distributed.pipelining`` with ``reshard_after_forward=False`` gathers once and
    reduce-scatters once per step (chapter 07 §3 measures it on dp 4 × pp 2 whatever m; with FSDP2's default,
    True, it gathers m + 1 times), and keeps the weights and gradients whole meanwhile."""
    w = _workload()
    cluster = planner.Cluster(gpus_per_node=4, nodes=1)
    grads = max(planner.stage_params(w, 2)) * 2  # bf16, the heaviest stage's
    for pp_layout, m in ((planner.Layout(dp=2, pp=2, zero_stage=3), 16 // (2 * 2)),):
        p = planner.predict(w, pp_layout, cluster, implementation="course")  # FSDP2: bf16 gradients
        assert p.micro_batches == m and p.bytes_by_axis["dp"] == pytest.approx(2 * grads)
        one = planner.predict(w, planner.Layout(dp=2, pp=2, zero_stage=1), cluster, implementation="course")
        assert p.memory.model_states == one.memory.model_states  # stage 1's memory through the step
        per_pass = planner.predict(w, pp_layout, cluster, reshard="after_backward", implementation="course")
        assert per_pass.bytes_by_axis["dp"] == pytest.approx(2 * m * grads)
        assert per_pass.memory.model_states < p.memory.model_states


def test_published_runs_within_20_percent():
    """The planner prices five published large runs from their published inputs (layout, batch, model, DGX
    A100 nodes) within ±20 % of their published step time, with one calibrated utilisation."""
    import statistics

    errors = {}
    for run in planner.PUBLISHED_RUNS:
        p = run.predict()
        errors[run.name] = p.step_s / run.step_s - 1
        assert p.fits, run.name
    print("published runs, predicted ÷ published − 1: " + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items())
          + f"; median {statistics.median(errors.values()):+.1%}")
    assert all(abs(e) <= 0.20 for e in errors.values()), errors
    assert abs(statistics.median(errors.values())) < 0.05
    # the utilisation is the one that centres them (calibrated, not tuned per row)
    assert abs(planner.calibrated_utilization() - planner.UTILIZATION) < 0.02


def test_bloom_finds_blooms_layout_among_its_best_few():
    bloom = planner.PUBLISHED_RUNS[-1]
    fitting = [p for p in planner.candidates(bloom.workload(), planner.cluster_of("nvlink", bloom.nodes)) if p.fits]
    meshes = list(dict.fromkeys((p.layout.tp, p.layout.pp, p.layout.dp) for p in fitting))
    real = next(p for p in fitting if p.layout == bloom.layout)
    assert meshes.index((4, 12, 8)) < 5 and real.step_s < 1.05 * fitting[0].step_s
    assert all(p.layout.tp <= 8 for p in fitting[:10])  # TP across nodes tried, never among the best


def test_h100_nodes():
    cluster = planner.cluster_of("h100", nodes=4)
    assert cluster.gpu is planner.H100 and cluster.intra == planner.LINKS["nvlink4"]
    w = planner.Workload("Llama 2 70B", global_batch=64, seq_len=4096, checkpointing=True)
    a100 = planner.predict(w, planner.Layout(tp=8, pp=4, dp=1), planner.cluster_of("nvlink", nodes=4))
    h100 = planner.predict(w, planner.Layout(tp=8, pp=4, dp=1), cluster)
    assert h100.step_s < a100.step_s / 2  # 3.2 × the FLOP/s; the links 1.5-2 × faster


# -- the terms that hide and those that do not, and memory that says yes to runs that ran -------------------

def _tflops(run, **options):
    return run.predict(**options).hfu * planner.A100.flops / 1e12


def test_table_2_zero3_hides_at_four_sequences_per_gpu_and_not_at_one():
    """Narayanan et al. 2021, Table 2 (GPT-3 175B, global batch 1536), fitted on nothing: ZeRO-3 (DeepSpeed)
    144 TFLOP/s per GPU at 384 GPUs, 44 at 1536; 3-D (TP 8 × PP 12) 153 and 141. The planner's ordering must
    be theirs: at 1536 GPUs 3-D at least 2× ZeRO-3 per GPU (published 3.2×), at 384 within 1.5× (1.06×)."""
    z384, z1536, d384, d1536 = (_tflops(run) for run in planner.HELD_OUT_RUNS[:4])
    assert d1536 >= 2 * z1536 and max(d384, z384) <= 1.5 * min(d384, z384), (z384, z1536, d384, d1536)
    for run in planner.HELD_OUT_RUNS:
        assert run.predict().fits, run.name
    for run in planner.HELD_OUT_RUNS[:4]:
        assert abs(run.predict().step_s / run.step_s - 1) <= 0.20, run.name
    # the ring's latency floor, (n − 1)·α per call, is what exposes ZeRO-3 at 1536: without it, no ordering
    assert _tflops(planner.HELD_OUT_RUNS[3], without=("latency",)) < 2 * _tflops(planner.HELD_OUT_RUNS[1],
                                                                                without=("latency",))


def test_deepspeeds_zero3_gathers_again_for_the_recomputed_forward():
    """DeepSpeed's ZeRO-3 hooks gather a layer for its recomputed forward, free it, and gather it again for its
    backward: three gathers a step under full recomputation, not two. At 1536 GPUs each of a GPT-3 layer's 12
    tensors pays the ring's 7.7 ms floor: the extra gathers are what bring that row within its band."""
    costs = planner.ring_costs(LINK, 4)
    ag = planner.collective_seconds("all_gather", 4e8, costs)
    once, twice = (planner.zero3_step(costs, 4e8, 4, 0.0, 0.0, 0.0, overlap=False, backward_gathers=g) for g in (1, 2))
    assert twice - once == pytest.approx(ag)
    with pytest.raises(ValueError, match="backward_gathers=3"):
        planner.zero3_step(costs, 4e8, 4, 0.0, 0.0, 0.0, backward_gathers=3)
    # DeepSpeed keeps a layer from its recomputed forward to its backward when its reuse distance (its
    # parameters fetched twice, 2 × per layer) is within stage3_max_reuse_distance, 1e9: layers under 0.5 B
    assert planner.deepspeed_backward_gathers(0.49e9, "full") == 1 < planner.deepspeed_backward_gathers(0.51e9, "full")
    assert planner.deepspeed_backward_gathers(1.8e9, "full") == 2 and planner.deepspeed_backward_gathers(1.8e9, "none") == 1
    with pytest.raises(ValueError, match="layer_params=0"):
        planner.deepspeed_backward_gathers(0, "full")
    run = planner.HELD_OUT_RUNS[1]
    with pytest.MonkeyPatch.context() as mp:  # a larger reuse distance keeps GPT-3's layer: two gathers, faster
        mp.setattr(planner.step, "DEEPSPEED_MAX_REUSE_DISTANCE", 4e9)
        mp.setattr(planner.step, "DEEPSPEED_MAX_LIVE_PARAMS", 4e9)
        kept = run.predict().step_s
    assert kept < 0.95 * run.predict().step_s
    # the planner asks for it only of DeepSpeed under full recomputation
    run = planner.HELD_OUT_RUNS[1]
    fsdp = run.predict(implementation="course")
    assert fsdp.step_s < run.predict().step_s
    ds = run.predict()
    assert ds.bytes_by_axis["dp"] > 0 and abs(ds.step_s / run.step_s - 1) <= 0.20


def test_h100_runs_fit_one_constant_and_attention_sets_long_sequences():
    """MosaicML's MPT 7B on 8 H100s: the H100's one constant is fitted on its 4k and 8k rows; the 32k and 64k
    rows fitted nothing and land within ±20 %, once the fused attention kernel runs at FlashAttention-2's
    published H100 rate (335 TFLOP/s, not fitted) instead of the matrix products' (−19 %, −25 % before).
    Leaving attention's FLOPs out sends the 32k row 71 % fast: the term the short A100 rows barely see."""
    assert abs(planner.calibrated_utilization(planner.H100_CALIBRATION_RUNS) - planner.H100_UTILIZATION) < 0.02
    assert planner.cluster_of("h100").utilization == planner.Cluster(gpu=planner.H100).utilization == planner.H100_UTILIZATION
    assert planner.Cluster().utilization == planner.UTILIZATION  # the A100's
    assert planner.H100.attention_flops["sdpa"] == 335e12 and "FlashAttention-2" in planner.H100.attention_source
    errors = {run.name: run.predict().step_s / run.step_s - 1
              for run in planner.H100_CALIBRATION_RUNS + planner.H100_HELD_OUT_RUNS[:2]}  # MPT 7B, 4k to 64k
    assert all(abs(e) <= 0.20 for e in errors.values()), errors
    # the errors no longer fall with the sequence: the kernel's rate, not the GEMMs', sets the long rows
    assert max(errors.values()) - min(errors.values()) < 0.10, errors
    at_gemm_rate = {run.name: run.predict(without=("attention_kernel",)).step_s / run.step_s - 1
                    for run in planner.H100_HELD_OUT_RUNS[:2]}
    assert all(e < -0.25 for e in at_gemm_rate.values()), at_gemm_rate
    long = planner.H100_HELD_OUT_RUNS[0]
    assert long.predict(without=("attention",)).step_s < 0.5 * long.step_s
    with pytest.raises(ValueError, match="mix GPU generations"):
        planner.calibrated_utilization(planner.CALIBRATION_RUNS + planner.H100_CALIBRATION_RUNS)


def test_the_attention_kernels_rate_applies_to_fused_attention_only():
    """Eager attention's QKᵀ and weighted sum are matrix products at the GEMM rate; a fused kernel (sdpa) runs
    at the GPU's published kernel rate where it has one (H100), and at the GEMM rate where it has none."""
    run = planner.H100_HELD_OUT_RUNS[1]
    eager = replace(run, attention="eager")
    assert eager.predict().step_s == eager.predict(without=("attention_kernel",)).step_s
    assert run.predict().step_s > 1.3 * run.predict(without=("attention_kernel",)).step_s
    a100 = run.predict(cluster=planner.cluster_of("nvlink"))
    assert planner.A100.attention_flops is None
    assert a100.step_s == run.predict(cluster=planner.cluster_of("nvlink"), without=("attention_kernel",)).step_s


def _band_left(term):
    """The calibration and held-out rows whose error leaves ±20 % once ``term`` is left out."""
    rows = planner.CALIBRATION_RUNS + planner.HELD_OUT_RUNS + planner.H100_CALIBRATION_RUNS + planner.H100_HELD_OUT_RUNS
    return [run.name for run in rows if abs(run.predict().step_s / run.step_s - 1) <= 0.20
            and abs(run.predict(without=(term,)).step_s / run.step_s - 1) > 0.20]


@pytest.mark.parametrize("term, rows", [
    ("recompute", {"GPT 1.7B", "BLOOM 176B", "MPT 7B, 4k tokens"}),  # 24-29 % fast without it
    ("memory_bound", {"GPT 1.7B"}),  # 24 % fast: its 2304-wide layers are the most memory-bound
    ("dp", {"ZeRO-3, 1536 GPUs"}),  # its gathers, exposed
    ("latency", {"ZeRO-3, 1536 GPUs"}),  # 12 gathers a layer, each paying the 1,536-rank ring's floor
    ("attention", {"MPT 7B, 8k tokens", "MPT 7B, 32k tokens"}),  # 39 % and 71 % fast without it
    ("attention_kernel", {"MPT 7B, 32k tokens", "MPT 7B, 64k tokens"}),  # 33 %, 38 % fast at the GEMMs' rate
])
def test_a_term_removed_sends_a_published_row_out_of_its_band(term, rows):
    assert rows <= set(_band_left(term))


def test_attention_flops_are_a_fifth_of_a_small_wide_sequence():
    """Attention's 4·s·h FLOPs per token: at s = 2048 and h = 2304 (GPT 1.7B) a quarter of 24·h², so
    leaving them out takes a tenth off that row's step (16 % fast against 7 %); and they set the selective
    recomputation's extra FLOPs."""
    run = planner.CALIBRATION_RUNS[0]
    assert run.predict(without=("attention",)).step_s < 0.91 * run.predict().step_s < run.step_s
    w = run.workload()
    assert w.attention_flops / w.layer_flops == pytest.approx(4 * 2048 * 2304 / (24 * 2304**2 + 4 * 2048 * 2304),
                                                              rel=0.01)


def _scenario(model, intra="nvlink", nodes=1, inter="infiniband", seq=2048, gpu_gb=80, per_gpu=2):
    cluster = planner.cluster_of(intra, nodes, inter=planner.LINKS[inter],
                                 gpu=planner.GPU("GPU", gpu_gb * 1e9, planner.A100.flops, planner.A100.memory_bandwidth))
    return planner.Workload(model, global_batch=per_gpu * cluster.world_size, seq_len=seq, checkpointing=True), cluster


def _first(workload, cluster, **options):
    return next(p for p in planner.candidates(workload, cluster, **options) if p.fits)


@pytest.mark.parametrize("term, scenario", [
    ("tp", dict(model="Llama 2 13B", intra="pcie")),  # TP 8 over PCIe wins once its all-reduces are free
    ("bubble", dict(model="GPT-2 XL (1.5B)", seq=1024)),  # a pipeline wins once its bubble is free
    ("dp_overlap", dict(model="Llama 2 13B")),  # ZeRO-2's reduce-scatters hide behind backward
    ("dp", dict(model="Llama 2 13B", intra="pcie")),  # a pipeline over PCIe: it sends least on dp
])
def test_a_term_removed_changes_a_chapter_07_verdict(term, scenario):
    """Chapter 07 §6's clusters: the fastest layout that fits changes when the term is left out."""
    workload, cluster = _scenario(**scenario)
    assert _first(workload, cluster).layout != _first(workload, cluster, without=(term,)).layout


def test_pipeline_messages_set_the_interleaving_depth():
    """Over Ethernet, each of v chunks sends its boundary: priced, four chunks are best for Llama 2 70B on TP 4
    × PP 4 × DP 2 (20 layers a stage; two within 0.3 %, ten 9 % slower); with the messages free, the deepest
    interleaving would always win."""
    workload, cluster = _scenario("Llama 2 70B", nodes=4, inter="ethernet", seq=4096, per_gpu=1)
    layout = planner.Layout(tp=4, pp=4, dp=2, zero_stage=1)

    def best(**options):
        steps = {v: planner.predict(workload, replace(layout, vp=v), cluster, **options).step_s for v in (1, 2, 4, 10, 20)}
        return min(steps, key=steps.get)

    assert best() == 4 and best(without=("pp",)) == 20
    ranked = planner.candidates(workload, cluster, vp=(1, 2, 4))
    assert any(p.chunks > 1 for p in ranked) and all(p.chunks <= min(p.stages) for p in ranked)


def test_recomputation_choices_trade_memory_for_flops():
    """Korthikanti et al. 2022: selective recomputation keeps no s × s scores and reruns only the attention
    core; full keeps each layer's input and reruns the layer. Memory: full < selective ≤ none (eager)."""
    kw = dict(model="GPT-2 XL (1.5B)", global_batch=8, seq_len=1024, attention="eager")
    none, selective, full = (planner.Workload(**kw, recompute=r) for r in ("none", "selective", "full"))
    layout, cluster = planner.Layout(dp=8), planner.cluster_of("nvlink")
    memory = [planner.predict(w, layout, cluster).memory.activations for w in (none, selective, full)]
    assert memory[2] < memory[1] < memory[0]
    flops = [w.hardware_flops() - w.model_flops() for w in (none, selective, full)]
    assert flops[0] == 0 < flops[1] < flops[2]
    assert flops[1] == pytest.approx(8 * 1024 * none.layers * 4 * 1024 * none.hidden)
    sp = planner.Workload("Llama 2 13B", 8, 4096, sequence_parallel=True, recompute="selective")
    no_sp = replace(sp, sequence_parallel=False)
    tp8 = planner.Layout(tp=8)
    assert (planner.predict(sp, tp8, cluster).memory.activations
            < 0.5 * planner.predict(no_sp, tp8, cluster).memory.activations)


def test_selective_recomputation_costs_what_its_flops_are_and_the_papers_27_percent_is_eq_8():
    """Korthikanti et al. 2022, §5: selective recomputation adds "only 2.7% and 1.6% FLOPs overhead" for GPT-3
    and MT-NLG: their eq. 8 ÷ eq. 7 − 1 (hardware ÷ model FLOPs), which counts the recomputed attention core
    three times over. The planner reruns it once (4·s·h per token and layer, their Appendix A's words): a
    third of the paper's overhead, 0.9 % for GPT-3."""
    def eq8_over_eq7(layers, h, s=2048, v=51200):
        return (1 + s / (3 * h) + v / (12 * h * layers)) / (1 + s / (6 * h) + v / (12 * h * layers)) - 1

    assert round(eq8_over_eq7(96, 12288), 3) == 0.027 and round(eq8_over_eq7(105, 20480), 3) == 0.016
    for run, paper in ((planner.HELD_OUT_RUNS[2], eq8_over_eq7(96, 12288)),
                       (planner.HELD_OUT_RUNS[5], eq8_over_eq7(105, 20480))):
        w = replace(run, recompute="selective").workload()
        overhead = w.hardware_flops() / w.model_flops() - 1 - w.layers * w.fused_backward_flops * w.global_batch \
            * w.seq_len / w.model_flops()
        assert overhead == pytest.approx(paper / 3, rel=0.02), (run.name, overhead, paper)
    gpt3 = replace(planner.HELD_OUT_RUNS[2], recompute="selective").workload()
    assert round(gpt3.hardware_flops() / gpt3.model_flops() - 1, 3) == 0.009


def test_megatron_keeps_fp32_gradients_and_zero3_its_working_set():
    """Megatron-LM in bf16 keeps fp32 main gradients (18 bytes per parameter with Adam); ZeRO-3 holds one
    gathered layer and its unsharded gradient, two with prefetch, and FSDP2 its root through the step."""
    w = planner.Workload("Llama 2 13B", global_batch=8, seq_len=1024)
    cluster = planner.cluster_of("nvlink")
    ddp = {impl: planner.predict(w, planner.Layout(dp=8), cluster, implementation=impl).memory
           for impl in ("megatron", "course")}
    assert ddp["megatron"].model_states - ddp["course"].model_states == pytest.approx(2 * w.num_params, rel=1e-6)
    # fp16: Megatron-LM keeps fp16 gradients (accumulate_allreduce_grads_in_fp32 is forced for bf16 only), in
    # memory and on the wire: Narayanan et al. 2021's --fp16 runs reduce half the bytes of a bf16 run
    fp16 = replace(w, precision="fp16")
    assert (planner.predict(fp16, planner.Layout(dp=8), cluster).memory.model_states
            == ddp["course"].model_states)
    wire = {x.precision: planner.predict(x, planner.Layout(dp=8), cluster).bytes_by_axis["dp"] for x in (w, fp16)}
    assert wire["bf16"] == pytest.approx(2 * wire["fp16"]) == pytest.approx(4 * w.num_params)
    assert all(run.precision == "fp16" for run in planner.CALIBRATION_RUNS[:4] + planner.HELD_OUT_RUNS[:4])
    with pytest.raises(ValueError, match="precision='fp8' on the A100 SXM4 80 GB: it has no FP8 tensor cores"):
        planner.predict(replace(w, precision="fp8"), planner.Layout(dp=8), cluster)
    z3 = planner.predict(w, planner.Layout(dp=8, zero_stage=3), cluster, implementation="deepspeed").memory
    sharded = estimate_memory(num_params=w.num_params, precision="bf16", world_size=8, zero_stage=3)
    gathered = z3.buckets  # DeepSpeed: Llama 13B's MLP tensors (70 M values) exceed its prefetch buffer: one layer
    assert z3.model_states == sharded.model_states
    assert gathered == pytest.approx(w.layer_params * (2 + 2), rel=1e-6)
    fsdp = planner.predict(w, planner.Layout(dp=8, zero_stage=3), cluster, implementation="course").memory
    assert fsdp.buckets == pytest.approx(2 * w.layer_params * 4 + w.root_params * 2, rel=1e-6)


def test_every_published_run_fits_on_its_hardware():
    for run in (planner.CALIBRATION_RUNS + planner.HELD_OUT_RUNS + planner.OUT_OF_SAMPLE_RUNS + planner.H100_CALIBRATION_RUNS
                + planner.H100_HELD_OUT_RUNS + planner.H100_OUT_OF_SAMPLE_RUNS):
        p = run.predict()
        assert p.fits, f"{run.name}: {p.memory.total / 1e9:.1f} GB on {run.cluster().gpu.memory / 1e9:.0f} GB"


def test_the_trivial_baseline_is_shown_for_what_it_is():
    """A constant utilisation fitted on the calibration rows (no bubble, no communication) scores them as well
    as the planner, but cannot order Table 2: it prices ZeRO-3 and 3-D alike at 1536 GPUs."""
    u = planner.baseline_utilization()
    calib = [planner.baseline_step(run, u) / run.step_s - 1 for run in planner.CALIBRATION_RUNS]
    assert max(map(abs, calib)) <= 0.20
    z1536, d1536 = planner.HELD_OUT_RUNS[1], planner.HELD_OUT_RUNS[3]
    ratio = (planner.baseline_step(z1536, u) / z1536.step_s) / (planner.baseline_step(d1536, u) / d1536.step_s)
    assert ratio < 0.4  # the baseline makes ZeRO-3 at 1536 GPUs 3 × too fast, relative to 3-D


def test_tp_overlap_is_an_option_off_by_default():
    """Megatron-LM's --tp-comm-overlap and torchtitan's async TP run TP's collectives beside the matrix
    products; 2021 Megatron (the default here) did not: exposed TP time shrinks, and never below zero. The
    overlap needs SP, as Megatron-LM's arguments.py says: without it predict refuses, and candidates prices
    its TP layouts with SP."""
    w = planner.Workload("Llama 2 13B", global_batch=8, seq_len=4096, checkpointing=True, sequence_parallel=True)
    pcie, tp8 = planner.cluster_of("pcie"), planner.Layout(tp=8)
    plain, overlapped = planner.predict(w, tp8, pcie), planner.predict(w, tp8, pcie, tp_overlap=True)
    assert plain.parts["tp"] > overlapped.parts["tp"] >= 0 and overlapped.step_s < plain.step_s
    nvlink = {name: planner.predict(w, tp8, planner.cluster_of("nvlink"), tp_overlap=o).parts["tp"]
              for name, o in (("none", False), ("fitted", True), ("all", 1.0))}
    assert nvlink["all"] == 0.0  # over NVLink the layers' computation covers every all-reduce: all of it can hide
    assert nvlink["fitted"] == pytest.approx((1 - planner.TP_OVERLAP_HIDDEN["megatron"]) * nvlink["none"])
    no_sp = replace(w, sequence_parallel=False)
    with pytest.raises(ValueError, match="tp_overlap=True with tp=8 needs sequence parallelism"):
        planner.predict(no_sp, tp8, pcie, tp_overlap=True)
    assert planner.predict(no_sp, planner.Layout(dp=8), pcie, tp_overlap=True).step_s > 0  # no TP: nothing to need
    ranked = {p.layout: p for p in planner.candidates(no_sp, pcie, tp_overlap=True)}
    assert ranked[tp8].step_s == pytest.approx(overlapped.step_s) and ranked[tp8].memory == overlapped.memory


def test_korthikanti_530b_fits_only_with_sequence_parallelism_and_selective_recomputation():
    """Korthikanti et al. 2022 (held out): the 530B GPT on 2240 A100s, TP 8 × PP 35, ran at 42.1 % MFU with
    full recomputation and 54.2 % with SP + selective recomputation (29 % faster). The planner: both within
    ±20 %, the ratio within 5 %; and the faster recipe fits on 80 GB only with both of its parts."""
    full, selective = planner.HELD_OUT_RUNS[4:6]
    p_full, p_sel = full.predict(), selective.predict()
    for run, p in ((full, p_full), (selective, p_sel)):
        assert abs(p.step_s / run.step_s - 1) <= 0.20 and p.fits, run.name
    assert p_sel.mfu / p_full.mfu == pytest.approx(54.2 / 42.1, rel=0.05)
    assert not replace(selective, sequence_parallel=False).predict().fits  # 107 GB: SP earns the fit
    assert not replace(selective, recompute="none").predict().fits  # 104 GB: so does selective recomputation


def test_table_2_rows_that_chose_nothing_are_within_the_band():
    """Narayanan et al. 2021, Table 2 at 768 GPUs (ZeRO-3 at micro-batch 2, 88 TFLOP/s per GPU; 3-D, 149),
    added after the planner's mechanisms and constants were fixed: out of sample, unlike the 1536-GPU ZeRO-3
    row, whose first miss made the planner count DeepSpeed's third gather. Each fits, within ±20 %, and the
    planner orders them as published (3-D faster per GPU); the trivial model prices them alike."""
    zero3, three_d = planner.OUT_OF_SAMPLE_RUNS
    for run in (zero3, three_d):
        p = run.predict()
        assert p.fits and abs(p.step_s / run.step_s - 1) <= 0.20, (run.name, p.step_s / run.step_s - 1)
    assert _tflops(three_d) > 1.3 * _tflops(zero3)  # published 149 / 88 = 1.69
    u = planner.baseline_utilization()
    trivial = [planner.baseline_step(run, u) / run.step_s for run in (zero3, three_d)]
    assert trivial[0] / trivial[1] < 0.75  # the trivial model's ZeRO-3 row is far too fast beside its 3-D row


def _errors(runs, **options):
    return {run.name: run.predict(**options).step_s / run.step_s - 1 for run in runs}


def test_mpt_30b_and_70b_chose_fsdp1s_exposed_collectives():
    """llm-foundry's H100 BF16 table, MPT 30B and 70B (FSDP FULL_SHARD, checkpointing): added out of sample
    with FSDP's per-micro-batch gathers and reduce-scatters priced hidden, they came out 4-27 % fast, the
    rows of many small micro-batches worst. Their misses chose implementation "fsdp1", the collectives
    exposed; held out from the constant since. Priced hidden again (FSDP2's ``"course"``), the 70B over 32
    GPUs leaves the band; exposed, every row but the 30B at 8k tokens (75 of 80 GB, -20 %, unexplained; -19 %
    before MPT's eager elementwise ops were counted and the H100's share refitted, 0.66 → 0.68) is within 6 %. (NVLink 4 at its line rate, 450 GB/s, rather than what NCCL reaches, the 8k row was -21 %;
    NVLink was re-priced after this row was seen, so it is not out of sample for that: a miss, unexplained.)"""
    runs = {run.name: run for run in planner.H100_HELD_OUT_RUNS[2:]}
    assert len(runs) == 8 and all(run.nodes_kind == "h100" and run.implementation == "fsdp1" for run in runs.values())
    seventy = runs["MPT 70B, 32 GPUs"]  # 882 tokens/s per GPU, 2 × 16 sequences of 2048 per GPU
    assert seventy.layout.dp == 32 and seventy.global_batch == 1024 and seventy.shape == (80, 8192, 64, 50368)
    assert seventy.step_s == pytest.approx(1024 * 2048 / (32 * 882))
    exposed, hidden = _errors(runs.values()), _errors(runs.values(), implementation="course")
    assert all(r.predict().fits for r in runs.values())
    assert all(abs(e) < 0.06 for n, e in exposed.items() if n != "MPT 30B, 8k tokens"), exposed
    assert -0.21 < exposed["MPT 30B, 8k tokens"] < -0.19  # the one row far off, unexplained
    assert hidden["MPT 70B, 32 GPUs"] < -0.20 and all(hidden[n] < exposed[n] - 0.03 for n in exposed), hidden
    # the exposed time is FSDP's collectives, on the step's critical path: the dp part of the step
    p = seventy.predict()
    assert p.parts["dp"] > 0.2 * p.step_s and seventy.predict(implementation="course").parts["dp"] < 0.01 * p.step_s


def test_mpt_13b_and_3b_out_of_sample_for_time_land_within_the_band():
    """The same table's MPT 13B and 3B rows, added after "fsdp1" was chosen: out of sample for time (their
    memory miss chose MPT's exact GELU, which moved the constant: docs/planner.md). All 18 land within ±20 %
    (the worst 16 % fast) and fit on 80 GB; the trivial model misses by up to 26 %. The 13B at 2k tokens, one step of two sequences per GPU without checkpointing, is where
    the exposed collectives matter: priced hidden, those four rows are 30 % fast."""
    runs = planner.H100_OUT_OF_SAMPLE_RUNS
    assert len(runs) == 18 and all(run.implementation == "fsdp1" for run in runs)
    error = _errors(runs)
    assert all(abs(e) <= 0.20 for e in error.values()) and all(run.predict().fits for run in runs), error
    u = planner.baseline_utilization(planner.H100_CALIBRATION_RUNS)
    trivial = {run.name: planner.baseline_step(run, u) / run.step_s - 1 for run in runs}
    assert max(map(abs, trivial.values())) > 0.25 > max(map(abs, error.values()))
    two_k = [run for run in runs if run.name.startswith("MPT 13B, 2k")]
    assert len(two_k) == 4 and all(run.global_batch == 2 * run.layout.dp and run.recompute == "none" for run in two_k)
    hidden = _errors(two_k, implementation="course")
    assert all(e < -0.28 for e in hidden.values()) and all(abs(error[n]) < 0.14 for n in hidden), hidden


def test_fsdp1_prices_full_shard_only_and_its_ablation_is_fsdp2():
    """"fsdp1" is FULL_SHARD without a pipeline (or plain DDP): ZeRO-1/2 and pipelines are refused with the
    reason; with nothing to gather (one rank) it prices as FSDP2; its gathers add to, not hide behind, compute."""
    w = planner.Workload("Llama 2 13B", global_batch=16, seq_len=2048, checkpointing=True)
    cluster = planner.cluster_of("h100")
    for layout in (planner.Layout(dp=8, zero_stage=1), planner.Layout(dp=8, zero_stage=2),
                   planner.Layout(dp=4, pp=2, zero_stage=3)):
        with pytest.raises(ValueError, match="'fsdp1' prices PyTorch FSDP1"):
            planner.predict(w, layout, cluster, implementation="fsdp1")
    assert not any(p.layout.zero_stage in (1, 2) or p.layout.pp > 1 and p.layout.dp > 1
                   for p in planner.candidates(w, cluster, implementation="fsdp1"))
    costs = planner.ring_costs(planner.LINKS["nvlink4"], 8)
    for strategy in ("zero1", "zero2"):
        with pytest.raises(ValueError, match=f"strategy='{strategy}' under implementation 'fsdp1'"):
            planner.predict_dp_step(strategy, costs, 1e9, 8, 1.0, 2.0, 0.1, implementation="fsdp1")
    z3 = planner.Layout(dp=8, zero_stage=3)
    f1, f2 = (planner.predict(w, z3, cluster, implementation=i) for i in ("fsdp1", "course"))
    assert f1.memory.total == f2.memory.total and f1.bytes_by_axis == f2.bytes_by_axis
    assert f1.step_s > f2.step_s and f1.parts["compute"] == f2.parts["compute"]
    assert f1.step_s == pytest.approx(planner.predict(w, z3, cluster, implementation="course",
                                                      without=("dp_overlap",)).step_s)


def test_zero2_beside_a_pipeline_is_refused_and_never_offered():
    """No implementation runs ZeRO-2 beside a pipeline (DeepSpeed's PipelineEngine asserts zero stage < 2;
    Megatron-LM's distributed optimizer and FSDP2 under pipelining keep whole gradients), nor DeepSpeed's
    ZeRO-3: predict refuses them with the reason, candidates leaves them out; without a pipeline they stay."""
    w = planner.Workload("Llama 2 70B", global_batch=64, seq_len=2048, checkpointing=True)
    cluster = planner.cluster_of("nvlink", 4)
    with pytest.raises(ValueError, match="ZeRO-2 beside a pipeline.*PipelineEngine"):
        planner.predict(w, planner.Layout(pp=4, dp=8, zero_stage=2), cluster)
    with pytest.raises(ValueError, match="DeepSpeed's PipelineEngine asserts zero stage < 2"):
        planner.predict(w, planner.Layout(pp=4, dp=8, zero_stage=3), cluster, implementation="deepspeed")
    fsdp = planner.predict(w, planner.Layout(pp=4, dp=8, zero_stage=3), cluster)  # FSDP2 under pipelining
    one = planner.predict(w, planner.Layout(pp=4, dp=8, zero_stage=1), cluster)
    assert fsdp.memory.model_states == one.memory.model_states  # whole gradients: ZeRO-1's memory
    for impl in ("megatron", "deepspeed"):
        offered = {p.layout for p in planner.candidates(w, cluster, implementation=impl)}
        assert not any(l.pp > 1 and l.dp > 1 and l.zero_stage == 2 for l in offered)
        assert any(l.pp == 1 and l.zero_stage == 2 for l in offered)
        assert any(l.pp > 1 and l.zero_stage == 3 for l in offered) == (impl == "megatron")


def test_deepspeed_bf16_optimizer_keeps_fp32_gradients_as_bloom_ran():
    """BLOOM's tr11 ran Megatron-DeepSpeed's BF16_Optimizer (bf16, ZeRO-1): gradients accumulate in fp32 and
    are all-reduced so, as Megatron-LM's bf16 does; DeepSpeed's ZeRO-2/3 and any fp16 run keep 16-bit ones.
    §5's BLOOM row and §6's BLOOM scenario so hold the same 18 bytes per parameter."""
    w = planner.Workload("Llama 2 13B", global_batch=8, seq_len=1024)
    assert [w.grad_bytes("deepspeed", z) for z in (0, 1, 2, 3)] == [4, 4, 2, 2]
    assert [w.grad_bytes(impl, 1) for impl in planner.IMPLEMENTATIONS] == [4, 4, 2, 2]
    assert replace(w, precision="fp16").grad_bytes("deepspeed", 1) == 2
    bloom = planner.CALIBRATION_RUNS[4]
    p, layout = bloom.predict(), bloom.layout
    assert bloom.implementation == "deepspeed" and layout.zero_stage == 1 and p.fits
    assert p.bytes_by_axis["dp"] == pytest.approx(max(planner.stage_params(bloom.workload(), layout.pp)) / layout.tp
                                                  * (4 + 2))  # fp32 reduce-scatter, bf16 all-gather
    megatron = bloom.predict(implementation="megatron").memory.model_states
    assert p.memory.model_states == megatron and 45e9 < p.memory.total < 48e9


def test_sequence_parallelism_shrinks_the_memory_bound_time_as_it_does_the_activations():
    """The norms, dropout and residual adds SP splits over the tp ranks read and write 1/t of the bytes."""
    w = planner.Workload("Llama 2 13B", global_batch=8, seq_len=4096, checkpointing=True)
    sp = replace(w, sequence_parallel=True)
    assert sp.layer_bytes(8) < 0.6 * w.layer_bytes(8) and sp.layer_bytes(1) == w.layer_bytes(1)
    cluster, tp8 = planner.cluster_of("nvlink"), planner.Layout(tp=8)
    assert planner.predict(sp, tp8, cluster).parts["compute"] < planner.predict(w, tp8, cluster).parts["compute"]


def test_table_2_ordering_rests_on_two_unfitted_choices():
    """What docs/planner.md and chapter 07 (under the hood, E) say the ordering rests on: at α = 2 µs per ring
    step between nodes, or with every tensor prefetched, 3-D is no longer 2 × ZeRO-3 per GPU at 1536 GPUs."""
    import math
    from unittest import mock

    z, d = planner.HELD_OUT_RUNS[1], planner.HELD_OUT_RUNS[3]

    def ratio(**options):
        return z.predict(**options).step_s / d.predict(**options).step_s  # same FLOPs and GPUs: per-GPU ratio

    assert ratio() >= 2
    fast = replace(planner.LINKS["infiniband"], alpha=2e-6)
    assert z.predict(cluster=z.cluster(inter=fast)).step_s / d.predict(cluster=d.cluster(inter=fast)).step_s < 2
    with mock.patch.object(planner.step, "DEEPSPEED_PREFETCH_PARAMS", math.inf):  # 2.76 -> 2.00 (published 3.20)
        assert ratio() < 2.01
        zero3_768 = planner.OUT_OF_SAMPLE_RUNS[0]
        assert zero3_768.predict().step_s / zero3_768.step_s - 1 < -0.4  # and the 768-GPU row leaves its band


def test_the_optimizer_step_is_zero1s_lead_at_two_sequences_per_gpu():
    """The optimizer step (Adam's bytes at HBM speed, divided by N under ZeRO) is a cost term like the others:
    left out, GPT-2 XL on one NVLink node at two sequences per GPU no longer puts ZeRO-1 ahead of DDP."""
    w = planner.Workload("GPT-2 XL (1.5B)", global_batch=16, seq_len=1024, checkpointing=True)
    cluster = planner.cluster_of("nvlink")

    def ranked(**options):
        return [p for p in planner.candidates(w, cluster, **options) if p.fits]

    priced, free = ranked(), ranked(without=("optimizer",))
    assert "optimizer" in planner.TERMS and priced[0].layout == planner.Layout(dp=8, zero_stage=1)
    ddp = next(p for p in priced if p.layout == planner.Layout(dp=8))
    assert ddp.step_s > 1.1 * priced[0].step_s and ddp.parts["optimizer"] > 8 * priced[0].parts["optimizer"] * 0.99
    assert free[0].layout == planner.Layout(dp=8) and all(p.parts["optimizer"] == 0 for p in free)


def test_tp_overlap_hides_tp_inside_a_node_only():
    """Transformer Engine's comm+GEMM overlap (what Megatron-core's --tp-comm-overlap runs) is single-node:
    TP 16 across DGX H100 nodes stays exposed under tp_overlap, TP 8 inside one is hidden."""
    w = planner.Workload(_llama_70b_without_gqa(), global_batch=64, seq_len=4096, checkpointing=True,
                         sequence_parallel=True)
    h100 = planner.cluster_of("h100", 4)
    across, inside = planner.Layout(tp=16, dp=2, zero_stage=1), planner.Layout(tp=8, dp=4, zero_stage=1)
    assert planner.predict(w, across, h100, tp_overlap=True).parts["tp"] == planner.predict(w, across, h100).parts["tp"] > 0
    assert planner.predict(w, inside, h100, tp_overlap=True).parts["tp"] < planner.predict(w, inside, h100).parts["tp"]
