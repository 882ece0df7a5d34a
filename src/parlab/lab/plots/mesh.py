"""A mesh drawn: which rank sits where, and which ranks talk on each axis (chapter 07).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from parlab.lab.plots.colors import lighter


AXIS_TALK = {"dp": "dp: gradients (all-reduce, or reduce-scatter + all-gather)",
             "tp": "tp: activations, 4 all-reduces per layer", "pp": "pp: activations and their gradients (send/recv)"}


def mesh(topology, title: str = "", gpus_per_node: int | None = None, axes=("pp", "dp", "tp")):
    """A mesh drawn twice over (chapter 07). Left: every rank as a box at its place, labelled with its
    coordinates: one block per pipeline stage, a row per data-parallel replica, a column per tensor-parallel
    rank. Then one panel per axis of size > 1 in ``axes``: the same boxes, each group of that axis (the ranks
    that talk for it) in one colour and joined by a line, captioned with what the axis sends.
    ``gpus_per_node``: shade the ranks of each node (they share the fast link)."""
    shown = [a for a in axes if getattr(topology, a) > 1]
    fig, panels = plt.subplots(1, 1 + len(shown), figsize=(3.2 + 3.0 * len(shown) + 0.5 * topology.pp, 2.6),
                               squeeze=False)
    panels = panels[0]
    tp, dp, pp = topology.tp, topology.dp, topology.pp

    def place(rank):
        c = topology.coords(rank)
        return c["pp"] * (tp + 0.6) + c["tp"], -c["dp"]

    def boxes(ax, colors=None, labels=True):
        for r in range(topology.world_size):
            x, y = place(r)
            face = colors.get(r, "#eeeeee") if colors else "#dde6f2"
            ax.add_patch(Rectangle((x - 0.42, y - 0.4), 0.84, 0.8, facecolor=face, edgecolor="#333333", lw=0.8))
            c = topology.coords(r)
            text = f"{r}" if not labels else f"rank {r}\n{c['pp']},{c['dp']},{c['tp']}"
            ax.text(x, y, text, ha="center", va="center", fontsize=6.5 if labels else 8)
        if gpus_per_node:
            for r in range(0, topology.world_size, gpus_per_node):
                xs, ys = zip(*(place(q) for q in range(r, min(r + gpus_per_node, topology.world_size))))
                ax.add_patch(Rectangle((min(xs) - 0.5, min(ys) - 0.5), max(xs) - min(xs) + 1, max(ys) - min(ys) + 1,
                                       fill=False, ls=":", edgecolor="#888888", lw=1))
        ax.set_xlim(-0.7, pp * (tp + 0.6) - 0.3)
        ax.set_ylim(-dp + 0.3, 0.7)
        ax.set_aspect("equal")
        ax.axis("off")

    boxes(panels[0])
    for s in range(pp):
        panels[0].text(s * (tp + 0.6) + (tp - 1) / 2, 0.55, f"stage {s}", ha="center", va="bottom", fontsize=7)
    panels[0].set_title("rank: pp, dp, tp", fontsize=9)
    palette = plt.get_cmap("tab10")
    for ax, axis in zip(panels[1:], shown):
        groups = topology.groups(axis)
        colors = {r: palette(i % 10) for i, g in enumerate(groups) for r in g}
        boxes(ax, {r: lighter(c, 0.45) for r, c in colors.items()}, labels=False)
        for i, g in enumerate(groups):  # neighbours in the group joined; pp's arc over the ranks between
            for a, b in zip(g, g[1:]):
                ax.annotate("", xy=place(b), xytext=place(a), zorder=3,
                            arrowprops=dict(arrowstyle="-", color=palette(i % 10), lw=2, shrinkA=6, shrinkB=6,
                                            connectionstyle=f"arc3,rad={-0.35 if axis == 'pp' else 0}"))
        ax.set_title(f"{len(groups)} {axis} group{'s' if len(groups) > 1 else ''} of {getattr(topology, axis)}",
                     fontsize=9)
        ax.text(0.5, -0.02, AXIS_TALK[axis], transform=ax.transAxes, ha="center", va="top", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
