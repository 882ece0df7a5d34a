"""Each rank's collectives in the order it issued them, as a flight recorder keeps them, and where they diverge.

- :func:`records` draws one row per rank, one box per record (its sequence number, op, elements and what it
  carried), coloured by what it carried. The first sequence number at which the ranks' records differ is
  framed in red: there one rank took another path. A rank's row ends where its record ends (the process
  aborted, or was stopped); that end does not name the culprit.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch, Rectangle


WHAT_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860")


def records(per_rank: list[list[dict]], diverge: int | None, ends: dict | None = None, title: str = ""):
    """``per_rank[r]``: rank r's records (dicts with ``seq``, ``op``, ``numel``, ``what``); ``diverge``: the
    first differing sequence number (None: none); ``ends``: a note per rank drawn after its last record."""
    whats = sorted({r["what"] for rank in per_rank for r in rank})
    colors = {w: WHAT_COLORS[i % len(WHAT_COLORS)] for i, w in enumerate(whats)}
    n, longest = len(per_rank), max([len(r) for r in per_rank] + [1])
    fig, ax = plt.subplots(figsize=(max(6.5, 1.9 * (longest + 1.3)), 0.9 * n + 1.5))
    for rank, recs in enumerate(per_rank):
        for rec in recs:
            ax.add_patch(FancyBboxPatch((rec["seq"] + 0.06, rank - 0.32), 0.88, 0.64, boxstyle="round,pad=0.02",
                                        facecolor=colors[rec["what"]], edgecolor="none"))
            ax.text(rec["seq"] + 0.5, rank, f"#{rec['seq']} {rec['op']}\n{rec['numel']} el. · {rec['what']}",
                    ha="center", va="center", fontsize=7.5, color="white")
        if ends and rank in ends:
            ax.text(len(recs) + 0.1, rank, ends[rank], ha="left", va="center", fontsize=8, color="#555555",
                    style="italic")
    if diverge is not None:
        ax.add_patch(Rectangle((diverge, -0.45), 1, n - 0.1, fill=False, edgecolor="#b00000", lw=2))
        ax.text(diverge + 0.5, n - 0.35, "the records diverge here", ha="center", va="center", fontsize=9,
                color="#b00000")
    ax.legend([Rectangle((0, 0), 1, 1, color=colors[w]) for w in whats], whats, loc="upper left", ncol=len(whats),
              frameon=False, fontsize=8, bbox_to_anchor=(0, 1.02))
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.set_xticks([])
    ax.set_xlim(0, longest + 1.3)
    ax.set_ylim(n - 0.2, -0.9)
    ax.set_xlabel("the collectives each rank issued, in order (a flight recorder's records)")
    for spine in ("top", "right", "bottom"):
        ax.spines[spine].set_visible(False)
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


