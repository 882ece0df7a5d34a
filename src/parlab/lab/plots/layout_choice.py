"""A choice of layout drawn as the decision it is: :func:`decision`.

Every layout a cluster allows, priced: memory per GPU across, step time up. The GPU's memory is a wall:
what lies right of it does not fit. Of those that fit, the layouts the guide's rules allow (TP inside a
node) are filled; the guide's pick and the planner's fastest are named. Nothing here imports the planner:
the predictions are passed in (any objects with ``.layout``, ``.memory.total`` and ``.step_s``).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

FITS, NO_FIT, MARKS = "#4C72B0", "#bbbbbb", ("#DD8452", "#55A868", "#C44E52", "#8172B3")


def decision(predictions, gpu_memory: float, marks: dict | None = None, gpus_per_node: int | None = None,
             title: str = "", fig: Figure | None = None) -> Figure:
    """``predictions``: every layout priced. ``marks``: ``{label: prediction}`` to name (the guide's pick,
    the planner's fastest), drawn as stars. ``gpus_per_node``: layouts whose TP spans nodes are drawn hollow."""
    fig = fig or Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    fastest = min(p.step_s for p in predictions)
    top = min(max(p.step_s for p in predictions), 2.5 * fastest) * 1.04  # slower than 2.5× the fastest: off the top
    for p in predictions:
        fits = p.memory.total <= gpu_memory
        inside = gpus_per_node is None or p.layout.tp <= gpus_per_node
        ax.plot(p.memory.total / 1e9, p.step_s, "o", ms=4, mec=FITS if fits else NO_FIT,
                mfc=(FITS if fits else NO_FIT) if inside else "none", alpha=0.9)
    ax.axvline(gpu_memory / 1e9, color="k", lw=1, ls="--")
    ax.text(gpu_memory / 1e9, top, "fits ← GPU memory ", fontsize=7, va="top", ha="right")
    ax.text(gpu_memory / 1e9, top, " → does not fit", fontsize=7, va="top", ha="left", color="#888888")
    for i, (label, p) in enumerate((marks or {}).items()):
        ax.plot(p.memory.total / 1e9, p.step_s, "*", ms=15 - 4 * i, color=MARKS[i % 4], mec="k", mew=0.6,
                zorder=5 + i, label=f"{label}: {p.layout}, {p.step_s:.3g} s")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.set_ylim(0.97 * fastest, top)
    ax.set_xlim(right=max(ax.get_xlim()[1], 2 * gpu_memory / 1e9))  # room for "does not fit"
    ax.set_xlabel("GB per GPU (weights, gradients, optimizer, activations; log scale)", fontsize=8)
    ax.set_ylabel(f"predicted s per step (up to {top / fastest:.1f}× the fastest)", fontsize=8)
    ax.tick_params(labelsize=7, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False,
              title="filled: fits, TP inside a node; hollow: TP across nodes; grey: does not fit", title_fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
