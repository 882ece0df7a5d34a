"""Timelines: events from different ranks share one clock, so a wait on one rank lines up with work on another."""

import time

import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.lab.measure import Event, Timeline, idle_gaps, merge, record_comm


def _late_rank0():
    tl = Timeline()
    with tl.span("forward"):
        if dist.get_rank() == 0:
            time.sleep(0.2)  # stands in for a slow computation, not for synchronisation
    with record_comm(timeline=tl):
        dist.all_reduce(torch.ones(4))  # rank 1 must wait here for rank 0
    return tl.events


def test_a_wait_on_one_rank_lines_up_with_work_on_another():
    events = merge(parlab.launch(_late_rank0, world_size=2, timeout=20, output="none", announce=False))
    fwd0, _, fwd1, comm1 = events  # sorted by rank, then start
    assert (fwd0.rank, fwd0.name, comm1.rank, comm1.kind) == (0, "forward", 1, "comm")
    assert fwd0.seconds >= 0.2 and fwd1.seconds < 0.1
    # on the common clock rank 1's all-reduce starts before rank 0 has finished computing, and ends after
    assert comm1.start < fwd0.end <= comm1.end + 1e-3
    assert comm1.seconds > 0.1


def test_idle_gaps_fill_the_holes():
    events = [Event(0, "a", "compute", 0.0, 1.0), Event(0, "b", "compute", 1.5, 2.0),
              Event(1, "a", "compute", 0.0, 2.0)]
    idle = [e for e in idle_gaps(events) if e.kind == "idle"]
    assert idle == [Event(0, "idle", "idle", 1.0, 1.5)]


def test_bad_kind_is_named():
    with pytest.raises(ValueError, match="kind='sleep'"):
        Timeline().add("x", "sleep", 0.0, 1.0)
