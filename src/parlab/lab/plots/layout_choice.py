"""A choice of layout drawn as the decision it is: :func:`decision`.

Every layout a cluster allows, priced: memory per GPU across, step time up. The GPU's memory is a wall:
what lies right of it does not fit. Of those that fit, the layouts the guide's rules allow (TP inside a
node) are filled; the guide's pick is named. A planner errs: with ``band`` (its error, 0.2 for ±20 %),
the layouts priced within it of the fastest are drawn as tied (:func:`tied`), and a single fastest is
starred only when nothing else lies in the band. Nothing here imports the planner: the predictions are
passed in (any objects with ``.layout``, ``.memory.total`` and ``.step_s``).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

FITS, NO_FIT, MARKS = "#4C72B0", "#bbbbbb", ("#DD8452", "#55A868", "#C44E52", "#8172B3")
TIED = "#2CA02C"


def allowed(p, gpu_memory: float, gpus_per_node: int | None = None) -> bool:
    """Whether the layout priced in ``p`` fits in ``gpu_memory`` and keeps TP inside a node."""
    return p.memory.total <= gpu_memory and (gpus_per_node is None or p.layout.tp <= gpus_per_node)


def tied(predictions, gpu_memory: float, band: float, gpus_per_node: int | None = None) -> list:
    """The layouts that fit with TP inside a node, priced within ``band`` (0.2: 20 %) of the fastest of
    them, fastest first: a planner that errs by ``band`` cannot rank them."""
    if not 0 <= band < 1:
        raise ValueError(f"band={band!r}: the planner's error as a fraction, 0 <= band < 1 (0.2 for ±20 %)")
    ok = sorted((p for p in predictions if allowed(p, gpu_memory, gpus_per_node)), key=lambda p: p.step_s)
    return [p for p in ok if p.step_s <= (1 + band) * ok[0].step_s]


def decision(predictions, gpu_memory: float, marks: dict | None = None, gpus_per_node: int | None = None,
             title: str = "", fig: Figure | None = None, band: float | None = None,
             winner: str = "the planner's fastest") -> Figure:
    """``predictions``: every layout priced. ``marks``: ``{label: prediction}`` to name (the guide's pick),
    drawn as stars. ``gpus_per_node``: layouts whose TP spans nodes are drawn hollow. ``band``: the
    planner's error; the layouts :func:`tied` within it of the fastest are ringed over a shaded band, and
    the fastest is starred, labelled ``winner``, only when it stands alone there."""
    fig = fig or Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    marks = dict(marks or {})
    if band is not None:
        level = tied(predictions, gpu_memory, band, gpus_per_node)
        if len(level) == 1:  # nothing within the planner's error: a winner
            marks[winner] = level[0]
        elif level:
            low = level[0].step_s
            ax.axhspan(low, (1 + band) * low, color=TIED, alpha=0.08, lw=0)
            ax.plot([p.memory.total / 1e9 for p in level], [p.step_s for p in level], "o", ms=9, mfc="none",
                    mec=TIED, mew=1.2, zorder=4, label=f"{len(level)} tied: fit, and priced within {band * 100:.0f} % "
                    f"of the fastest (the planner's error)")
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
    for i, (label, p) in enumerate(marks.items()):
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


def starred(fig: Figure, winner: str = "the planner's fastest") -> bool:
    """Whether ``fig`` (a :func:`decision`) stars one layout as ``winner``: the single fastest, which a
    chapter asserts only when no other layout lies within the planner's error."""
    return any(label.startswith(winner) for ax in fig.axes for label in ax.get_legend_handles_labels()[1])
