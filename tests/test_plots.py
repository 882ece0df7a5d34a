"""The plots draw what they are given: one cell per element, one bar per label, one row per rank."""

import matplotlib

matplotlib.use("Agg")

import torch
from matplotlib.patches import Rectangle

from parlab.lab import plots
from parlab.lab.measure import BandwidthPoint, Event, estimate_memory


def test_rank_tensors_one_cell_per_element():
    before = [torch.arange(2.0) + 10 * r for r in range(3)]
    after = [torch.arange(6.0) for _ in range(3)]
    fig = plots.rank_tensors(before, after, title="all-gather")
    left, right = fig.axes
    assert sum(isinstance(p, Rectangle) for p in left.patches) == 6
    assert sum(isinstance(p, Rectangle) for p in right.patches) == 18
    assert [t.get_text() for t in left.texts][:2] == ["0", "1"]


def test_memory_bars_label_totals_and_cut_tall_bars():
    bars = {"small": estimate_memory(num_params=10**9), "huge": estimate_memory(num_params=10**11)}
    fig = plots.memory_bars(bars, limit=80e9, ymax=320e9)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "16" in texts and "1,600 ↑" in texts
    assert fig.axes[0].get_ylim()[1] == 320


def test_gantt_one_row_per_rank():
    events = [Event(0, "fwd", "compute", 0.0, 1.0), Event(1, "all_reduce", "comm", 0.5, 1.5)]
    fig = plots.gantt(events)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert len([p for p in ax.patches if p.get_width() > 0]) == 2


def test_gantt_names_overlapping_collectives_only_when_asked():
    events = [Event(0, "f h0", "compute", 0.0, 1.0), Event(0, "AG h1", "comm", 0.0, 1.0),
              Event(0, "RS h0", "comm", 0.5, 1.5)]  # in flight together: two sub-lanes
    assert [t.get_text() for t in plots.gantt(events).axes[0].texts] == ["f h0"]
    ax = plots.gantt(events, label_sublanes=True).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["AG h1", "RS h0", "f h0"]
    assert {t.get_fontsize() for t in ax.texts if t.get_text() != "f h0"} == {6}


def test_bandwidth_draws_fit_and_both_rates():
    pts = [BandwidthPoint(m, 1e-5 + m / 1e9, m / (1e-5 + m / 1e9), m / (1e-5 + m / 1e9)) for m in (1e3, 1e6)]
    fig = plots.bandwidth({"all_reduce": pts}, fit={"all_reduce": (1e-5, 1e-9)})
    left, right = fig.axes[:2]
    assert len(left.lines) == 2 and len(right.lines) == 2
    assert "α = 10 µs" in left.get_legend().get_texts()[1].get_text()


def test_comm_bytes_one_bar_per_rank_one_segment_per_exchange():
    from parlab.lab.measure import CommRecord
    records = [[CommRecord("broadcast", 4096, 2, 0.0, 1.0, r, r, "replicate"),
                CommRecord("gather", 1024, 2, 1.0, 2.0, r, r, "logits")] for r in range(2)]
    fig = plots.comm_bytes(records)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["broadcast replicate", "gather logits"]
    assert sorted(p.get_width() for p in ax.patches) == [1.0, 1.0, 4.0, 4.0]  # KiB
    assert [t.get_text().strip() for t in ax.texts] == ["5", "5"]  # each rank's total


def test_mesh_draws_every_rank_and_each_axis_groups():
    from parlab.lab.parallel import Topology

    topo = Topology(pp=2, dp=3, tp=2)
    fig = plots.mesh(topo, gpus_per_node=4)
    first, *groups = fig.axes
    assert [ax.get_title() for ax in groups] == ["6 pp groups of 2", "4 dp groups of 3", "6 tp groups of 2"]
    boxes = [p for p in first.patches if isinstance(p, Rectangle) and p.get_fill()]
    assert len(boxes) == 12  # one box per rank; the dotted node outlines are not filled
    assert {t.get_text() for t in first.texts} >= {"rank 7\n1,0,1", "stage 1"}  # rank 7: pp 1, dp 0, tp 1
    # each group joined by (its size − 1) lines, drawn as annotations beside 12 rank numbers and a caption
    joins = [sum(type(t).__name__ == "Annotation" for t in ax.texts) for ax in groups]
    assert joins == [6 * 1, 4 * 2, 6 * 1]


def test_gantt_name_colors_and_legend():
    events = [Event(0, "reduce-scatter", "compute", 0.0, 1.0), Event(0, "all-gather", "compute", 1.0, 2.0),
              Event(0, "send", "comm", 0.0, 0.5)]
    ax = plots.gantt(events, name_colors={"reduce-scatter": "#8172B3", "all-gather": "#55A868"}).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["reduce-scatter", "all-gather", "comm"]
    colours = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches}
    assert len(colours) == 3  # no "compute" blue: the phases are not computation


def test_gantt_numbered_steps_take_their_phase_colour_and_show_their_number():
    events = [Event(0, "reduce-scatter 1", "compute", 0.0, 1.0), Event(0, "reduce-scatter 2", "compute", 1.0, 2.0),
              Event(0, "all-gather 1", "compute", 2.0, 3.0), Event(0, "send", "comm", 0.0, 0.5)]
    ax = plots.gantt(events, name_colors={"reduce-scatter": "#8172B3", "all-gather": "#55A868"}).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["reduce-scatter", "all-gather", "comm"]
    assert sorted(t.get_text() for t in ax.texts) == ["1", "1", "2", "send"]  # each step its number
    colours = [tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches]
    assert colours[0] == colours[1] != colours[2]  # both reduce-scatter steps in the phase's colour


def test_gantt_fit_labels_drops_names_wider_than_their_bar():
    events = [Event(0, "gather losses", "comm", 0.0, 0.02), Event(0, "forward", "compute", 0.0, 1.0)]
    assert {t.get_text() for t in plots.gantt(events, label_min=0.0).axes[0].texts} == {"gather losses", "forward"}
    assert [t.get_text() for t in plots.gantt(events, label_min=0.0, fit_labels=True).axes[0].texts] == ["forward"]


def test_bandwidth_draws_spread_of_rounds():
    pts = [BandwidthPoint(m, 1e-5 + m / 1e9, m / (1e-5 + m / 1e9), m / (1e-5 + m / 1e9)) for m in (1e3, 1e6)]
    fig = plots.bandwidth({"all_reduce": pts}, spread={"all_reduce": [(0.5e-5, 2e-5), (1e-3, 1.2e-3)]})
    assert len(fig.axes[0].collections) == 1  # one set of error bars
