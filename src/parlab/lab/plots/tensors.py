"""Tensors drawn cell by cell: every rank's tensor before and after a collective (chapter 02), and a
matrix product split by columns and by rows over the ranks (chapter 05). Chapter 05's two charts of a
tensor-parallel run as a whole: the same losses every way (:func:`same_losses`) and the share of a layer's
time TP's all-reduces take as t grows, link by link (:func:`tp_comm_share`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from parlab.lab.plots.colors import rank_color


def _fmt(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def rank_tensors(before, after, title: str = "", cmap: str = "viridis"):
    """Two panels, ``before`` and ``after``: row r is rank r's tensor, one numbered cell per element.

    before, after: lists indexed by rank of 1-D tensors (any lengths; ``None`` draws an empty row).
    """
    rows = [list(map(_as_list, before)), list(map(_as_list, after))]
    values = [v for side in rows for row in side for v in row]
    lo, hi = (min(values), max(values)) if values else (0, 1)
    norm = plt.Normalize(lo, hi if hi > lo else lo + 1)
    colors = plt.get_cmap(cmap)
    widths = [max((len(r) for r in side), default=1) or 1 for side in rows]
    n = len(before)
    fig, axes = plt.subplots(1, 2, figsize=(2.4 + 0.55 * sum(widths), 0.5 * n + 1.2), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, side, label, width in zip(axes[0], rows, ("before", "after"), widths):
        for r, row in enumerate(side):
            for i, v in enumerate(row):
                ax.add_patch(Rectangle((i, r), 0.95, 0.9, color=colors(norm(v))))
                shade = "white" if norm(v) < 0.6 else "black"
                ax.text(i + 0.475, r + 0.45, _fmt(v), ha="center", va="center", color=shade, fontsize=9)
        ax.set_xlim(0, width)
        ax.set_ylim(n, 0)
        ax.set_yticks([r + 0.45 for r in range(n)], [f"rank {r}" for r in range(n)])
        ax.set_xticks([])
        ax.set_title(label)
        for spine in ax.spines.values():
            spine.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _as_list(t):
    if t is None:
        return []
    return [float(v) for v in (t.flatten().tolist() if hasattr(t, "flatten") else t)]


def matmul_split(tp_size: int, title: str = ""):
    """Y = X·A split over ``tp_size`` ranks two ways, one colour per rank (chapter 05).

    Top, by columns: every rank holds all of X and its columns of A, and computes its columns of Y.
    Bottom, by rows: rank r holds X's columns r and A's rows r, and computes a whole-sized partial Y_r;
    Y is their sum (an all-reduce).
    """
    t = tp_size
    colors = [rank_color(r) for r in range(t)]
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.2))

    def block(ax, x, y, w, h, label, split=None, hatch=None, color="#cccccc"):
        # split: None (one colour), "cols" or "rows" (t stripes, one per rank)
        for r in range(t if split else 1):
            c = colors[r] if split else color
            dx, dy, ww, hh = (x + r * w / t, y, w / t, h) if split == "cols" else \
                (x, y + (t - 1 - r) * h / t, w, h / t) if split == "rows" else (x, y, w, h)
            ax.add_patch(Rectangle((dx, dy), ww, hh, facecolor=c, edgecolor="k", lw=0.8, alpha=0.75, hatch=hatch))
        ax.text(x + w / 2, y + h + 0.12, label, ha="center", va="bottom", fontsize=9)

    ax = axes[0]
    block(ax, 0, 0, 1.6, 1.2, "X (b × k): whole on every rank")
    ax.text(1.9, 0.6, "·", fontsize=20, ha="center", va="center")
    block(ax, 2.2, -0.2, 2.0, 1.6, "A (k × n): columns split", "cols")
    ax.text(4.5, 0.6, "=", fontsize=16, ha="center", va="center")
    block(ax, 4.8, 0, 2.0, 1.2, "Y: columns split, Y_r = X·A_r", "cols")
    ax.text(7.1, 0.6, "each rank its own columns:\nno communication (yet)", fontsize=9, va="center")
    ax.set_title("column-parallel: rank r computes X·A_r", fontsize=10, loc="left")
    ax = axes[1]
    block(ax, 0, 0, 1.6, 1.2, "X (b × k): columns split", "cols")
    ax.text(1.9, 0.6, "·", fontsize=20, ha="center", va="center")
    block(ax, 2.2, -0.2, 2.0, 1.6, "A (k × n): rows split", "rows")
    ax.text(4.5, 0.6, "=", fontsize=16, ha="center", va="center")
    w = 2.6 / t
    for r in range(t):
        block(ax, 4.8 + r * (w + 0.15), 0.2, w, 0.8, f"X{r}·A{r}", color=colors[r], hatch="//")
        if r < t - 1:
            ax.text(4.8 + r * (w + 0.15) + w + 0.075, 0.6, "+", ha="center", va="center", fontsize=10)
    ax.text(4.8 + t * (w + 0.15) + 0.1, 0.6, "all-reduce → Y\n(whole on every rank)", fontsize=9, va="center")
    ax.set_title("row-parallel: rank r computes a partial sum X_r·A_r", fontsize=10, loc="left")
    for ax in axes:
        ax.set_xlim(-0.2, 9.4)
        ax.set_ylim(-0.4, 1.9)
        ax.set_aspect("equal")
        ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, alpha=0.75) for c in colors]
    fig.legend(handles, [f"rank {r}" for r in range(t)], loc="lower center", ncol=t, frameon=False, fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def same_losses(single: dict, ways: dict, title: str = "{kind}: the same losses, every rank, every way"):
    """One panel per model: ``single[kind]``, one process's losses per step (a wide grey line), and each of
    ``ways[kind]``, ``{label: losses}``, drawn over it with markers nested from large to small, so that every
    way stays visible where they agree."""
    fig, axes = plt.subplots(1, len(single), figsize=(5.5 * len(single), 3.4), squeeze=False)
    for ax, (kind, losses) in zip(axes[0], single.items()):
        ax.plot(losses, "k-", lw=4, alpha=0.3, label="one process")
        n = len(ways[kind])
        for i, (label, got) in enumerate(ways[kind].items()):
            ax.plot(got, "osDv^<>p"[i % 8], ms=13 - 9 * i / max(n - 1, 1), label=label)
        ax.set(title=title.format(kind=kind), xticks=range(len(losses)), xlabel="step", ylabel="loss")
        ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def tp_comm_share(tp_sizes, shares: dict, inside: str, across: str, node_size: int = 8, title: str = ""):
    """The share of a layer's time in TP's all-reduces against the tensor-parallel size t, one line per
    link (``shares``: ``{link name: share at each of tp_sizes}``), and a node's path as a dashed line: the
    ``inside`` link up to ``node_size`` GPUs, the ``across`` link beyond, where the sizes that cross nodes
    are shaded. Returns that path's shares."""
    import numpy as np

    ts = np.asarray(tp_sizes)
    node = np.where(ts <= node_size, shares[inside], shares[across])
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for name, share in shares.items():
        ax.plot(ts, share, "o-", label=name)
    ax.plot(ts, node, "k--", lw=2, label=f"{node_size} GPUs per node: {inside.split()[0]}, then {across.split()[0]}")
    ax.axvspan(node_size + 0.5, ts.max() * 1.1, color="gray", alpha=0.1)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="tensor-parallel size t", ylabel="share of a layer's time in TP all-reduces", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()
    return node
