"""The ring all-reduce's stepped picture (parlab.lab.plots.ring) against the algorithm it draws, and the
chapter 02 pictures of the α-β model and of a machine's GPU links."""

import matplotlib
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab.lab.parallel.ring import owned_chunk, ring_chunks, ring_schedule
from parlab.lab.plots.cost_model import alpha_beta
from parlab.lab.plots.links import EXAMPLE_TOPOLOGY, gpu_links, parse_topology
from parlab.lab.plots.ring import ring_frame, ring_labels, ring_states

matplotlib.use("Agg")


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_states_follow_the_ring(n):
    states = ring_states(n)
    assert len(states) == 2 * (n - 1) + 1 == len(ring_labels(n))
    everyone = frozenset(range(n))
    # after n−1 reduce-scatter steps each rank holds exactly one chunk fully summed: the one it owns
    for r in range(n):
        full = [c for c in range(n) if states[n - 1][r][c] == everyone]
        assert full == [owned_chunk(r, n)]
    # after step k of the reduce-scatter a sent chunk sums k + 2 ranks; at the end every chunk is complete
    for k in range(n - 1):
        for r, (send, _) in enumerate(ring_schedule(n)[k][2]):
            assert len(states[k + 1][(r + 1) % n][send]) == k + 2
    assert all(cell == everyone for row in states[-1] for cell in row)
    assert not any(cell == everyone for row in states[0] for cell in row) or n == 1


def test_schedule_is_the_ring_s_own():
    # the all-gather starts from the chunk the reduce-scatter left complete, and each rank sends next what it received
    n = 4
    schedule = ring_schedule(n)
    assert [phase for phase, _, _ in schedule] == ["reduce-scatter"] * 3 + ["all-gather"] * 3
    for r in range(n):
        assert schedule[3][2][r] == ring_chunks(owned_chunk(r, n), 0, n)
        for k in range(n - 2):
            assert schedule[k + 1][2][r][0] == schedule[k][2][r][1]


def test_frame_outlines_the_chunk_each_rank_sends():
    n = 4
    for i, (_, _, chunks) in enumerate(ring_schedule(n)):
        fig = ring_frame(n, i)
        assert isinstance(fig, Figure)
        outlined = sorted((int(p.get_x()), int(p.get_y())) for p in fig.axes[0].patches
                          if isinstance(p, Rectangle) and not p.get_fill())
        assert outlined == sorted((send, r) for r, (send, _) in enumerate(chunks))
    done = ring_frame(n, 2 * (n - 1))
    assert not [p for p in done.axes[0].patches if isinstance(p, Rectangle) and not p.get_fill()]
    texts = [t.get_text() for t in done.axes[0].texts]
    assert texts.count("Σ all") == n * n


def test_gpu_links_parse_and_draw():
    assert parse_topology(EXAMPLE_TOPOLOGY) == {(0, 1): "NV2"}
    four = ("\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\n"
            "GPU0\t X \tNV4\tSYS\tPIX\t0-23\nGPU1\tNV4\t X \tPXB\tSYS\t0-23\nGPU2\tSYS\tPXB\t X \tSYS\t24-47\n"
            "NIC0\tPIX\tSYS\tSYS\t X \n")
    links = parse_topology(four)
    assert links == {(0, 1): "NV4", (0, 2): "SYS", (1, 2): "PXB"}
    fig = gpu_links(links)
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert {"GPU0", "GPU1", "GPU2", "NV4", "PXB"} <= labels and "SYS" not in labels


def test_alpha_beta_marks_where_the_regimes_cross():
    alpha, beta = 20e-6, 1 / 50e9
    fig = alpha_beta(alpha, beta, [1024, 1 << 26])
    ax_t, ax_bw = fig.axes
    knee = ax_t.lines[-1].get_xdata()[0]
    assert knee == pytest.approx(alpha / beta)
    assert ax_bw.lines[-1].get_ydata()[0] == pytest.approx(0.5 / beta / 1e9)  # half of 1/β at m*
