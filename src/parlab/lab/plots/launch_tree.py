"""A launch as a tree: the command, the processes it starts, and in each the model as the library wrapped it.

- :func:`launch_trees` draws one tree per launch side by side: the command on top, one box per process
  (its rank and the distributed type accelerate set up), and inside it the wrapper (``DistributedDataParallel``,
  ``FSDPModule``, or the bare model) around the model's blocks, the classes ``model._no_split_modules`` names:
  one FSDP unit each on GPUs. A launch that started fewer processes than its job asked for is drawn with
  the missing ones as dashed, empty boxes (chapter 09's CPU trap).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from parlab.lab.plots.colors import lighter, rank_color


def launch_trees(launches: list[dict], title: str = ""):
    """``launches``: dicts with ``command``, ``asked`` (processes the job asks for) and ``processes``: one dict
    per process started (``rank``, ``type``, ``wrapped``, ``blocks``: the block class of each block)."""
    slots = [max(launch["asked"], len(launch["processes"])) for launch in launches]
    w, gap, pad = 2.3, 0.25, 0.9
    widths = [n * w + (n - 1) * gap for n in slots]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.95 * (sum(widths) + pad * len(widths))), 4.4))
    x0 = 0.0
    for launch, n, width in zip(launches, slots, widths):
        _tree(ax, launch, x0, n, w, gap, width)
        x0 += width + pad
    ax.set_xlim(-0.3, x0 - pad + 0.3)
    ax.set_ylim(-0.7, 4.2)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def _tree(ax, launch, x0, n, w, gap, width):
    top, h = 3.2, 2.55
    ax.add_patch(FancyBboxPatch((x0, top), width, 0.55, boxstyle="round,pad=0.05", facecolor="#eeeeee",
                                edgecolor="k"))
    ax.text(x0 + width / 2, top + 0.27, launch["command"], ha="center", va="center", fontsize=8.5,
            family="monospace")
    started = {p["rank"]: p for p in launch["processes"]}
    for slot in range(n):
        x = x0 + slot * (w + gap)
        p = started.get(slot)
        ax.annotate("", xy=(x + w / 2, h + 0.05), xytext=(x0 + width / 2, top - 0.05),
                    arrowprops=dict(arrowstyle="->", color="#555555" if p else "#bbbbbb", lw=1,
                                    linestyle="-" if p else "--"))
        if p is None:
            ax.add_patch(FancyBboxPatch((x, 0), w, h, boxstyle="round,pad=0.04", fill=False, edgecolor="#b00000",
                                        linestyle="--", lw=1.2))
            ax.text(x + w / 2, h / 2, f"rank {slot}\nasked for,\nnever started", ha="center", va="center",
                    fontsize=9, color="#b00000")
            continue
        _process(ax, p, x, w, h)


def _process(ax, p, x, w, h):
    ax.add_patch(FancyBboxPatch((x, 0), w, h, boxstyle="round,pad=0.04", facecolor=lighter(rank_color(p["rank"]), 0.65),
                                edgecolor=rank_color(p["rank"]), lw=1.5))
    ax.text(x + w / 2, h - 0.2, f"rank {p['rank']} · {p['type']}", ha="center", va="center", fontsize=9.5,
            weight="bold", color="#b00000" if p["type"] == "NO" else "k")
    ax.add_patch(FancyBboxPatch((x + 0.12, 0.12), w - 0.24, h - 0.55, boxstyle="round,pad=0.02", facecolor="white",
                                edgecolor="#555555", lw=1))
    ax.text(x + w / 2, h - 0.6, p["wrapped"], ha="center", va="center", fontsize=8, family="monospace")
    blocks = p["blocks"]
    bh = min(0.4, (h - 1.05) / max(1, len(blocks)))
    for i, name in enumerate(blocks):
        y = h - 0.85 - (i + 1) * bh
        ax.add_patch(FancyBboxPatch((x + 0.3, y + 0.04), w - 0.6, bh - 0.08, boxstyle="round,pad=0.01",
                                    facecolor=lighter(rank_color(p["rank"]), 0.3), edgecolor="none"))
        ax.text(x + w / 2, y + bh / 2, f"{name} {i}", ha="center", va="center", fontsize=7.5, color="white")
