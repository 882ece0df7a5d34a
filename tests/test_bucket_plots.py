"""The pictures of data-parallel steps and gradient buckets draw the algorithm's state, not a sketch of it:
v3's buckets coloured "launched" exactly when DDPOverlap's rule says so; DataParallel's phases as its run
recorded them; DDP's samples as DistributedSampler deals them."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from matplotlib.colors import to_hex
from matplotlib.patches import FancyBboxPatch, Rectangle

import parlab
from parlab.lab.measure import Event
from parlab.lab.plots import buckets as bplots
from parlab.lab.plots import dataflow
from parlab.lab.plots.colors import KIND_COLORS


def _trace(bucket_bytes):
    from parlab.lab.models import tiny_mlp
    from parlab.lab.parallel import DDPOverlap

    ddp = DDPOverlap(tiny_mlp(seed=0), bucket_bytes)
    with bplots.record_firing(ddp) as trace:
        x = torch.randn(4, next(ddp.module.parameters()).shape[1])
        ddp(x).sum().backward()
        ddp.sync_gradients()
    assert "_launch" not in vars(ddp)  # the wrapper is itself again
    return trace


@pytest.fixture(scope="module")
def trace():
    return parlab.launch(_trace, world_size=2, args=(512,), announce=False, output="none")[0]


def _bars(fig):
    ax = fig.axes[0]
    return [to_hex(p.get_facecolor()) for p in ax.patches if isinstance(p, Rectangle)]


def test_frames_colour_each_bucket_as_the_overlap_rule_says(trace):
    buckets, ready = trace["buckets"], trace["ready"]
    assert len(buckets) > 2 and sorted(ready) == sorted(trace["param_bytes"])
    computing, packed, launched_colour = (to_hex(c) for c in bplots.STATES.values())
    for k in range(len(ready) + 1):
        done = set(ready[:k])
        # DDPOverlap's rule: bucket b leaves once its gradients and every earlier bucket's are packed
        rule = {b for b in range(len(buckets)) if all(n in done for names, _ in buckets[:b + 1] for n in names)}
        assert bplots.launched_after(trace, k) == rule, k
        colours = iter(_bars(bplots.firing_frame(trace, k)))
        for b, (names, _) in enumerate(buckets):
            for name in names:
                want = launched_colour if b in rule else packed if name in done else computing
                assert next(colours) == want, (k, b, name)


def test_layer_steps_end_with_everything_launched(trace):
    counts, labels = bplots.layer_steps(trace)
    assert counts[0] == 0 and counts[-1] == len(trace["ready"]) and len(counts) == len(labels)
    assert bplots.launched_after(trace, counts[-1]) == set(range(len(trace["buckets"])))
    assert bplots.launched_after(trace, 0) == set()


def test_bucket_list_draws_every_gradient_and_refuses_a_wrong_model(trace):
    fig = bplots.bucket_list(trace["buckets"], trace["param_bytes"], cap=512)
    assert len(_bars(fig)) == len(trace["param_bytes"])
    widths = [p.get_width() for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert sum(widths) * 1024 == pytest.approx(sum(nbytes for _, nbytes in trace["buckets"]))
    with pytest.raises(ValueError, match="not this model's"):
        bplots.bucket_list(trace["buckets"], {n: 1 for n in trace["param_bytes"]})


def test_phases_follow_the_recorded_step():
    events = [Event(0, "scatter inputs", "comm", 0, 1), Event(1, "scatter inputs", "comm", 0, 1),
              Event(0, "forward", "compute", 1, 2), Event(1, "forward", "compute", 1, 2),
              Event(0, "reduce gradients", "comm", 2, 3), Event(0, "reduce gradients", "comm", 3, 4),
              Event(1, "reduce gradients", "comm", 2, 4), Event(0, "optimizer", "compute", 4, 5)]
    phases = dataflow.phases_from_events(events)
    assert [(p.name, p.flow, p.ranks) for p in phases] == [
        ("scatter inputs", "out", (0, 1)), ("forward", None, (0, 1)), ("reduce gradients", "in", (0, 1)),
        ("optimizer", None, (0,))]
    fig = dataflow.step_flow(phases, 2)
    boxes = [p for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 3  # forward on both ranks, the optimizer on rank 0 only
    assert len([a for a in fig.axes[0].texts if getattr(a, "arrow_patch", None)]) == 2  # one arrow per exchange


def test_ddp_step_colours_samples_by_the_rank_they_go_to():
    from torch.utils.data import DistributedSampler

    shards = [list(DistributedSampler(range(6), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    fig = dataflow.ddp_step(shards)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts[:3] == ["sample 0 → rank 0", "sample 1 → rank 1", "sample 2 → rank 2"]
    assert "samples 1, 4" in [t.get_text() for t in fig.axes[1].texts]


def test_ddp_step_draws_the_bucket_all_reduces_beside_backward():
    """Chapter 03's first picture is PyTorch DDP's step: each bucket's all-reduce starts when backward has
    filled it, all but the last while backward still runs, and the optimizer waits for the last."""
    t = dataflow.ddp_overlap(buckets=3)
    end_backward = t["backward"][-1][1]
    for (_, piece_end), (start, end), nxt in zip(t["backward"], t["all_reduce"], t["all_reduce"][1:] + [None]):
        assert start >= piece_end and (nxt is None or nxt[0] >= end)  # after its gradients, one at a time
    assert all(start < end_backward for start, _ in t["all_reduce"][:-1])  # overlapping backward
    assert t["optimizer"][0] >= t["all_reduce"][-1][1] > end_backward
    with pytest.raises(ValueError, match="buckets=0"):
        dataflow.ddp_overlap(buckets=0)
    fig = dataflow.ddp_step([[0, 2], [1, 3]], buckets=3)
    comm = [p for p in fig.axes[1].patches if isinstance(p, FancyBboxPatch)
            and p.get_facecolor()[:3] == matplotlib.colors.to_rgb(KIND_COLORS["comm"])]
    assert len(comm) == 2 * 3  # every rank in each bucket's all-reduce
