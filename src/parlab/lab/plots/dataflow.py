"""Who does what, and what moves where, in one data-parallel training step: a grid of ranks × phases.

- :func:`ddp_step`      DDP: each rank's samples (as ``DistributedSampler`` deals them), forward and backward
                        on every rank, one all-reduce of the gradients, the same step everywhere (chapter 03);
- :func:`step_flow`     any step as phases: a computation is a box on the ranks that do it; an exchange is
                        arrows out of rank 0 (scatter, broadcast), into rank 0 (gather, reduce), or a bar
                        across every rank (all-reduce). Chapter 03 draws ``nn.DataParallel``'s step beside DDP's;
- :func:`phases_from_events` the phases of a recorded step, read from its timeline (``Timeline`` with a
                        ``CommLog(timeline=...)``), so the picture is the run's own sequence, not a drawing of it;
- :func:`ddp_phases`    DDP's four phases, every rank taking part in each;
- :func:`dp_vs_ddp`     a recorded DataParallel step beside DDP's (chapter 03, section 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from parlab.lab.plots.colors import KIND_COLORS, rank_color

FLOWS = {"scatter": "out", "broadcast": "out", "gather": "in", "reduce": "in", "all_reduce": "all"}


@dataclass(frozen=True)
class Phase:
    """One phase of a step: ``kind`` "compute" (done by ``ranks``) or "comm" (``flow``: "out" from rank 0 to
    every rank, "in" from every rank to rank 0, "all" every rank with every other)."""

    name: str
    kind: str
    ranks: tuple
    flow: str | None = None


def ddp_phases(world_size: int) -> list[Phase]:
    """DDP's step: every rank runs forward and backward, all-reduces its gradients, and steps."""
    every = tuple(range(world_size))
    return [Phase("forward", "compute", every), Phase("backward", "compute", every),
            Phase("all_reduce gradients", "comm", every, "all"), Phase("optimizer", "compute", every)]


def phases_from_events(events) -> list[Phase]:
    """The phases of one recorded step in rank 0's order: a computation names the ranks that ran it; an
    exchange (an event of kind "comm" named "OP label") takes its flow from OP. Repeats in a row (a
    broadcast split into several buffers) are one phase."""
    events = list(events)
    ranks = {}
    for e in events:
        ranks.setdefault(e.name, set()).add(e.rank)
    every = tuple(sorted({e.rank for e in events}))
    phases = []
    for e in sorted((e for e in events if e.rank == 0 and e.kind in ("compute", "comm")), key=lambda e: e.start):
        if phases and phases[-1].name == e.name:
            continue
        if e.kind == "comm":
            phases.append(Phase(e.name, "comm", every, FLOWS.get(e.name.split(" ")[0], "all")))
        else:
            phases.append(Phase(e.name, "compute", tuple(sorted(ranks[e.name]))))
    return phases


def _box(ax, x, y, w, h, color, text="", fontsize=8):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="white", linewidth=1))
    if text:
        ax.text(x, y, text, ha="center", va="center", color="white", fontsize=fontsize)


def step_flow(phases, world_size: int, title: str = "", ax=None, rank_name: str = "rank", notes=None):
    """Draw ``phases`` (:class:`Phase`) left to right, one row per rank (rank 0 on top). ``notes``: text per
    rank shown in its first computation's box (its samples, say). Returns the figure."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.15 * len(phases) + 1.2, 0.62 * world_size + 1.3))
    fig = ax.figure
    for x, ph in enumerate(phases):
        ax.text(x, -0.75, ph.name.replace(" ", "\n", 1), ha="center", va="bottom", fontsize=8,
                color=KIND_COLORS[ph.kind] if ph.kind == "comm" else "black")
        if ph.kind == "compute":
            for r in ph.ranks:
                note = notes[r] if notes and x == next(i for i, p in enumerate(phases) if p.kind == "compute") else ""
                _box(ax, x, r, 0.86, 0.62, KIND_COLORS["compute"], note, fontsize=7)
        elif ph.flow == "all":
            _box(ax, x, (world_size - 1) / 2, 0.5, world_size - 0.38, KIND_COLORS["comm"], "Σ / n")
        else:
            for r in range(1, world_size):
                start, end = (0, r) if ph.flow == "out" else (r, 0)
                ax.annotate("", xy=(x + 0.06 * r, end + (0.28 if end > start else -0.28)),
                            xytext=(x + 0.06 * r, start + (0.28 if end < start else -0.28)),
                            arrowprops=dict(arrowstyle="-|>", color=KIND_COLORS["comm"], lw=1.6))
            ax.plot([x - 0.12], [0], marker="o", color=KIND_COLORS["comm"], markersize=7)
    ax.set_xlim(-0.6, len(phases) - 0.4)
    ax.set_ylim(world_size - 0.5, -1.5)
    ax.set_yticks(range(world_size), [f"{rank_name} {r}" for r in range(world_size)])
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(left=False)
    ax.set_title(title, fontsize=9, loc="left")
    return fig


def ddp_step(shards, title: str = ""):
    """DDP's step on ``len(shards)`` ranks, ``shards[r]`` the sample indices rank r trains on (what
    ``DistributedSampler`` gives it): left, the global batch, each sample coloured by its rank; right,
    :func:`step_flow` of :func:`ddp_phases`. Returns the figure."""
    n = len(shards)
    owner = {i: r for r, idx in enumerate(shards) for i in idx}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 0.62 * n + 1.6), gridspec_kw={"width_ratios": [1, 5]})
    for row, i in enumerate(sorted(owner)):
        left.add_patch(plt.Rectangle((0, row), 1, 0.9, color=rank_color(owner[i])))
        left.text(0.5, row + 0.45, f"sample {i} → rank {owner[i]}", ha="center", va="center", fontsize=6.5,
                  color="white")
    left.set_xlim(0, 1)
    left.set_ylim(len(owner), 0)
    left.axis("off")
    left.set_title("the step's global batch", fontsize=9)
    notes = [f"samples {', '.join(map(str, idx))}" for idx in shards]
    step_flow(ddp_phases(n), n, title or f"DDP on {n} ranks: one process per rank, one all-reduce per step",
              ax=right, notes=notes)
    for r in range(n):
        right.get_yticklabels()[r].set_color(rank_color(r))
    fig.tight_layout()
    return fig


def dp_vs_ddp(events, title: str = ""):
    """``nn.DataParallel``'s step as recorded in ``events`` (every rank's timeline of one played step, rank 0
    as GPU 0) beside DDP's on as many ranks. Returns the figure."""
    phases = phases_from_events(events)
    n = len({e.rank for e in events})
    fig, axes = plt.subplots(1, 2, figsize=(1.0 * len(phases) + 5, 0.62 * n + 1.6),
                             gridspec_kw={"width_ratios": [len(phases), 4]})
    step_flow(phases, n, title or f"nn.DataParallel on {n} GPUs: one process, every exchange through GPU 0",
              ax=axes[0], rank_name="GPU")
    step_flow(ddp_phases(n), n, "DDP: one all-reduce", ax=axes[1])
    fig.tight_layout()
    return fig
