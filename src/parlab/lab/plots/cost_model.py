"""The α-β cost model of a message, drawn from its formula: :func:`alpha_beta` (chapter 02).

A message of m bytes costs T(m) = α + m·β. Below m* = α/β the fixed cost α rules (the time hardly moves
with size); above it the bytes do (the time doubles with the size). The bandwidth a message achieves,
m / T(m), is half of 1/β at m* and reaches it only for messages well above m*.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


def alpha_beta(alpha: float, beta: float, sizes, title: str = ""):
    """Left: T(m) = α + m·β over ``sizes`` (bytes, log-log) with its two regimes, α and m·β, and where they
    cross, m* = α/β. Right: the bandwidth m / T(m), rising towards 1/β, half of it at m*."""
    m = np.geomspace(min(sizes), max(sizes), 200)
    t = alpha + beta * m
    knee = alpha / beta
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_t.loglog(m, t * 1e6, color="#4C72B0", lw=2.5, label="T(m) = α + m·β")
    ax_t.loglog(m, np.full_like(m, alpha) * 1e6, "--", color="#DD8452", label=f"α = {alpha * 1e6:g} µs: latency rules")
    ax_t.loglog(m, beta * m * 1e6, "--", color="#55A868", label=f"m·β, 1/β = {1 / beta / 1e9:g} GB/s: bytes rule")
    ax_bw.semilogx(m, m / t / 1e9, color="#4C72B0", lw=2.5, label="m / T(m)")
    ax_bw.axhline(1 / beta / 1e9, ls="--", color="#55A868", label="1/β")
    for ax in (ax_t, ax_bw):
        ax.axvline(knee, color="#888888", lw=1)
        ax.set_xlabel("message size m (bytes)")
        ax.legend(fontsize=8, frameon=False, loc="upper left" if ax is ax_t else "lower right")
    ax_t.set_ylim(alpha * 1e6 / 3, t.max() * 1e6 * 2)
    ax_t.text(knee * 1.15, alpha * 1e6 / 2.3, f"m* = α/β = {knee / 1024:,.0f} KiB", fontsize=8)
    ax_t.set_ylabel("time per message (µs)")
    ax_t.set_title("time: flat, then rising with the bytes")
    ax_bw.plot([knee], [0.5 / beta / 1e9], "o", color="#4C72B0")
    ax_bw.text(knee * 1.15, 0.45 / beta / 1e9, "half of 1/β at m*", fontsize=8, va="top")
    ax_bw.set_ylim(0, 1.15 / beta / 1e9)
    ax_bw.set_ylabel("bandwidth achieved (GB/s)")
    ax_bw.set_title("bandwidth: small messages waste the link")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
