"""Chapter 07's pictures: what each rank holds of a model on a mesh (plots.model_split), a choice of layout
(plots.layout_choice) and a cost model's step taken apart (plots.step_parts), each drawn from the objects
the chapter runs and checked against them."""

from types import SimpleNamespace

import matplotlib
import pytest

from parlab.lab.parallel import Topology
from parlab.lab.plots.colors import lighter, rank_color
from parlab.lab.plots.layout_choice import decision, tied
from parlab.lab.plots.model_split import held_pieces, model_on_mesh
from parlab.lab.plots.step_parts import PART_COLORS, step_parts

BLOCKS = [[("wte", True), ("wpe", False), ("block 0", True), ("block 1", True)],
          [("block 2", True), ("block 3", True), ("ln_f", False), ("lm_head", True)]]


def test_held_pieces_follow_the_mesh():
    mesh = Topology(pp=2, dp=2, tp=2)
    held = held_pieces(mesh, BLOCKS)
    assert held[0] == {"wte": "1/2", "wpe": "whole", "block 0": "1/2", "block 1": "1/2"}
    assert held[3] == {"wte": "2/2", "wpe": "whole", "block 0": "2/2", "block 1": "2/2"}  # dp 1, tp 1: a replica
    assert held[5]["lm_head"] == "2/2" and "wte" not in held[5]  # stage 1 holds the head, not the embedding
    assert held[2] == held[0]  # a dp replica holds what its (stage, tp) pair holds
    with pytest.raises(ValueError):
        held_pieces(Topology(pp=4, dp=1, tp=2), BLOCKS)


def test_model_on_mesh_fills_what_each_rank_holds_in_its_tp_colour():
    mesh = Topology(pp=2, dp=2, tp=2)
    fig = model_on_mesh(mesh, BLOCKS)
    ax = fig.axes[0]
    cells = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
    names = [n for blocks in BLOCKS for n, _ in blocks]
    assert len(cells) == mesh.world_size * len(names)
    held = held_pieces(mesh, BLOCKS)
    for rank in range(mesh.world_size):
        for row, name in enumerate(names):
            face = cells[rank * len(names) + row].get_facecolor()[:3]
            piece = held[rank].get(name)
            want = (1, 1, 1) if piece is None else matplotlib.colors.to_rgb("#d9d9d9") if piece == "whole" else \
                lighter(rank_color(mesh.coords(rank)["tp"]), 0.35)
            assert face == pytest.approx(want), (rank, name)


def _prediction(layout, memory, step):
    return SimpleNamespace(layout=layout, memory=SimpleNamespace(total=memory), step_s=step)


def test_decision_draws_every_layout_and_stars_the_marks():
    layouts = [SimpleNamespace(tp=t, pp=1, dp=32 // t, zero_stage=1) for t in (1, 2, 4, 8, 16)]
    priced = [_prediction(l, (100 - 10 * i) * 1e9, 10 + i) for i, l in enumerate(layouts)]
    fig = decision(priced, 80e9, {"guide": priced[3], "fastest": priced[2]}, gpus_per_node=8)
    lines = fig.axes[0].lines
    dots = [l for l in lines if l.get_marker() == "o"]
    stars = [l for l in lines if l.get_marker() == "*"]
    assert len(dots) == len(priced) and len(stars) == 2
    assert [tuple(s.get_xydata()[0]) for s in stars] == [(70.0, 13.0), (80.0, 12.0)]
    hollow = [d for d in dots if d.get_markerfacecolor() == "none"]
    assert len(hollow) == 1 and tuple(hollow[0].get_xydata()[0]) == (60.0, 14.0)  # TP 16 spans two nodes
    greys = [d for d in dots if d.get_markeredgecolor() == "#bbbbbb"]
    assert {tuple(d.get_xydata()[0]) for d in greys} == {(100.0, 10.0), (90.0, 11.0)}  # over 80 GB: no fit


def _labels(fig):
    return fig.axes[0].get_legend_handles_labels()[1]


def test_decision_draws_ties_and_stars_a_winner_only_when_alone():
    """Issue 50: a planner that errs by ±20 % cannot rank layouts priced within 20 % of each other. Those
    that fit with TP inside a node are ringed as tied; the fastest is starred only when alone in the band."""
    layouts = [SimpleNamespace(tp=t, pp=1, dp=32 // t, zero_stage=1) for t in (1, 2, 4, 8, 16)]
    close = [_prediction(l, m * 1e9, s) for l, m, s in zip(layouts, (90, 50, 50, 50, 40), (9, 10, 10.5, 11.9, 10.1))]
    assert [p.step_s for p in tied(close, 80e9, 0.2, gpus_per_node=8)] == [10, 10.5, 11.9]  # not 90 GB, not TP 16
    fig = decision(close, 80e9, {"guide": close[3]}, gpus_per_node=8, band=0.2)
    assert not any(label.startswith("the planner's fastest") for label in _labels(fig))
    assert "3 tied: fit, and priced within 20 % of the fastest (the planner's error)" in _labels(fig)
    rings = [line for line in fig.axes[0].lines if line.get_markeredgecolor() == "#2CA02C"]
    assert len(rings) == 1 and [tuple(xy) for xy in rings[0].get_xydata()] == [(50, 10), (50, 10.5), (50, 11.9)]
    apart = [_prediction(l, 50e9, s) for l, s in zip(layouts, (10, 12.5, 13, 14, 15))]
    assert [label for label in _labels(decision(apart, 80e9, band=0.2, gpus_per_node=8))
            if label.startswith("the planner's fastest")] == ["the planner's fastest: " + str(layouts[0]) + ", 10 s"]
    with pytest.raises(ValueError, match=r"band=1.5: the planner's error as a fraction"):
        tied(apart, 80e9, 1.5)


def test_step_parts_bars_add_up_to_the_prediction():
    rows = [("a", {"compute": 6.0, "dp": 2.0, "optimizer": 9.0}, 10.0, 9.0),
            ("b", {"compute": 3.0, "bubble": 1.0, "tp": 1.0}, 4.0, 4.4)]
    fig = step_parts(rows, groups=(1, 1))
    ax = fig.axes[0]
    ends = {}
    for bar in ax.patches:
        if not bar.get_label().startswith("±"):  # the bars, not the ±20 % band
            y = round(bar.get_y() + bar.get_height() / 2)
            ends[y] = max(ends.get(y, 0), bar.get_x() + bar.get_width())
    assert ends[0] == pytest.approx(0.8) and ends[1] == pytest.approx(1.25)  # parts it does not draw are left out
    assert set(PART_COLORS) == {"compute", "bubble", "tp", "pp", "dp"}
