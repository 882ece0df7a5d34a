"""Who does what, and what moves where, in one data-parallel training step: a grid of ranks × phases.

- :func:`ddp_step`      DDP: each rank's samples (as ``DistributedSampler`` deals them), forward and backward
                        on every rank, each bucket's all-reduce launched as soon as backward has filled it,
                        beside the rest of backward, and the same step everywhere (chapter 03, section 1);
- :func:`ddp_overlap`   the intervals that picture draws: backward in bucket-sized pieces, each bucket's
                        all-reduce from the end of its piece, the optimizer after the last all-reduce;
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


def ddp_overlap(buckets: int = 3, forward: float = 1.6, piece: float = 1.0, all_reduce: float = 0.85,
                optimizer: float = 0.9) -> dict:
    """PyTorch DDP's step as intervals ``(start, end)`` on one time axis (a sketch: durations are arguments,
    not measured): ``forward``; backward in ``buckets`` pieces, piece k producing bucket k's gradients (the
    last layers' first); bucket k's all-reduce from the end of piece k (no earlier than the previous bucket's
    all-reduce ends: one collective at a time, in bucket order), overlapping the pieces after it; the
    ``optimizer`` once the last all-reduce has ended."""
    if not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets={buckets!r}: give the number of gradient buckets, an int >= 1")
    pieces, reduces, free = [], [], 0.0
    for k in range(buckets):
        start = forward + k * piece
        pieces.append((start, start + piece))
        begin = max(start + piece, free)
        reduces.append((begin, begin + all_reduce))
        free = begin + all_reduce
    return {"forward": (0.0, forward), "backward": pieces, "all_reduce": reduces,
            "optimizer": (free, free + optimizer)}


def _draw_overlap(ax, n: int, notes, buckets: int = 3) -> None:
    """:func:`ddp_overlap` on ``n`` ranks: per rank a computation lane above a communication lane; each
    all-reduce joins the ranks' lanes with a line (one collective, every rank in it)."""
    t = ddp_overlap(buckets)
    compute, comm = KIND_COLORS["compute"], KIND_COLORS["comm"]

    def span(x0, x1, y, h, color, text="", fontsize=7):
        ax.add_patch(FancyBboxPatch((x0 + 0.03, y - h / 2), x1 - x0 - 0.06, h, boxstyle="round,pad=0,rounding_size=0.05",
                                    facecolor=color, edgecolor="white", linewidth=1))
        if text:
            ax.text((x0 + x1) / 2, y, text, ha="center", va="center", color="white", fontsize=fontsize)

    for r in range(n):
        span(*t["forward"], r - 0.14, 0.46, compute, notes[r] if notes else "")
        for k, (a, b) in enumerate(t["backward"]):
            span(a, b, r - 0.14, 0.46, compute, f"grads of\nbucket {k}", fontsize=6.5)
        span(*t["optimizer"], r - 0.14, 0.46, compute, "step", fontsize=7)
        for k, (a, b) in enumerate(t["all_reduce"]):
            span(a, b, r + 0.27, 0.24, comm, f"Σ/n bucket {k}", fontsize=6)
    for a, b in t["all_reduce"]:  # one collective across the ranks
        ax.plot([(a + b) / 2] * 2, [0.27, n - 1 + 0.27], color=comm, lw=1.2, alpha=0.6, zorder=0)
    end_backward = t["backward"][-1][1]
    ax.axvline(end_backward, color="#888888", lw=0.8, ls=":")
    heads = [("forward", *t["forward"]), ("backward, last layer first", t["backward"][0][0], end_backward),
             ("optimizer", *t["optimizer"])]
    for name, a, b in heads:
        ax.text((a + b) / 2, -0.62, name, ha="center", va="bottom", fontsize=8)
    ax.text(end_backward, n - 0.35, "backward ends", ha="center", va="top", fontsize=7, color="#555555")
    ax.text(0, n - 0.35, "orange: a bucket's all-reduce, every rank in it, beside the rest of backward",
            ha="left", va="top", fontsize=7, color=comm)
    ax.set_xlim(-0.1, t["optimizer"][1] + 0.1)
    ax.set_ylim(n - 0.2, -1.1)
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(left=False)


def ddp_step(shards, title: str = "", buckets: int = 3):
    """PyTorch DDP's step on ``len(shards)`` ranks, ``shards[r]`` the sample indices rank r trains on (what
    ``DistributedSampler`` gives it): left, the global batch, each sample coloured by its rank; right, each
    rank's forward and backward, the gradients in ``buckets`` buckets, each bucket all-reduced while backward
    goes on (:func:`ddp_overlap`), then the same optimizer step everywhere. Returns the figure."""
    n = len(shards)
    owner = {i: r for r, idx in enumerate(shards) for i in idx}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 0.75 * n + 1.7), gridspec_kw={"width_ratios": [1, 5]})
    for row, i in enumerate(sorted(owner)):
        left.add_patch(plt.Rectangle((0, row), 1, 0.9, color=rank_color(owner[i])))
        left.text(0.5, row + 0.45, f"sample {i} → rank {owner[i]}", ha="center", va="center", fontsize=6.5,
                  color="white")
    left.set_xlim(0, 1)
    left.set_ylim(len(owner), 0)
    left.axis("off")
    left.set_title("the step's global batch", fontsize=9)
    notes = [f"samples {', '.join(map(str, idx))}" for idx in shards]
    _draw_overlap(right, n, notes, buckets)
    right.set_title(title or f"DDP on {n} ranks: one process each; a bucket's all-reduce starts as soon as "
                    "backward has filled it", fontsize=9, loc="left")
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
    step_flow(ddp_phases(n), n, "DDP, drawn unbucketed (v1): one all-reduce", ax=axes[1])
    fig.tight_layout()
    return fig
