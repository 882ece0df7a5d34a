"""The pictures of what crosses between a pipeline's ranks (parlab.lab.plots.pipeline_messages) draw what the
schedule sends: one arrow per message, between the right ranks, in colour once sent."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.colors import to_rgb  # noqa: E402

from parlab.lab.parallel import pipeline_p2p as p2p  # noqa: E402
from parlab.lab.parallel import pipeline_schedule as ps  # noqa: E402
from parlab.lab.plots.pipeline_messages import (  # noqa: E402
    MESSAGE_COLORS,
    message_arrows,
    messages_at,
    moments,
    stage_boundaries,
)


def _arrows(fig, prefix):
    return [a for a in fig.axes[0].patches if (a.get_gid() or "").startswith(prefix)]


def test_one_arrow_per_message_between_the_ranks_that_exchange_it():
    for schedule in (ps.one_f_one_b(4, 4), ps.gpipe(3, 5), ps.interleaved_1f1b(2, 4, 2)):
        events = ps.simulate(schedule)
        fig = messages_at(schedule, events)
        drawn = sorted(tuple(a.get_gid().split(":")[1:]) for a in _arrows(fig, "message:"))
        sent = sorted((m.what, str(r), str(m.peer)) for r in range(schedule.num_ranks)
                      for _, _, send in p2p.messages(schedule, r) for m in send)
        assert drawn == sent, schedule.name
    # 1F1B on 4 ranks: activations go one rank down, gradients one rank up
    events = ps.simulate(ps.one_f_one_b(4, 4))
    for what, a, b, t_sent, t_needed in message_arrows(ps.one_f_one_b(4, 4), events):
        assert b - a == (1 if what == "act" else -1) and t_needed >= t_sent


def test_messages_sent_by_the_moment_drawn_are_in_colour_the_others_faded():
    schedule = ps.one_f_one_b(4, 4)
    events = ps.simulate(schedule)
    clock = moments(events)
    assert clock[0] == 0 and clock == sorted(clock) and clock[-1] == max(e.end for e in events)
    until = clock[5]
    fig = messages_at(schedule, events, until)
    arrows = message_arrows(schedule, events)
    patches = _arrows(fig, "message:")
    assert len(patches) == len(arrows)
    in_colour = sum(tuple(patch.get_edgecolor()[:3]) in {to_rgb(c) for c in MESSAGE_COLORS.values()}
                    for patch in patches)
    assert in_colour == sum(t_sent <= until for *_, t_sent, _ in arrows) > 0
    assert in_colour < len(arrows)  # some are still to come at that moment


def test_stage_boundaries_draws_one_arrow_each_way_per_boundary():
    import torch.nn as nn

    stages = [nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Sequential(nn.Linear(2, 2))]
    fig = stage_boundaries(stages, "16 KiB", 4)
    arrows = _arrows(fig, "boundary:")
    assert sorted(a.get_gid() for a in arrows) == sorted(f"boundary:{w}:{r}:{r + 1}" for w in ("act", "grad")
                                                         for r in range(2))
    for a in arrows:  # activations point right (to the next rank), gradients left
        (x0, _), (x1, _) = a._posA_posB
        assert (x1 > x0) == (":act:" in a.get_gid())
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert sum("16 KiB ×4" in t for t in labels) == 4 and "rank 2" in labels
