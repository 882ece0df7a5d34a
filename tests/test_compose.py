"""Strategies composed on a mesh through ``parlab.lab.compose.parallelize`` train exactly like one process.

The residual MLP stack: the course's own DDP (chapter 03) on the ``dp`` axis beside DTensor tensor
parallelism on the ``tp`` axis, every gradient byte counted on its dp group, and PyTorch's mixes.
A transformers decoder (GPT-2; Llama where no pipeline is needed): DP×TP, DP×PP and PP×TP on 4 ranks,
DP×PP×TP on 8, each with the course's strategies (ZeRO-1, Megatron TP, the pipeline executor) and with
PyTorch's (FSDP2, DTensor, pipelining), against one process; every collective filed under the axis whose
ranks it ran on; a planted bug (replicas sharding the batch by the wrong axis) that the same assertion catches.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import parlab
from parlab.lab.builtin import train_2d
from parlab.lab.compose import COURSE, PYTORCH, parallelize
from parlab.lab.parallel import Topology
from parlab.lab.training import make_model, train, train_single

STEPS = 3


@pytest.fixture(scope="module")
def reference():
    return train_single(STEPS)


def _course_ddp_times_tp():
    from parlab.lab.measure import CommLog
    from parlab.lab.parallel.ddp import _local

    topo = Topology.build(tp=2)  # dp = 2
    with CommLog() as log:
        parts = parallelize(make_model(), topo, data_parallel="course-ddp")
        losses = train(parts, STEPS)
    local_numel = sum(_local(p).numel() for p in parts.model.parameters())
    return {"losses": losses, "records": log.records, "local_numel": local_numel, "dp_rank": topo.coord("dp"),
            "rank": topo.rank}


def test_course_ddp_on_the_dp_axis_times_dtensor_tp(reference):
    results = parlab.launch(_course_ddp_times_tp, 4, announce=False)
    pytorch = parlab.launch(train_2d, 4, kwargs={"steps": STEPS}, announce=False)  # FSDP2 + DTensor TP
    psi = sum(p.numel() for p in make_model().parameters())
    for r in results:
        assert_close(torch.tensor(r["losses"]), torch.tensor(reference))
        assert_close(torch.tensor(r["losses"]), torch.tensor(pytorch[0]))
        assert r["local_numel"] < psi  # TP really split the weights
        grads = [rec for rec in r["records"] if rec.op == "all_reduce"]
        # every record was on this rank's dp group: 2 ranks, this rank's place in it, its global rank
        assert {(rec.group_size, rec.group_rank, rec.rank) for rec in r["records"]} == {(2, r["dp_rank"], r["rank"])}
        # each step all-reduces every local gradient once: 4 bytes per number this rank holds
        assert sum(rec.bytes for rec in grads) == STEPS * 4 * r["local_numel"]
    # the two tp ranks of a dp group hold different halves, the same total
    assert results[0]["local_numel"] == results[1]["local_numel"]


def _mix(sizes: dict, how: dict):
    return train(parallelize(make_model(), Topology.build(**sizes), **how), STEPS)


MIXES = {
    "dp2 x pp2, fsdp": ({"pp": 2}, {"data_parallel": "fsdp"}),
    "dp2 x pp2, ddp, 1f1b": ({"pp": 2}, {"data_parallel": "ddp", "schedule": "1f1b"}),
    "dp2 x pp2, course ddp": ({"pp": 2}, {"data_parallel": "course-ddp"}),
    "pp2 x tp2": ({"pp": 2, "tp": 2}, {}),
    "dp2 x tp2, checkpointing": ({"tp": 2}, {"data_parallel": "fsdp", "checkpointing": True}),
    "dp4, course ddp": ({}, {"data_parallel": "course-ddp"}),
}


@pytest.mark.parametrize("name", list(MIXES))
def test_mixes_on_four_ranks_equal_one_process(name, reference):
    sizes, how = MIXES[name]
    for losses in parlab.launch(_mix, 4, args=(sizes, how), announce=False, output="none"):
        assert_close(torch.tensor(losses), torch.tensor(reference))


def _bad(sizes, how):
    return parallelize(make_model(), Topology.build(**sizes), **how)


@pytest.mark.parametrize("sizes, how, message", [
    ({"tp": 2}, {"data_parallel": "ddp"}, "PyTorch's DDP does not take the DTensor parameters"),
    ({"pp": 4}, {"num_micro_batches": 0}, "num_micro_batches must be a positive int"),
    ({}, {"data_parallel": "zero4"}, "data_parallel='zero4'; choose one of 'fsdp'"),
    ({"pp": 2}, {"reshard_after_forward": "yes"}, "reshard_after_forward='yes'; choose True, False or None"),
])
def test_bad_combinations_say_what_is_allowed(sizes, how, message):
    with pytest.raises(parlab.RankError, match=message):
        parlab.launch(_bad, 4, args=(sizes, how), announce=False, output="none")


def _three_stages():
    return parallelize(make_model(), Topology.build(pp=3))


def test_a_pipeline_needs_equal_stages():
    with pytest.raises(parlab.RankError, match="pp=3 stages splits an nn.Sequential into equal runs"):
        parlab.launch(_three_stages, 3, announce=False, output="none")


# -- a transformers decoder under every mix, the course's strategies and PyTorch's -------------------------

SEQ, VOCAB, BATCH = 8, 64, 8  # BATCH: sequences per step, divisible by dp × micro-batches
OPT = {"optimizer": torch.optim.AdamW, "optimizer_kwargs": {"lr": 1e-2}}  # Adam: state for ZeRO-1 to shard
# what each axis may issue in a step: ZeRO's and FSDP's shards; TP's sums (and DTensor's gathered logits);
# the pipeline's messages (and the course's executor's barrier when it is built, at the first step)
AXIS_OPS = {"dp": {"reduce_scatter", "all_gather"}, "tp": {"all_reduce", "all_gather"},
            "pp": {"send", "recv", "barrier"}}


def gpt2():
    from parlab.lab.models import tiny_gpt2

    return tiny_gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ, tie_word_embeddings=False)


def llama():
    from parlab.lab.models import tiny_llama

    return tiny_llama(n_layer=2, hidden=32, heads=4, kv_heads=2, intermediate=64, vocab_size=VOCAB, n_positions=SEQ)


def token_batches(steps):
    from parlab.lab.models import token_batch

    return [(t, t) for t in (token_batch(BATCH, SEQ, VOCAB, seed=s) for s in range(steps))]


def _decoder_mix(make, sizes, how, steps, bug=False):
    """Train ``steps`` steps on this rank; returns the losses and {(axis, op, group size)} of every
    collective and message a step issued (comm_by_axis): which groups talked, and with what."""
    from parlab.lab.compose import comm_by_axis
    from parlab.lab.models import shard

    topo = Topology.build(**sizes)
    parts = parallelize(make(), topo, num_micro_batches=2, **OPT, **how)
    # the planted bug: each replica takes the batch slice of its *tp* coordinate, not of its dp one
    slice_of = topo.coord("tp" if bug else "dp")
    losses, seen = [], set()
    for batch in token_batches(steps):
        x, y = shard(batch, slice_of, topo.dp)
        parts.zero_grad()
        with comm_by_axis(topo) as axes:
            loss = parts.forward_backward(x, y)
            parts.step()
        losses.append(parts.global_loss(loss))
        seen |= {(axis, r.op, r.group_size) for axis, records in axes.items() for r in records}
    return losses, seen


MODELS = {"gpt2": gpt2, "llama": llama}
DECODER_MIXES = {  # name: (model, mesh sizes, how)
    "dp2 x tp2, course": ("gpt2", {"tp": 2}, COURSE),
    "dp2 x tp2, pytorch": ("gpt2", {"tp": 2}, PYTORCH),
    "dp2 x pp2, course": ("gpt2", {"pp": 2}, COURSE),
    "dp2 x pp2, pytorch": ("gpt2", {"pp": 2}, PYTORCH),
    "pp2 x tp2, course": ("gpt2", {"pp": 2, "tp": 2}, COURSE),
    "pp2 x tp2, pytorch": ("gpt2", {"pp": 2, "tp": 2}, PYTORCH),
    "llama dp2 x tp2, course": ("llama", {"tp": 2}, COURSE),
    "llama dp2 x tp2, pytorch": ("llama", {"tp": 2}, PYTORCH),
    # one axis PyTorch's, the others the course's
    "dp2 x tp2, fsdp + course tp": ("gpt2", {"tp": 2}, {**COURSE, "data_parallel": "fsdp"}),
    "dp2 x pp2, course zero1 + torch 1f1b": ("gpt2", {"pp": 2}, {**COURSE, "pipeline": "torch", "schedule": "1f1b"}),
    "dp2 x pp2, fsdp + course 1f1b": ("gpt2", {"pp": 2}, {**COURSE, "data_parallel": "fsdp", "schedule": "1f1b"}),
}
PLANTED = "dp2 x tp2, course"
STEPS_3D = 2


def _all_decoder_mixes(names, bug, steps):
    out = {name: _decoder_mix(MODELS[DECODER_MIXES[name][0]], *DECODER_MIXES[name][1:], steps) for name in names}
    out["bug"] = _decoder_mix(MODELS[DECODER_MIXES[bug][0]], *DECODER_MIXES[bug][1:], steps, bug=True)
    return out


@pytest.fixture(scope="module")
def decoder_references():
    from parlab.lab.training import train_reference

    return {name: train_reference(make(), token_batches(STEPS), **OPT) for name, make in MODELS.items()}


def _check_mix(name, sizes, result, reference):
    losses, seen = result
    assert_close(torch.tensor(losses), torch.tensor(reference), msg=lambda m: f"{name}: {m}")
    talked = {(axis, op) for axis, op, _ in seen}
    # every axis with more than one rank talked, each with its own kind of op, on groups of its size only
    for axis, size in Topology(**sizes).sizes.items():
        ops = {op for a, op in talked if a == axis}
        assert (size > 1) == bool(ops), f"{name}: axis {axis} of size {size} issued {ops or 'nothing'}"
        assert ops <= AXIS_OPS.get(axis, set()), f"{name}: axis {axis} issued {ops - AXIS_OPS[axis]}"
        assert {g for a, _, g in seen if a == axis} <= {size}, name
    assert not any(a == "world" for a, _ in talked), f"{name}: a collective ran on the whole world"


def test_decoder_mixes_on_four_ranks_equal_one_process(decoder_references):
    from parlab.lab.launch import preload

    preload("torch._dynamo", "torch.distributed.pipelining", "transformers.models.gpt2.modeling_gpt2")
    per_rank = parlab.launch(_all_decoder_mixes, 4, args=(list(DECODER_MIXES), PLANTED, STEPS), timeout=600,
                             announce=False, output="none")
    for name, (model, sizes, _) in DECODER_MIXES.items():
        for rank, results in enumerate(per_rank):
            _check_mix(f"{name}, rank {rank}", {"dp": 4 // math.prod(sizes.values()), **sizes}, results[name],
                       decoder_references[model])
    for results in per_rank:  # the planted bug: the same assertion fails
        with pytest.raises(AssertionError, match="Tensor-likes are not close"):
            assert_close(torch.tensor(results["bug"][0]), torch.tensor(decoder_references["gpt2"]))


def test_three_d_on_eight_ranks_equals_one_process(decoder_references):
    """DP × PP × TP = 2 × 2 × 2, the course's strategies and PyTorch's, 2 steps of the tiny GPT-2 (8 ranks
    on the 2-core test machine: 5 s)."""
    from parlab.lab.launch import preload

    preload("torch._dynamo", "torch.distributed.pipelining", "transformers.models.gpt2.modeling_gpt2")
    sizes = {"dp": 2, "pp": 2, "tp": 2}
    mixes = {"3d, course": COURSE, "3d, pytorch": PYTORCH}
    per_rank = parlab.launch(_three_d, 8, args=(sizes, mixes), timeout=600, announce=False, output="none")
    for name in mixes:
        for rank, results in enumerate(per_rank):
            _check_mix(f"{name}, rank {rank}", sizes, results[name], decoder_references["gpt2"][:STEPS_3D])


def _three_d(sizes, mixes):
    return {name: _decoder_mix(gpt2, sizes, how, STEPS_3D) for name, how in mixes.items()}


def _bad_decoder(sizes, how):
    return parallelize(llama() if how.pop("llama", False) else gpt2(), Topology.build(**sizes), **how)


@pytest.mark.parametrize("sizes, how, message", [
    ({"tp": 2}, {"data_parallel": "course-zero1"}, "ZeRO-1 lays parameters into one flat buffer"),
    ({"pp": 2}, {"llama": True}, "pipeline stages exist for GPT-2"),
    ({"tp": 2}, {"tensor_parallel": "megatron"}, "tensor_parallel='megatron'; choose one of 'dtensor', 'course'"),
    ({"pp": 2}, {"pipeline": "dualpipe"}, "pipeline='dualpipe'; choose one of 'torch', 'course'"),
])
def test_bad_decoder_layouts_say_what_is_allowed(sizes, how, message):
    with pytest.raises(parlab.RankError, match=message):
        parlab.launch(_bad_decoder, 4, args=(sizes, how), announce=False, output="none")


def test_step_parts_split_a_step_into_computing_moving_and_waiting():
    from parlab.course.bench.mixes import Mix, _union, step_parts
    from parlab.lab.measure.comm import CommRecord

    assert _union([(0, 2), (1, 3), (5, 6)]) == 4 and _union([]) == 0
    # two data-parallel ranks, one all-reduce: rank 1 joins 3 s after rank 0, both finish at 5; rank 1
    # also has a pipeline's message in flight from 6 to 7, which counts as computing
    mix = Mix(dp=2)
    ar = dict(op="all_reduce", bytes=64, group_size=2)
    results = [{"recorded": (0.0, 8.0, [CommRecord(start=1.0, end=5.0, rank=0, group_rank=0, **ar)])},
               {"recorded": (0.0, 8.0, [CommRecord(start=4.0, end=5.0, rank=1, group_rank=1, **ar),
                                         CommRecord("send", 16, 2, 6.0, 7.0, 1, 1)])}]
    parts = step_parts(mix, results)  # the slowest rank; equal steps: the first, rank 0
    assert parts == {"step": 8.0, "waiting": 3.0, "moving": 1.0, "computing": 4.0}
    results[1]["recorded"] = (0.0, 9.0, results[1]["recorded"][2])
    assert step_parts(mix, results) == {"step": 9.0, "waiting": 0.0, "moving": 1.0, "computing": 8.0}
    # an op no partner shares (another size) counts as moving: nothing is known of its group
    results[0]["recorded"] = (0.0, 10.0, [CommRecord(start=1.0, end=5.0, rank=0, group_rank=0, op="all_reduce",
                                                     bytes=32, group_size=2)])
    assert step_parts(mix, results)["waiting"] == 0 and step_parts(mix, results)["moving"] == 4.0


def test_params_held_counts_each_stage_from_the_shapes():
    """What the notebook's bytes on dp follow: each stage's parameters (tp = 1: every stage of chapter 06's
    split counted), and under TP the split layers divided by t, the rest whole."""
    from parlab.course.bench import mixes
    from parlab.lab.parallel.pipeline import split_gpt2

    cfg = mixes.SIZES
    model = mixes.make_model(cfg)
    for pp in (1, 2, 4):
        stages = split_gpt2(model, pp)
        assert [mixes.params_held(cfg, s, pp) for s in range(pp)] == \
            [sum(p.numel() for p in stage.parameters()) for stage in stages]
    h, v = cfg["n_embd"], cfg["vocab_size"]
    split = cfg["n_layer"] * (12 * h * h + 7 * h) + 2 * v * h  # what Megatron's plan splits, whole model
    assert sum(mixes.params_held(cfg, s, 2, 2) for s in range(2)) == mixes.num_params(cfg) - split // 2
    with pytest.raises(ValueError, match="pp must divide n_layer=4"):
        mixes.params_held(cfg, 0, pp=3)


def test_bytes_sent_is_the_rings_share_of_the_buffer():
    """Chapter 07 reports what a rank sends, not the collectives' buffers: on n ranks an all-reduce's
    2(n−1)/n, a reduce-scatter's or all-gather's (n−1)/n, so ZeRO-1's pair (each of a buffer twice DDP's,
    chapter 04's flat buffer) sends DDP's bytes and FSDP2's three ops 1.5 times them."""
    from parlab.course.bench import mixes

    psi_bytes, n = 4 * 1000, 8
    ddp = mixes.bytes_sent("all_reduce", psi_bytes, n)
    assert ddp == 2 * 7 / 8 * psi_bytes
    zero1 = mixes.bytes_sent("reduce_scatter", psi_bytes, n) + mixes.bytes_sent("all_gather", psi_bytes, n)
    fsdp2 = 2 * mixes.bytes_sent("all_gather", psi_bytes, n) + mixes.bytes_sent("reduce_scatter", psi_bytes, n)
    assert zero1 == ddp and fsdp2 == 1.5 * ddp
    assert mixes.bytes_sent("send", 64, 2) == 64 and mixes.bytes_sent("recv", 64, 2) == 0
    with pytest.raises(ValueError, match="op='gossip'"):
        mixes.bytes_sent("gossip", 64, 2)
