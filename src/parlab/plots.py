"""The course's pictures: every sequence of numbers the chapters measure is drawn with one of these.

- :func:`rank_tensors`   every rank's tensor before and after a collective (chapter 02)
- :func:`memory_bars`    stacked bytes per component (params, grads, DDP buckets, optimizer, activations) per bar
                         (chapter 01; ZeRO stages in 04)
- :func:`gantt`          per-rank timeline of compute / comm / idle events (chapters 02, 03, 06)
- :func:`bandwidth`      time, algbw and busbw against message size, with an α-β fit (chapter 02)
- :func:`pipeline`       a pipeline's forwards and backwards per rank, idle time, activations held (chapter 06)
- :func:`comm_bytes`     bytes per rank, one segment per op (chapter 03: DataParallel vs DDP)
- :func:`matmul_split`   a matrix product split by columns and by rows over the ranks (chapter 05)
- :func:`mesh`           which rank sits where on a mesh, and which ranks talk on each axis (chapter 07)

Each returns the matplotlib ``Figure``; end the notebook line with ``;`` so it is drawn once.
``memory_bars(..., pyplot=False)`` makes a plain ``Figure`` that pyplot never sees: a widget callback,
which JupyterLab's kernel subshells run on another thread than the cells, draws that way.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

KIND_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "idle": "#D9D9D9"}
MEMORY_COLORS = {"params": "#4C72B0", "grads": "#55A868", "buckets": "#8DCB9B", "optimizer": "#C44E52",
                 "activations": "#8172B3"}


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


def memory_bars(breakdowns: dict, title: str = "", unit: float = 1e9, unit_name: str = "GB",
                limit: float | None = None, limit_label: str = "GPU memory", ymax: float | None = None,
                pyplot: bool = True):
    """Stacked bars, one per label: ``breakdowns = {label: {"params": bytes, "grads": …}}`` (or objects
    with ``as_dict()``). ``limit``: bytes, drawn as a dashed line (a GPU's memory). ``ymax``: bytes; taller
    bars are cut there and marked with their total and an arrow, so that small bars stay readable.
    ``pyplot=False``: a plain ``Figure``, outside pyplot's open figures (safe off the main thread)."""
    labels = list(breakdowns)
    figsize = (min(13, max(4.5, 1.0 * len(labels) + 2.5)), 4.2)
    # pyplot's list of open figures is global: the inline backend shows and closes all of them after
    # each cell, from the main thread, even one another thread is still drawing
    fig = plt.figure(figsize=figsize) if pyplot else Figure(figsize=figsize)
    ax = fig.subplots()
    bottom = np.zeros(len(labels))
    for part, color in MEMORY_COLORS.items():
        heights = np.array([_get(breakdowns[k], part) / unit for k in labels])
        if heights.any():
            ax.bar(labels, heights, bottom=bottom, color=color, label=part)
            bottom += heights
    top = (ymax / unit) if ymax else max(bottom.max(), (limit or 0) / unit) * 1.15 or 1
    for x, total in enumerate(bottom):
        text = f"{total:,.0f}" if total >= 100 else f"{total:.3g}"
        if total > top:
            ax.text(x, top * 0.97, f"{text} ↑", ha="center", va="top", fontsize=9, color="white",
                    fontweight="bold")
        else:
            ax.text(x, total, text, ha="center", va="bottom", fontsize=9)
    if limit:
        ax.axhline(limit / unit, color="black", linestyle="--", linewidth=1)
        ax.text(-0.45, limit / unit, f"{limit_label}", va="bottom", ha="left", fontsize=9,
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.set_ylabel(f"{unit_name} per rank")
    ax.set_ylim(0, top)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(title)
    if len(labels) > 4:
        plt.setp(ax.get_xticklabels(), rotation=25, ha="right", rotation_mode="anchor")
    fig.tight_layout()
    return fig


def _get(breakdown, part):
    d = breakdown.as_dict() if hasattr(breakdown, "as_dict") else breakdown
    return d.get(part, 0) or 0


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


def bandwidth(curves: dict, fit: dict | None = None, title: str = "", spread: dict | None = None):
    """Left: time against size (log-log) with the α-β fit; right: algbw and busbw against size.

    curves: ``{label: [BandwidthPoint, …]}``. fit: ``{label: (alpha, beta)}`` from ``fit_alpha_beta``.
    spread: ``{label: [(fastest, slowest) seconds, …]}``, one pair per point: drawn as a bar through the
    dot, the range of the rounds (on shared CPU cores, what scheduling does to one size).
    """
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(11, 5))
    for i, (label, points) in enumerate(curves.items()):
        color = f"C{i}"
        m = np.array([p.bytes for p in points], dtype=float)
        ax_t.loglog(m, [p.seconds * 1e6 for p in points], "o", color=color, label=f"{label} measured")
        if spread and label in spread:
            t = np.array([p.seconds for p in points])
            lo, hi = (np.array(v) for v in zip(*spread[label]))
            ax_t.errorbar(m, t * 1e6, yerr=[(t - lo) * 1e6, (hi - t) * 1e6], fmt="none", ecolor=color,
                          elinewidth=1, capsize=2)
        if fit and label in fit:
            alpha, beta = fit[label]
            grid = np.geomspace(m.min(), m.max(), 100)
            ax_t.loglog(grid, (alpha + beta * grid) * 1e6, "-", color=color,
                        label=f"{label}: α = {alpha * 1e6:.0f} µs, 1/β = {1 / beta / 1e9:.2f} GB/s"
                        if beta else f"{label}: α = {alpha * 1e6:.0f} µs")
        ax_bw.semilogx(m, [p.algbw / 1e9 for p in points], "o--", color=color, label=f"{label} algbw")
        ax_bw.semilogx(m, [p.busbw / 1e9 for p in points], "s-", color=color, label=f"{label} busbw")
    ax_t.set_xlabel("message size (bytes)")
    ax_t.set_ylabel("time per call (µs)")
    ax_t.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    ax_t.set_title("time: α + m·β")
    ax_bw.set_xlabel("message size (bytes)")
    ax_bw.set_ylabel("GB/s")
    ax_bw.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    ax_bw.set_title("bandwidth (nccl-tests convention)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


#: Pipeline operations (chapter 06): forward blue, backward green; a split backward's input half (I) light
#: green and its weight half (W) teal, so that a zero-bubble schedule shows where W work fills the bubble.
PIPELINE_COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#8BC995", "W": "#2A9D8F"}


def pipeline(events, title: str = "", unit: float = 1e-3, unit_name: str = "ms", memory: dict | None = None,
             memory_label: str = "activations held", ax=None):
    """A pipeline's timeline: one row per rank, one box per operation (``F3``, ``B3``, ``I3``, ``W3``; the
    boxes of a rank's later stages, ``F3s5``, in lighter shades), idle time grey. Works for recorded and
    simulated events alike (``parlab.parallel.pipeline_schedule.simulate``). ``memory``: rank → list of
    ``(time, value)``, drawn as a step line per rank in a second panel. Drawn on a plain ``Figure``, not
    through pyplot, so that a widget may call it from any thread (chapter 06)."""
    from matplotlib.figure import Figure

    from parlab.parallel.pipeline_schedule import Op

    events = [e for e in events if e.kind == "compute"]
    if not events:
        raise ValueError("pipeline() needs a timeline with compute events")
    ranks = sorted({e.rank for e in events})
    t0 = min(e.start for e in events)
    t1 = max(e.end for e in events)
    if ax is None:
        rows = 2 if memory else 1
        fig = Figure(figsize=(10, 0.55 * len(ranks) + 1.3 + (1.8 if memory else 0)))
        axes = fig.subplots(rows, 1, sharex=True, gridspec_kw={"height_ratios": [len(ranks) + 1, 3][:rows]},
                            squeeze=False)[:, 0]
        ax = axes[0]
    else:
        fig, axes = ax.figure, [ax]
    ops = [(e, Op.parse(e.name, stage=e.rank)) for e in events]
    stages = {r: sorted({op.stage for e, op in ops if e.rank == r}) for r in ranks}
    for y, r in enumerate(ranks):
        ax.barh(y, (t1 - t0) / unit, left=0, height=0.8, color=KIND_COLORS["idle"], linewidth=0)
    for e, op in ops:
        y = ranks.index(e.rank)
        chunk = stages[e.rank].index(op.stage)
        color = _lighter(PIPELINE_COLORS[op.kind], 0.45 * chunk / max(1, len(stages[e.rank]) - 1))
        ax.barh(y, e.seconds / unit, left=(e.start - t0) / unit, height=0.8, color=color, edgecolor="white",
                linewidth=0.6)
        width = e.seconds / (t1 - t0)
        text = f"{op.kind}{op.micro_batch}" if width > 0.028 else (str(op.micro_batch) if width > 0.012 else "")
        ax.text((e.start - t0 + e.seconds / 2) / unit, y, text, ha="center", va="center", color="white", fontsize=7)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlim(0, (t1 - t0) / unit)
    kinds = [k for k in PIPELINE_COLORS if any(op.kind == k for _, op in ops)]
    handles = [Rectangle((0, 0), 1, 1, color=PIPELINE_COLORS[k]) for k in kinds] + [
        Rectangle((0, 0), 1, 1, color=KIND_COLORS["idle"])]
    names = {"F": "forward", "B": "backward", "I": "backward: input grad", "W": "backward: weight grad"}
    ax.legend(handles, [names[k] for k in kinds] + ["idle"], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              frameon=False, fontsize=8)
    ax.set_title(title, fontsize=10)
    if memory:
        mem_ax = axes[1]
        for r in ranks:
            points = memory.get(r, [])
            if points:
                mem_ax.step([(t - t0) / unit for t, _ in points], [v for _, v in points], where="post",
                            label=f"rank {r}")
        mem_ax.set_ylabel(memory_label, fontsize=8)
        mem_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
        mem_ax.set_ylim(bottom=0)
    axes[-1].set_xlabel(f"time ({unit_name})")
    fig.tight_layout()
    return fig


def _lighter(color: str, amount: float) -> tuple:
    """``color`` blended towards white by ``amount`` (0: unchanged, 1: white)."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(color))


def matmul_split(tp_size: int, title: str = ""):
    """Y = X·A split over ``tp_size`` ranks two ways, one colour per rank (chapter 05).

    Top, by columns: every rank holds all of X and its columns of A, and computes its columns of Y.
    Bottom, by rows: rank r holds X's columns r and A's rows r, and computes a whole-sized partial Y_r;
    Y is their sum (an all-reduce).
    """
    t = tp_size
    colors = [plt.get_cmap("tab10")(r % 10) for r in range(t)]
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


def comm_bytes(records_by_rank, title: str = "", unit: float = 1024, unit_name: str = "KiB", ax=None):
    """Horizontal stacked bars, one per rank: the bytes of each op it took part in (the nccl-tests size of
    :class:`parlab.measure.CommRecord`), one segment per op and label (chapter 03: DataParallel's
    exchanges). ``records_by_rank``: what the ranks returned, a list of record lists indexed by rank."""
    records_by_rank = [list(r) for r in records_by_rank]
    keys: list[str] = []
    for records in records_by_rank:
        for r in records:
            key = r.op if r.label is None else f"{r.op} {r.label}"
            if key not in keys:
                keys.append(key)
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.55 * len(records_by_rank) + 1.6))
    else:
        fig = ax.figure
    left = np.zeros(len(records_by_rank))
    colors = plt.get_cmap("tab10")
    for k, key in enumerate(keys):
        widths = np.array([sum(r.bytes for r in records if (r.op if r.label is None else f"{r.op} {r.label}") == key)
                           for records in records_by_rank]) / unit
        ax.barh(range(len(records_by_rank)), widths, left=left, color=colors(k % 10), label=key)
        left += widths
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:,.0f}", va="center", fontsize=8)
    ax.set_yticks(range(len(records_by_rank)), [f"rank {r}" for r in range(len(records_by_rank))])
    if not ax.yaxis_inverted():
        ax.invert_yaxis()
    ax.set_xlabel(f"{unit_name} per op (nccl-tests size)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


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
        boxes(ax, {r: _lighter(c, 0.45) for r, c in colors.items()}, labels=False)
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
