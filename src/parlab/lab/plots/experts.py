"""Experts over ranks drawn: where each token's slots go, and which ranks share which experts (chapter 10).

- :func:`dispatch_grid`, :func:`dispatch_frame`, :func:`dispatch_steps`: each rank's (E, C) dispatch buffer
  from its :class:`~parlab.lab.parallel.expert.Routing` (cell = the token in that slot, colour = the rank
  the token lives on, blank = padding), then what each rank holds after the all-to-all: its experts' slots
  from every rank, in the order ``ExpertParallelMoE._experts`` receives them.
- :func:`expert_groups`: a mesh's dp × cp ranks (one tp coordinate), once per axis: the cp groups, the ep
  groups that share the experts out, and the edp groups of ranks holding the same experts
  (``Topology.groups``), each rank labelled with the experts it holds (``placement``).
"""

from __future__ import annotations

import numpy as np
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab.lab.parallel.expert import placement
from parlab.lab.plots.colors import lighter, rank_color
from parlab.lab.plots.steps import step_through

EMPTY = -1


def dispatch_grid(routing, num_experts: int) -> np.ndarray:
    """(E, C) ints: the token in each slot of one rank's dispatch buffer, ``EMPTY`` where it is padding."""
    grid = np.full((num_experts, routing.capacity), EMPTY)
    for t, k in zip(*np.nonzero(routing.kept.numpy())):
        grid[int(routing.expert[t, k]), int(routing.slot[t, k])] = t
    return grid


def _cells(ax, rows, labels, title):
    """rows: list of (source rank, [token or EMPTY, ...]); one row of slots each."""
    width = max(len(slots) for _, slots in rows)
    for y, (src, slots) in enumerate(rows):
        for x, t in enumerate(slots):
            face = "white" if t == EMPTY else lighter(rank_color(src), 0.35)
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=face, edgecolor="#bbbbbb", lw=0.5))
            if t != EMPTY:
                ax.text(x + 0.5, y + 0.5, str(t), ha="center", va="center", fontsize=5.5)
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks(np.arange(len(rows)) + 0.5, labels, fontsize=6.5)
    ax.set_xticks([])
    ax.set_xlabel("slots", fontsize=7)
    ax.set_title(title, fontsize=8.5)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def dispatch_frame(routings, num_experts: int, i: int) -> Figure:
    """Frame 0: each rank's buffer before the all-to-all (rows: experts; the bracket says where each block
    goes). Frame 1: each rank after it: for each of its experts, the slots of every rank's tokens."""
    ep, place = len(routings), placement(num_experts, len(routings))
    grids = [dispatch_grid(r, num_experts) for r in routings]
    fig = Figure(figsize=(2.7 * ep + 0.6, 0.26 * num_experts * (1 if i == 0 else max(map(len, place)) * ep
                                                                / max(1, num_experts)) + 1.9))
    axes = fig.subplots(1, ep, squeeze=False)[0]
    for p, ax in enumerate(axes):
        if i == 0:
            rows = [(p, list(grids[p][e])) for e in range(num_experts)]
            labels = [f"e{e} → rank {next(d for d, pl in enumerate(place) if e in pl)}" for e in range(num_experts)]
            dropped = routings[p].dropped
            _cells(ax, rows, labels, f"rank {p}'s buffer (E, C): {dropped} dropped")
        else:
            rows = [(s, list(grids[s][e])) for s in range(ep) for e in place[p]]
            labels = [f"e{e} from rank {s}" for s in range(ep) for e in place[p]]
            _cells(ax, rows, labels, f"rank {p} runs experts {place[p].start}–{place[p].stop - 1}")
    fig.suptitle("1. dispatch: each token's slot in its expert's buffer (colour: the token's rank; blank: padding)"
                 if i == 0 else "2. after the all-to-all: every rank's slots of this rank's experts", fontsize=9.5)
    fig.tight_layout()
    return fig


def dispatch_steps(routings, num_experts: int, start: int = 0) -> None:
    """Dispatch, then the all-to-all, as two frames with a slider (chapter 10)."""
    step_through(lambda i: dispatch_frame(routings, num_experts, i), ["dispatch", "after the all-to-all"],
                 "expert parallelism", start)


AXIS_NOTES = {"cp": "cp: the K/V ring of one sequence", "ep": "ep: tokens all-to-all; experts shared out",
              "edp": "edp: same experts; their gradients summed"}


def expert_groups(topology, num_experts: int, axes=("cp", "ep", "edp")) -> Figure:
    """The dp × cp ranks of ``topology`` at tp coordinate 0, drawn once per axis in ``axes``: each group
    of that axis in one colour (listed below it); every rank labelled with the experts it holds."""
    dp, cp, ep = topology.dp, topology.cp, topology.ep
    ranks = [topology.rank_at(dp=d, cp=c) for d in range(dp) for c in range(cp)]
    place = placement(num_experts, ep)
    where = {r: (c, -d) for r, (d, c) in zip(ranks, ((d, c) for d in range(dp) for c in range(cp)))}
    fig = plt.figure(figsize=(2.3 * len(axes) * max(1, cp / 2) + 0.4, 0.75 * dp + 1.5))
    for ax, axis in zip(fig.subplots(1, len(axes), squeeze=False)[0], axes):
        groups = [g for g in topology.groups(axis) if g[0] in where]
        color = {r: rank_color(i) for i, g in enumerate(groups) for r in g}
        for r, (x, y) in where.items():
            ax.add_patch(Rectangle((x - 0.42, y - 0.36), 0.84, 0.72, facecolor=lighter(color[r], 0.55),
                                   edgecolor="#333333", lw=0.8))
            held = place[topology.group_ranks("ep", r).index(r)] if ep > 1 else range(num_experts)
            ax.text(x, y + 0.12, f"rank {r}", ha="center", va="center", fontsize=7.5, weight="bold")
            ax.text(x, y - 0.16, f"e{held.start}–{held.stop - 1}", ha="center", va="center", fontsize=7)
        listed = " ".join(str(g).replace(" ", "") for g in groups)
        ax.set_title(f"{len(groups)} {axis} group{'s' if len(groups) > 1 else ''} of {len(groups[0])}", fontsize=9)
        ax.text(0.5, -0.03, f"{AXIS_NOTES.get(axis, axis)}\n{listed}", transform=ax.transAxes, ha="center",
                va="top", fontsize=7.5)
        ax.set_xlim(-0.6, cp - 0.4)
        ax.set_ylim(-dp + 0.45, 0.55)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(f"dp {dp} × cp {cp} ranks (tp coordinate 0), ep {ep}: colour = group", fontsize=9.5)
    fig.tight_layout()
    return fig


def kept_per_expert(sent, kept, place, capacity: int, groups: int, title: str = "") -> Figure:
    """Assignments each expert was sent (dark grey where dropped) and kept (in the colour of the rank holding it),
    beside the most it can keep: capacity × groups."""
    fig = plt.figure(figsize=(10, 3.2))
    ax = fig.subplots()
    experts = range(len(sent))
    ax.bar(experts, sent, color="#555555", label="sent (dark: dropped above capacity)")
    owner = [next(r for r, p in enumerate(place) if e in p) for e in experts]
    ax.bar(experts, kept, color=[rank_color(r) for r in owner], label="kept (colour: the rank holding the expert)")
    ax.axhline(groups * capacity, color="k", ls=":", label=f"capacity × groups = {groups} × {capacity}")
    ax.set(xlabel="expert", ylabel="token assignments", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
