"""How much of the machine a step used: :func:`flops_and_time` (chapter 09, section 5).

Left, the step's FLOPs as ``torch.utils.flop_counter.FlopCounterMode`` counted them, forward and backward on
their own bars, each split into the products with the weights and attention's own products (eager attention
runs them as ``bmm``; every other product multiplies by a weight). The backward bar is twice the forward: a
product for the input's gradient and one for the weight's. Right, the step's time: the part the FLOPs would
take at the peak, and the rest. MFU is the first over the whole.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from parlab.lab.plots.colors import KIND_COLORS, lighter

PART_COLORS = {"weights": "#4C72B0", "attention": "#8172B3"}


def _parts(per_op: dict) -> dict:
    """``{"aten.mm": flops, ...}`` → ``{"weights": ..., "attention": ...}``."""
    attention = sum(v for op, v in per_op.items() if "bmm" in str(op))
    return {"weights": sum(per_op.values()) - attention, "attention": attention}


def flops_and_time(forward, backward, step_seconds: float, peak_flops: float, title: str = ""):
    """``forward``, ``backward``: the ``FlopCounterMode`` each pass ran under (or its
    ``get_flop_counts()["Global"]``, ``{"aten.mm": flops, ...}``); ``step_seconds``: the step's measured time;
    ``peak_flops``: FLOP/s."""
    if step_seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"step_seconds and peak_flops must be positive; got {step_seconds}, {peak_flops}")
    counts = {phase: c if isinstance(c, dict) else c.get_flop_counts()["Global"]
              for phase, c in (("forward", forward), ("backward", backward))}
    parts = {phase: _parts(counts[phase]) for phase in ("forward", "backward")}
    total = sum(sum(p.values()) for p in parts.values())
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 2.9), gridspec_kw={"width_ratios": [3, 2]})
    for y, phase in enumerate(("backward", "forward")):
        start = 0.0
        for part, flops in parts[phase].items():
            mflop = flops / 1e6
            left.barh(y, mflop, left=start, color=PART_COLORS[part], edgecolor="white",
                      label=("products with the weights" if part == "weights" else "attention's own products")
                      if y == 0 else None)
            if flops:
                left.text(start + mflop / 2, y, f"{mflop:.1f}", color="white", ha="center", va="center", fontsize=8)
            start += mflop
        left.text(start, y, f"  {phase}: {start:.1f} MFLOP", va="center", fontsize=9)
    left.set_yticks([0, 1], ["backward", "forward"])
    left.set_xlim(0, 1.6 * sum(parts["backward"].values()) / 1e6)
    left.set_xlabel("MFLOP in one step (FlopCounterMode)")
    left.legend(loc="upper right", frameon=False, fontsize=8)

    at_peak = total / peak_flops
    rest = max(0.0, step_seconds - at_peak)
    right.barh(0, at_peak * 1e3, color=KIND_COLORS["compute"], label=f"the FLOPs at peak: {at_peak * 1e3:.2f} ms")
    right.barh(0, rest * 1e3, left=at_peak * 1e3, color=lighter(KIND_COLORS["idle"], 0.2),
               label=f"the rest: {rest * 1e3:.2f} ms")
    right.set_yticks([0], ["step"])
    right.set_ylim(-0.6, 1.2)
    right.set_xlabel("ms")
    right.set_title(f"MFU = {at_peak * 1e3:.2f} / {step_seconds * 1e3:.2f} ms = {at_peak / step_seconds:.1%}",
                    fontsize=10)
    right.legend(loc="upper left", frameon=False, fontsize=8)
    for ax in (left, right):
        for spine in ("top", "right"):
            ax.spines[spine].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
