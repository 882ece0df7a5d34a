"""Communication drawn: time, algbw and busbw against message size with an α-β fit (chapter 02), and bytes
per rank, one segment per op (chapter 03: DataParallel against DDP).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


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


def comm_bytes(records_by_rank, title: str = "", unit: float = 1024, unit_name: str = "KiB", ax=None):
    """Horizontal stacked bars, one per rank: the bytes of each op it took part in (the nccl-tests size of
    :class:`parlab.lab.measure.CommRecord`), one segment per op and label (chapter 03: DataParallel's
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
