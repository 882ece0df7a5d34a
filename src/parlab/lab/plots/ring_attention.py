"""Ring attention drawn step by step, from the sequence's layout and the ring's own rule (chapter 10).

:func:`ring_attention_states` plays the ring on token positions: at step s rank r holds the K/V block of
rank ``ring_source(r, s, cp)`` (:func:`parlab.lab.parallel.context.ring_source`, the rule ``ring_attention``
follows) and scores its own queries against it. Cell (query i, key j) of the result is the step at which
that pair was computed (``PENDING`` before, ``HIDDEN`` where the causal mask hides it).
:func:`ring_attention_frame` draws one step: left, each rank's queries and the K/V block it holds, with
the arrow to the next rank; right, the whole sequence's score matrix, each computed pair in its query's
rank colour (this step dark, earlier steps light). :func:`ring_attention_steps` hands every frame to
:func:`parlab.lab.plots.step_through`.
"""

from __future__ import annotations

import numpy as np
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from parlab.lab.parallel.context import Layout, ring_source
from parlab.lab.plots.colors import lighter, rank_color
from parlab.lab.plots.steps import step_through

PENDING, HIDDEN = -1, -2


def ring_attention_states(layout: Layout, causal: bool = True) -> np.ndarray:
    """(seq_len, seq_len) ints: the ring step at which each (query, key) pair is scored."""
    grid = np.full((layout.seq_len, layout.seq_len), PENDING)
    for step in range(layout.cp):
        for r in range(layout.cp):
            q, k = layout.positions(r).numpy(), layout.positions(ring_source(r, step, layout.cp)).numpy()
            grid[np.ix_(q, k)] = step
    if causal:
        grid[np.triu_indices(layout.seq_len, 1)] = HIDDEN
    return grid


def owners(layout: Layout) -> np.ndarray:
    """(seq_len,): the rank holding each position."""
    out = np.empty(layout.seq_len, dtype=int)
    for r in range(layout.cp):
        out[layout.positions(r).numpy()] = r
    return out


def spans(positions) -> str:
    """Positions as runs: [0, 1, 2, 7, 8] -> "0–2, 7–8"."""
    pos, runs = [int(p) for p in positions], []
    for p in pos:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in runs)


def _ring_panel(ax, layout: Layout, step: int) -> None:
    cp = layout.cp
    for r in range(cp):
        y = cp - 1 - r
        src = ring_source(r, step, cp)
        ax.add_patch(Rectangle((0, y + 0.1), 1.6, 0.8, facecolor=lighter(rank_color(r), 0.55), edgecolor="#333"))
        ax.text(0.8, y + 0.64, f"rank {r}", ha="center", va="center", fontsize=10, weight="bold")
        ax.text(0.8, y + 0.32, f"queries {spans(layout.positions(r))}", ha="center", va="center", fontsize=9)
        ax.add_patch(Rectangle((1.9, y + 0.1), 1.6, 0.8, facecolor=lighter(rank_color(src), 0.55),
                               edgecolor=rank_color(src), lw=2))
        ax.text(2.7, y + 0.64, f"K/V of rank {src}", ha="center", va="center", fontsize=10)
        ax.text(2.7, y + 0.32, f"keys {spans(layout.positions(src))}", ha="center", va="center", fontsize=9)
        if step + 1 < cp:  # this block goes on to rank r + 1 while the rank computes
            nxt = cp - 1 - (r + 1) % cp
            ax.add_patch(FancyArrowPatch((3.55, y + 0.5), (3.55, nxt + 0.5), arrowstyle="-|>", mutation_scale=10,
                                         color=rank_color(src), lw=1.2,
                                         connectionstyle=f"arc3,rad={-0.5 if nxt < y else 0.25}"))
    note = "then each sends its K/V on to rank r + 1" if step + 1 < cp else "every query has met every key"
    ax.set_title(f"step {step}: rank r holds the K/V of rank (r − {step}) mod {cp}\n{note}", fontsize=9)
    ax.set_xlim(-0.1, 4.6)
    ax.set_ylim(-0.1, cp + 0.05)
    ax.axis("off")


def _score_panel(ax, layout: Layout, step: int, causal: bool) -> None:
    grid, who = ring_attention_states(layout, causal), owners(layout)
    image = np.ones((*grid.shape, 3))
    image[grid == HIDDEN] = 0.88
    for i, j in zip(*np.nonzero((grid >= 0) & (grid <= step))):
        image[i, j] = rank_color(who[i]) if grid[i, j] == step else lighter(rank_color(who[i]), 0.65)
    s = layout.seq_len
    ax.imshow(image, extent=(-0.5, s - 0.5, s - 0.5, -0.5), interpolation="nearest")
    cuts = np.cumsum([len(c) for c in np.array_split(np.arange(s), layout.chunks)])[:-1] - 0.5
    for c in cuts:
        ax.axhline(c, color="white", lw=0.8)
        ax.axvline(c, color="white", lw=0.8)
    ax.set(xlabel="key position", ylabel="query position (colour: its rank)")
    ax.set_title(f"pairs scored: this step dark, earlier light{', grey: causal mask' if causal else ''}",
                 fontsize=9)


def ring_attention_frame(layout: Layout, step: int, causal: bool = True) -> Figure:
    """Step ``step`` (0 … cp − 1) of ring attention over ``layout``: the blocks each rank holds, and the
    pairs of the whole score matrix computed so far."""
    if not 0 <= step < layout.cp:
        raise ValueError(f"step={step} is outside the ring's steps 0..{layout.cp - 1}")
    fig = Figure(figsize=(10.5, max(3.4, 0.85 * layout.cp + 1.2)))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
    _ring_panel(left, layout, step)
    _score_panel(right, layout, step, causal)
    fig.tight_layout()
    return fig


def ring_attention_steps(layout: Layout, causal: bool = True, start: int = 0) -> None:
    """Every step of ring attention over ``layout``, one frame each, with a slider (chapter 10)."""
    step_through(lambda i: ring_attention_frame(layout, i, causal), [f"step {i}" for i in range(layout.cp)],
                 "ring step", start)


def pairs_per_step(counted: dict) -> Figure:
    """One heat map per layout (``counted``: its name → [rank][step], the pairs each rank scored at each
    ring step, as the ranks counted them): rows ranks, columns steps; the title gives busiest / mean."""
    from parlab.lab.parallel.context import imbalance

    top = max(max(map(max, c)) for c in counted.values())
    fig = plt.figure(figsize=(5.5 * len(counted), 3.2))
    for ax, (name, c) in zip(fig.subplots(1, len(counted), squeeze=False)[0], counted.items()):
        a = np.array(c)
        ax.imshow(a, cmap="viridis", vmin=0, vmax=top)
        ax.set(title=f"{name}: busiest / mean = {imbalance(c):.2f}", xlabel="ring step", ylabel="rank",
               xticks=range(a.shape[1]), yticks=range(a.shape[0]))
        for (r, i), n in np.ndenumerate(a):
            ax.text(i, r, str(n), ha="center", va="center", color="w")
    fig.tight_layout()
    return fig


def ring_step_times(chunks, steps, n_star: float, marks: dict | None = None, title: str = "") -> Figure:
    """The α-β model of one ring step against tokens per rank: compute (∝ n²), the K/V transfer (∝ n) and
    what is exposed, from ``steps`` (``context.cp_step`` at each of ``chunks``); n* and ``marks`` (label →
    tokens per rank) as vertical lines."""
    fig = plt.figure(figsize=(7, 3.6))
    ax = fig.subplots()
    ax.loglog(chunks, [s.compute_s * 1e6 for s in steps], label="compute of one block (∝ n²)")
    ax.loglog(chunks, [s.comm_s * 1e6 for s in steps], label="K/V transfer (α + bytes/B, ∝ n)")
    ax.loglog(chunks, [max(s.exposed_s, 1e-12) * 1e6 for s in steps], "k:", label="exposed: transfer − compute")
    ax.axvline(n_star, color="grey", lw=0.8, label=f"n* = {n_star:,.0f}")
    for label, n in (marks or {}).items():
        ax.axvline(n, color="C3", lw=0.8, label=label)
    ax.set(xlabel="tokens per rank n = s / cp", ylabel="µs per ring step", ylim=(1e-1, 1e5), title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
