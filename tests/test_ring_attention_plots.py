"""The ring-attention picture (``parlab.lab.plots.ring_attention``, chapter 10) holds what the ring computes:
each step's scored pairs per rank are ``Layout.score_pairs`` (what the ranks count while running), every
visible pair is scored exactly once, and the frame colours each computed pair with its query's rank."""

import numpy as np
import pytest
from matplotlib.figure import Figure

from parlab.lab.parallel import context as cpx
from parlab.lab.plots.colors import rank_color
from parlab.lab.plots.ring_attention import (HIDDEN, PENDING, owners, ring_attention_frame, ring_attention_states,
                                            spans)


@pytest.mark.parametrize("seq_len, cp, balanced", [(32, 4, True), (32, 4, False), (13, 3, True), (10, 2, False)])
def test_states_are_the_rings_work_per_rank_and_step(seq_len, cp, balanced):
    layout = cpx.Layout(seq_len, cp, balanced)
    grid, who = ring_attention_states(layout), owners(layout)
    assert PENDING not in grid  # after the last step every pair is scored or hidden
    assert (grid == HIDDEN).sum() == seq_len * (seq_len - 1) // 2
    counted = [[int(((grid == s) & (who[:, None] == r)).sum()) for s in range(cp)] for r in range(cp)]
    assert counted == layout.score_pairs()
    for r in range(cp):  # at step s rank r's queries meet exactly the keys of rank (r - s) mod cp
        for s in range(cp):
            keys = set(np.nonzero((grid == s)[layout.positions(r).numpy()].any(0))[0].tolist())
            assert keys <= set(layout.positions(cpx.ring_source(r, s, cp)).tolist())


def test_frame_colours_this_steps_pairs_with_the_querys_rank():
    layout = cpx.Layout(16, 2, balanced=False)
    fig = ring_attention_frame(layout, 1)
    assert isinstance(fig, Figure)
    image = fig.axes[1].images[0].get_array()
    assert np.allclose(image[12, 2], rank_color(1))  # query 12 (rank 1) against key 2 (rank 0's block) at step 1
    assert np.allclose(image[2, 12], 0.88)  # hidden by the causal mask
    with pytest.raises(ValueError, match="outside the ring's steps"):
        ring_attention_frame(layout, 2)
    assert spans([0, 1, 2, 7, 8, 10]) == "0–2, 7–8, 10"


def test_pairs_per_step_and_ring_step_times_draw_what_they_are_given():
    from parlab.lab.plots.ring_attention import pairs_per_step, ring_step_times

    counted = {"contiguous": cpx.Layout(16, 2, False).score_pairs(), "head and tail": cpx.Layout(16, 2).score_pairs()}
    fig = pairs_per_step(counted)
    assert [ax.get_title() for ax in fig.axes] == ["contiguous: busiest / mean = 1.47", "head and tail: busiest / mean = 1.00"]
    assert fig.axes[0].images[0].get_array().tolist() == counted["contiguous"]
    steps = [cpx.cp_step(n * 4, 4, heads=4, kv_heads=1, head_dim=64, flops=1e12, alpha=1e-6, bandwidth=1e9)
             for n in (64, 128, 256)]
    fig = ring_step_times([64, 128, 256], steps, 100.0, {"mark": 200})
    assert [line.get_label() for line in fig.axes[0].lines][-2:] == ["n* = 100", "mark"]
