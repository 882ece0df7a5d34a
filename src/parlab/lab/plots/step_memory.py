"""Memory over one training step, per layout, against a device's size.

- :func:`over_a_step` draws, for each layout, what a rank holds between steps (weights, optimizer state,
  DDP's buckets) as a floor, and above it the bytes a step allocates and frees as it runs: the forward's
  activations rising, the backward trading them for gradients, the optimizer's step. A device of
  ``device_bytes`` runs out where a curve crosses its line. The x axis counts the step's allocations and
  releases in order, as a share of them: on shared CPU cores the clock mostly measures waiting, and the
  shape, not the time, is the lesson.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

LAYOUT_COLORS = {"ddp": "#C44E52", "fsdp2": "#4C72B0"}


def over_a_step(measured: dict, device_bytes: float, title: str = ""):
    """``measured[layout]``: ``debug.step_memory``'s result (``between_steps`` and ``curve``: (ms, bytes))."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for layout, m in measured.items():
        curve = m["curve"]
        xs = [i / max(1, len(curve) - 1) for i in range(len(curve))]
        ys = [(m["between_steps"] + b) / 1e6 for _, b in curve]
        color = LAYOUT_COLORS.get(layout, "#555555")
        ax.step(xs, ys, where="post", color=color, lw=1.6, label=f"{layout}: peak {max(ys):.1f} MB")
        ax.axhline(m["between_steps"] / 1e6, color=color, lw=0.8, linestyle=":")
        ax.text(1.01, m["between_steps"] / 1e6, f"{layout}: held between steps", color=color, fontsize=8,
                va="center")
    ax.axhline(device_bytes / 1e6, color="#b00000", lw=1.2, linestyle="--")
    ax.text(1.01, device_bytes / 1e6, f"a {device_bytes / 1e6:.1f} MB device", color="#b00000", fontsize=8,
            va="center")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, None)
    ax.set_xlabel("the step's allocations and releases, in order (forward, backward, optimizer step)")
    ax.set_ylabel("MB on rank 0")
    ax.legend(loc="lower right", frameon=False, fontsize=9)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig
