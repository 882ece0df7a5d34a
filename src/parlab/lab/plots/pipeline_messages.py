"""What crosses between a pipeline's ranks (chapter 06).

:func:`messages_at` draws a schedule's simulated timeline up to a moment, with every message between ranks
as an arrow from the operation that produced it to the one that needs it: activations forward, their
gradients back. Stepped with ``step_through`` over :func:`moments`, it shows the executor's clock.
:func:`stage_boundaries` draws a model cut into stages, one column per rank, and the only tensors that
leave a rank: one activation forward and one gradient back per micro-batch at each boundary.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from parlab.lab.plots.colors import KIND_COLORS, PIPELINE_COLORS, lighter

#: a message's colour: an activation going forward, a gradient going back
MESSAGE_COLORS = {"act": "#C44E52", "grad": "#8172B3"}


def moments(events) -> list[float]:
    """The times at which some operation of ``events`` (a simulated timeline) ends, in order, 0 first."""
    return sorted({0.0} | {e.end for e in events})


def message_arrows(schedule, events) -> list[tuple]:
    """Every message of ``schedule`` as ``(what, sender, receiver, sent_at, needed_at)``: it leaves when the
    operation that produced it ends on ``sender`` and is needed when ``receiver``'s operation starts
    (``events``: ``pipeline_schedule.simulate(schedule)``)."""
    from parlab.lab.parallel.pipeline_p2p import messages

    many = schedule.stages_per_rank > 1
    when = {(e.rank, e.name): e for e in events}
    sent = {}  # (what, stage, micro-batch) -> (sender, time it leaves)
    needed = {}
    for r in range(schedule.num_ranks):
        for recv, op, send in messages(schedule, r):
            for m in send:
                sent[m.what, m.stage, m.micro_batch] = (r, when[r, op.name(many)].end)
            for m in recv:
                needed[m.what, m.stage, m.micro_batch] = (r, when[r, op.name(many)].start)
    return [(key[0], sent[key][0], needed[key][0], sent[key][1], needed[key][1]) for key in sorted(sent)]


def messages_at(schedule, events, until: float | None = None, title: str = "") -> Figure:
    """``schedule``'s timeline (``events``, simulated) with its messages as arrows; operations that start at
    or after ``until`` are drawn faded, and messages sent by then are drawn in colour (the others faded).
    A plain ``Figure`` (not pyplot's), so that ``step_through`` can show it."""
    from parlab.lab.parallel.pipeline_schedule import Op

    until = float("inf") if until is None else until
    p = schedule.num_ranks
    end = max(e.end for e in events)
    fig = Figure(figsize=(10, 0.6 * p + 1.6))
    ax = fig.subplots()
    # Bars, names and arrows lie inside the axes, whose limits are set below: added with add_artist and left out
    # of the layout (barh's and add_patch's update of the data limits, and the arrows' and names' extents in
    # tight_layout and the step-through's bounding box, were most of a frame's time; the picture is the same)
    for r in range(p):
        ax.add_artist(Rectangle((0, r - 0.3), end, 0.6, facecolor=KIND_COLORS["idle"], linewidth=0))
    for e in events:
        op = Op.parse(e.name, stage=e.rank)
        color = PIPELINE_COLORS[op.kind] if e.start < until else lighter(PIPELINE_COLORS[op.kind], 0.75)
        ax.add_artist(Rectangle((e.start, e.rank - 0.3), e.end - e.start, 0.6, facecolor=color, edgecolor="white",
                                linewidth=0.8))
        ax.text((e.start + e.end) / 2, e.rank, f"{op.kind}{op.micro_batch}", ha="center", va="center",
                color="white", fontsize=7, in_layout=False)
    for what, a, b, t_sent, t_needed in message_arrows(schedule, events):
        y0, y1 = a + (0.3 if b > a else -0.3), b + (-0.3 if b > a else 0.3)
        color = MESSAGE_COLORS[what] if t_sent <= until else lighter(MESSAGE_COLORS[what], 0.6)
        ax.add_artist(FancyArrowPatch((t_sent, y0), (max(t_needed, t_sent), y1), arrowstyle="-|>", mutation_scale=9,
                                      color=color, linewidth=1.1, gid=f"message:{what}:{a}:{b}", in_layout=False))
    if until < float("inf"):
        ax.axvline(until, color="black", linewidth=0.8, linestyle=":")
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (forward times of a whole rank)")
    handles = [Rectangle((0, 0), 1, 1, color=PIPELINE_COLORS[k]) for k in "FB"] + [
        FancyArrowPatch((0, 0), (1, 0), color=MESSAGE_COLORS[w]) for w in ("act", "grad")]
    ax.legend(handles, ["forward", "backward", "activation sent on", "gradient sent back"], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def _layer_labels(stage) -> list[str]:
    """A stage module's children as labels: ``h ×2`` for a list of blocks; missing parts left out."""
    labels = []
    for name, child in stage.named_children():
        if child is None:
            continue
        n = len(child) if hasattr(child, "__len__") else 1
        labels.append(f"{name} ×{n}" if n > 1 else name)
    return labels


def stage_boundaries(stages, message: str, per_step: int, title: str = "") -> Figure:
    """A model cut into ``stages`` (modules, one per rank, in order): each rank's layers in a column, and at
    each boundary the one arrow forward (activations) and one back (their gradients) that cross it,
    labelled ``message`` (a tensor's size) ``× per_step`` (messages per step). Nothing else leaves a rank."""
    p = len(stages)
    fig = Figure(figsize=(3.0 * p, 3.4))
    ax = fig.subplots()
    tallest = max(len(_layer_labels(s)) for s in stages)
    for r, stage in enumerate(stages):
        x = 3.0 * r
        ax.add_patch(Rectangle((x, 0), 1.6, tallest + 0.6, facecolor=lighter(KIND_COLORS["compute"], 0.88),
                               edgecolor=KIND_COLORS["compute"]))
        ax.text(x + 0.8, tallest + 0.9, f"rank {r}", ha="center", fontsize=9, fontweight="bold")
        for i, label in enumerate(_layer_labels(stage)):
            ax.add_patch(Rectangle((x + 0.15, tallest - 0.2 - i - 0.8), 1.3, 0.75, facecolor="white",
                                   edgecolor="#888888"))
            ax.text(x + 0.8, tallest - 0.2 - i - 0.42, label, ha="center", va="center", fontsize=8)
        ax.text(x + 0.8, -0.45, "weights, gradients,\noptimizer state: stay", ha="center", va="top", fontsize=7,
                color="#555555")
        if r + 1 < p:
            for what, y, start, stop in (("act", 0.62, 1.65, 2.95), ("grad", 0.38, 2.95, 1.65)):
                ax.add_patch(FancyArrowPatch((x + start, y * tallest), (x + stop, y * tallest), arrowstyle="-|>",
                                             mutation_scale=12, color=MESSAGE_COLORS[what], linewidth=1.4,
                                             gid=f"boundary:{what}:{r}:{r + 1}"))
            ax.text(x + 2.3, 0.62 * tallest + 0.25, f"activation\n{message} ×{per_step}", ha="center",
                    va="bottom", fontsize=7, color=MESSAGE_COLORS["act"])
            ax.text(x + 2.3, 0.38 * tallest - 0.25, f"gradient\n{message} ×{per_step}", ha="center", va="top",
                    fontsize=7, color=MESSAGE_COLORS["grad"])
    ax.set_xlim(-0.2, 3.0 * (p - 1) + 1.8)
    ax.set_ylim(-1.5, tallest + 1.3)
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
