"""Strategies composed on a mesh through ``parlab.compose.parallelize`` train exactly like one process.

The required 2-D case: the course's own DDP (chapter 03) on the ``dp`` axis, DTensor tensor parallelism on
the ``tp`` axis, both given their group by the topology; same losses as one process and as PyTorch's
FSDP2 + TP, and every gradient byte counted on its dp group.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import parlab
from parlab.builtin import train_2d
from parlab.compose import parallelize
from parlab.parallel import Topology
from parlab.training import make_model, train, train_single

STEPS = 3


@pytest.fixture(scope="module")
def reference():
    return train_single(STEPS)


def _course_ddp_times_tp():
    from parlab.measure import CommLog
    from parlab.parallel.ddp import _local

    topo = Topology.build(tp=2)  # dp = 2
    log = CommLog()
    parts = parallelize(make_model(), topo, data_parallel="course-ddp", on_collective=log)
    local_numel = sum(_local(p).numel() for p in parts.model.parameters())
    losses = train(parts, STEPS)
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
])
def test_bad_combinations_say_what_is_allowed(sizes, how, message):
    with pytest.raises(parlab.RankError, match=message):
        parlab.launch(_bad, 4, args=(sizes, how), announce=False, output="none")


def _three_stages():
    return parallelize(make_model(), Topology.build(pp=3))


def test_a_pipeline_needs_equal_stages():
    with pytest.raises(parlab.RankError, match="pp=3 stages splits an nn.Sequential into equal runs"):
        parlab.launch(_three_stages, 3, announce=False, output="none")
