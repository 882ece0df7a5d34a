"""Timelines: every rank's compute, communication and idle time as a Gantt chart (chapters 02, 03, 04, 06).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from parlab.lab.plots.colors import KIND_COLORS


# Within a rank's row, compute runs in the upper lane and communication in the lower one, so that an
# all-reduce overlapping the backward pass (DDP, chapter 03) shows as two bars side by side, not one
# hiding the other. Idle time spans the whole row.
LANES = {"compute": (-0.19, 0.36), "comm": (0.19, 0.36), "idle": (0.0, 0.74)}


def gantt(events, title: str = "", unit: float = 1e-3, unit_name: str = "ms", label_min: float = 0.06, ax=None,
          label_sublanes: bool = False, name_colors: dict | None = None, fit_labels: bool = False):
    """One row per rank (compute above, communication below), one bar per event, coloured by kind;
    names shown on bars wide enough (``label_min``: share of the whole span). Events of one kind that
    overlap in time on a rank (asynchronous collectives in flight together) are stacked in thinner
    sub-lanes, so that none hides another; ``label_sublanes`` names those too, in a smaller font.
    ``ax``: draw into these axes instead of a new figure.

    ``name_colors``: ``{event name: colour}`` for events that are not of their kind's nature (chapter 02's
    ring phases are spans of the upper lane, but neither is computation): those names get their own colour
    and legend entry; an event named ``"NAME k"`` takes NAME's colour and shows ``k`` on its bar (the ring's
    steps, numbered within each phase). ``fit_labels``: drop a name that would stick out of its bar (white on white, it
    reads cut: "ther losses" for "gather losses")."""
    name_colors = name_colors or {}
    events = list(events)

    def named(e):  # the name_colors key an event belongs to, if any: its name, or its name less " k"
        key = e.name.rsplit(" ", 1)[0] if e.name not in name_colors else e.name
        return key if key in name_colors else None
    ranks = sorted({e.rank for e in events})
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.75 * len(ranks) + 1.4))
    else:
        fig = ax.figure
    t0 = min(e.start for e in events)
    span = max(e.end for e in events) - t0 or 1
    sub = _sub_lanes(events)
    labels = []  # (text, its bar)
    for e in sorted(events, key=lambda e: e.kind != "idle"):  # idle first, underneath
        offset, height = LANES.get(e.kind, (0.0, 0.74))
        index, count = sub[id(e)]
        height /= count
        y = ranks.index(e.rank) + offset - 0.5 * height * (count - 1) + index * height
        bar = ax.barh(y, e.seconds / unit, left=(e.start - t0) / unit, height=height,
                      color=name_colors[named(e)] if named(e) else KIND_COLORS.get(e.kind, "grey"),
                      edgecolor="white", linewidth=0.5)
        if e.seconds / span > label_min and e.kind != "idle" and (count == 1 or label_sublanes):
            shown_name = e.name[len(named(e)):].strip() or e.name if named(e) else e.name
            text = ax.text((e.start - t0 + e.seconds / 2) / unit, y, shown_name, ha="center", va="center",
                           color="white", fontsize=8 if count == 1 else 6)
            labels.append((text, bar.patches[0]))
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    if not ax.yaxis_inverted():
        ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit_name})")
    keys = [n for n in name_colors if any(named(e) == n for e in events)]
    shown = [k for k in KIND_COLORS if any(e.kind == k and not named(e) for e in events)]
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in [name_colors[n] for n in keys] +
               [KIND_COLORS[k] for k in shown]]  # no legend entry for nothing
    ax.legend(handles, keys + shown, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    if fit_labels and labels:
        renderer = fig.canvas.get_renderer()
        for text, bar in labels:
            # a fifth of the bar to spare: a later tight_layout of the figure may still narrow the axes
            if text.get_window_extent(renderer).width > 0.8 * bar.get_window_extent(renderer).width:
                text.remove()
    return fig


def _sub_lanes(events) -> dict:
    """id(event) -> (sub-lane index, sub-lanes in its lane): greedy interval colouring per (rank, kind)."""
    out = {}
    lanes: dict = {}
    for e in sorted(events, key=lambda e: e.start):
        lanes.setdefault((e.rank, e.kind), []).append(e)
    for evs in lanes.values():
        ends: list[float] = []  # end time of the last event in each sub-lane
        chosen = []
        for e in evs:
            i = next((i for i, end in enumerate(ends) if end <= e.start), len(ends))
            if i == len(ends):
                ends.append(e.end)
            else:
                ends[i] = e.end
            chosen.append((e, i))
        for e, i in chosen:
            out[id(e)] = (i, len(ends))
    return out
