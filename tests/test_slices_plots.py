"""The slices pictures of chapter 05 (parlab.lab.plots.slices): who holds which slice of a tensor, before and
after each collective, read from the indices the package's own layers keep."""

import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab.lab.plots import slices
from parlab.lab.plots.colors import rank_color


def _faces(fig):
    return [tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in fig.axes[0].patches
            if isinstance(p, Rectangle) and p.get_fill()]


def test_owners_come_from_each_rank_s_indices_and_must_cover_every_unit_once():
    # Colwise(parts=3) keeps rank r's slice of each of Q, K and V: units r, t + r, 2t + r for t = 2, one per unit
    assert slices.from_indices([[0, 2, 4], [1, 3, 5]], 6) == (0, 1, 0, 1, 0, 1)
    assert slices.contiguous(8, 4) == (0, 0, 1, 1, 2, 2, 3, 3)
    with pytest.raises(ValueError, match="kept by rank 0 and rank 1"):
        slices.from_indices([[0, 1], [1]], 2)
    with pytest.raises(ValueError, match="kept by no rank"):
        slices.from_indices([[0], [1]], 3)


def test_linear_frames_follow_the_column_and_row_split():
    t = 4
    col = [torch.arange(r * 3, (r + 1) * 3) for r in range(t)]
    row = [torch.arange(r * 2, (r + 1) * 2) for r in range(t)]
    frames = slices.linear_frames(col, row, n_in=8, n_out=12)
    assert [f.states["Y"] for f in frames] == [[None] * t, [slices.OWN] * t, [None] * t, [slices.PARTIAL] * t,
                                              [slices.WHOLE] * t]
    assert frames[1].changed == {"Y"} and frames[4].changed == {"Y"}
    # the column-parallel A's columns belong to the rank whose layer keeps those output features
    a = frames[0].slabs[1]
    assert a.axis == 1 and a.owners == tuple(u // 3 for u in range(12))
    fig = slices.draw_frame(frames[1])
    assert isinstance(fig, Figure)
    faces = _faces(fig)
    for r in range(t):  # each rank's own columns of Y drawn in its colour
        assert tuple(round(c, 3) for c in rank_color(r)) in faces


def test_mlp_frames_send_one_all_reduce_each_way_and_sequence_frames_swap_them():
    frames = slices.mlp_frames("c_fc", "c_proj", world_size=2, hidden=4, ffn=16)
    partial = [f.label for f in frames if slices.PARTIAL in sum(f.states.values(), [])]
    assert len(frames) == 8 and len(partial) == 2  # Z forward, dX backward: then g's and f's all-reduce
    assert frames[3].states["Z"] == [slices.WHOLE] * 2 and frames[7].states["dX"] == [slices.WHOLE] * 2
    sp = slices.sequence_frames(2, seq_len=8)
    assert sp[0].states["X"] == [slices.OWN] * 2 and sp[1].states["X"] == [slices.GATHERED] * 2
    assert sp[3].states["Z"] == [slices.OWN] * 2 and sp[0].slabs[0].axis == 0  # split along the tokens
    # backward swaps them: dZ's chunks all-gathered, dX's partial sums reduce-scattered back to chunks
    assert sp[5].states["dZ"] == [slices.GATHERED] * 2 and sp[7].states["dX"] == [slices.OWN] * 2
    assert len(sp) == 8 and sp[6].states["dX"] == [slices.PARTIAL] * 2


def test_heads_frames_replicate_kv_heads_only_when_fewer_than_ranks():
    frames = slices.heads_frames({"split": (8, 4, "split"), "one": (8, 1, "replicate")}, world_size=4)
    assert frames[0].states["K/V heads"] == [slices.OWN] * 4 and frames[0].slabs[1].owners == (0, 1, 2, 3)
    assert frames[1].states["K/V heads"] == [slices.WHOLE] * 4
    grey = tuple(round(c, 3) for c in to_rgb(slices.GREY))
    assert grey in _faces(slices.draw_frame(frames[1]))


def test_vocab_frames_end_with_the_loss_s_three_sums_whole():
    frames = slices.vocab_frames(2, vocab=8)
    last = frames[-1].states
    assert last["logits"] == [slices.OWN] * 2  # never gathered
    assert all(last[k] == [slices.WHOLE] * 2 for k in ("max", "Σ exp", "z_target"))
    draw, labels = slices.frames_steps(frames)
    assert len(labels) == len(frames) and isinstance(draw(0), Figure)


def test_chapter_05_charts_draw_what_they_are_given(monkeypatch):
    import matplotlib.pyplot as plt
    import numpy as np

    from parlab.lab.plots.tensors import same_losses, tp_comm_share

    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    ts = np.array([2, 4, 8, 16])
    node = tp_comm_share(ts, {"NVLink x": np.array([.1, .2, .3, .4]), "IB y": np.array([.5, .6, .7, .8])},
                         inside="NVLink x", across="IB y", node_size=8)
    assert node.tolist() == [.1, .2, .3, .8]  # inside a node up to 8 GPUs, across nodes beyond
    assert [line.get_label() for line in shown[-1].axes[0].lines][-1] == "8 GPUs per node: NVLink, then IB"
    same_losses({"A": [3.0, 2.0], "B": [1.0, 0.5]}, {"A": {"w1": [3.0, 2.0], "w2": [3.0, 2.0]},
                                                     "B": {"w1": [1.0, 0.5], "w2": [1.0, 0.5]}})
    axes = shown[-1].axes
    assert [ax.get_title() for ax in axes] == ["A: the same losses, every rank, every way",
                                               "B: the same losses, every rank, every way"]
    sizes = [line.get_markersize() for line in axes[0].lines[1:]]
    assert len(axes[0].lines) == 3 and sizes[0] > sizes[1]  # one process, then each way, nested large to small
    plt.close("all")
