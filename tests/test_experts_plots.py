"""The expert-parallel pictures (``parlab.lab.plots.experts``, chapter 10) hold what the layer does: each
rank's dispatch grid is ``dispatch``'s buffer (the token in each slot), its padding the buffer's empty
rows; the groups drawn are the topology's."""

import torch
from matplotlib.figure import Figure

from parlab.lab.parallel import expert as epx
from parlab.lab.plots.experts import EMPTY, dispatch_frame, dispatch_grid, expert_groups
from parlab.lab.topology import Topology


def test_dispatch_grid_is_the_dispatch_buffer():
    moe = epx.MoE(4, 8, 6, 2, 1.0)
    x = torch.arange(20 * 4, dtype=torch.float32).view(20, 4) / 10 + torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    _, _, routings = moe(x, groups=2)
    for g, routing in enumerate(routings):
        part = x[g * 10:(g + 1) * 10]
        grid = dispatch_grid(routing, 6)
        buffer = epx.dispatch(part, routing, 6)
        for e in range(6):
            for c in range(routing.capacity):
                t = grid[e, c]
                want = torch.zeros(4) if t == EMPTY else part[t]
                assert torch.equal(buffer[e, c], want)
        assert (grid != EMPTY).sum() == routing.kept.sum()
    for i in (0, 1):
        assert isinstance(dispatch_frame(routings, 6, i), Figure)


def test_expert_groups_draws_the_topologys_groups():
    topo = Topology(dp=4, cp=2, tp=2, ep=4)
    fig = expert_groups(topo, 8)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("[0,2,4,6] [8,10,12,14]" in t for t in texts)
    assert any("[0,8] [2,10] [4,12] [6,14]" in t for t in texts)
    assert sum(t == "e2–3" for t in texts) == 3 * 2  # ranks 2 and 10 hold experts 2-3, in each of 3 panels


def test_kept_per_expert_colours_each_expert_by_its_rank():
    from parlab.lab.plots.colors import rank_color
    from parlab.lab.plots.experts import kept_per_expert

    place = epx.placement(6, 3)
    fig = kept_per_expert([5, 6, 7, 8, 9, 10], [5, 5, 5, 5, 5, 5], place, 5, 1)
    bars = fig.axes[0].patches[6:]  # the kept bars, after the sent ones
    assert [tuple(b.get_facecolor()[:3]) for b in bars] == [tuple(rank_color(e // 2)) for e in range(6)]
