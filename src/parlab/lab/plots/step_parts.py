"""A cost model's step, taken apart, beside the published step it prices: :func:`step_parts`.

Each row is one published run: the predicted step as stacked parts (compute, the pipeline's bubble, the
tensor-, pipeline- and data-parallel collectives), each as a share of the published step, so a row ending
at 1 is exact; a cross marks a trivial model's prediction; a grey band is ±20 %.
"""

from __future__ import annotations

from matplotlib.figure import Figure

PART_COLORS = {"compute": "#4C72B0", "bubble": "#CCB974", "tp": "#C44E52", "pp": "#8172B3", "dp": "#55A868"}


def step_parts(rows, groups=(), title: str = "", band: float = 0.2) -> Figure:
    """``rows``: ``(label, parts, published_s, trivial_s)`` each, ``parts`` the predicted seconds by part
    (:data:`PART_COLORS`' keys; others ignored). ``groups``: the number of rows in each group, in order: a
    dotted line between groups."""
    fig = Figure(figsize=(9, 0.19 * len(rows) + 1.4))
    ax = fig.subplots()
    for i, (label, parts, published, trivial) in enumerate(rows):
        left = 0.0
        for part, color in PART_COLORS.items():
            share = parts.get(part, 0.0) / published
            ax.barh(i, share, left=left, color=color, label=part if i == 0 else None)
            left += share
        ax.plot(trivial / published, i, "kx", ms=8, label="trivial model" if i == 0 else None)
    ax.axvline(1, color="k", lw=0.8)
    ax.axvspan(1 - band, 1 + band, color="grey", alpha=0.15, label=f"±{band:.0%}", zorder=0)
    edge = 0
    for size in list(groups)[:-1]:
        edge += size
        ax.axhline(edge - 0.5, color="k", lw=0.5, ls=":")
    ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted step time ÷ published, by part", fontsize=9)
    ax.legend(fontsize=7, ncol=7, loc="lower center", bbox_to_anchor=(0.45, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=10, pad=22)
    fig.tight_layout()
    return fig
