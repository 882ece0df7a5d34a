"""Memory as stacked bars: bytes per component (params, grads, DDP buckets, optimizer, activations) per
bar (chapter 01; ZeRO's stages in 04).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from parlab.lab.plots.colors import MEMORY_COLORS


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
