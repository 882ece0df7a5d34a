"""Ranks as processes: who starts them, the device and backend each gets, and who waits in a hang.

- :func:`world`  the launcher, the ``world_size`` processes it starts (one rank each) and the device each
                 computes on, from the course's one device decision (``parlab.lab.runtime.choose``); with
                 each rank's value, or the environment ``torchrun`` gives it (chapter 00)
- :func:`hang`   a collective that cannot complete, per rank: who waited in it until the timeout and who
                 had returned without joining, drawn from the launcher's hang report (chapter 00)
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch, Rectangle

from parlab.lab.plots.colors import KIND_COLORS, lighter, rank_color


def devices(world_size: int, gpus: int | None = None) -> tuple[str, list[str], str]:
    """(backend, the device of each rank, a note) as ``parlab.launch`` and ``torchrun`` on this machine
    choose them: ``runtime.choose`` for every local rank, with the GPUs a launch may use (``gpus``)."""
    from parlab.lab.launch.plan import visible_gpus
    from parlab.lab.runtime import choose

    gpus = visible_gpus() if gpus is None else gpus
    modes = [choose(world_size, r, gpus) for r in range(world_size)]
    return modes[0].name, [str(m.device) for m in modes], modes[0].note


def world(world_size: int, values=None, launcher: str = "parlab.launch", env: bool = False,
          gpus: int | None = None, title: str = ""):
    """The launcher on top, one box per process below it (its rank, its device, and ``values[r]`` or the
    variables ``torchrun`` sets when ``env``), inside a frame: the world, with its backend."""
    backend, where, note = devices(world_size, gpus)
    n = world_size
    w, gap, h = 1.7, 0.3, 1.45 + 0.35 * env
    width = n * w + (n - 1) * gap
    fig, ax = plt.subplots(figsize=(max(6.5, 1.5 + 1.55 * n), 3.6 + 0.3 * env))
    top = h + 1.25
    box = max(3.0, 0.125 * len(launcher) + 0.4)  # wide enough for the command in monospace
    ax.add_patch(FancyBboxPatch((width / 2 - box / 2, top), box, 0.55, boxstyle="round,pad=0.05",
                                facecolor="#eeeeee", edgecolor="k"))
    ax.text(width / 2, top + 0.27, launcher, ha="center", va="center", fontsize=10, family="monospace")
    for r in range(n):
        x = r * (w + gap)
        ax.annotate("", xy=(x + w / 2, h + 0.05), xytext=(width / 2, top - 0.05),
                    arrowprops=dict(arrowstyle="->", color="#555555", lw=1))
        ax.add_patch(FancyBboxPatch((x, 0), w, h, boxstyle="round,pad=0.04", facecolor=lighter(rank_color(r), 0.6),
                                    edgecolor=rank_color(r), lw=1.5))
        lines = [f"device {where[r]}"]
        if env:
            lines += [f"RANK={r}", f"LOCAL_RANK={r}", f"WORLD_SIZE={n}"]
        if values is not None:
            lines.append(f"value {values[r]:g}")
        ax.text(x + w / 2, h - 0.22, f"rank {r}", ha="center", va="center", fontsize=11, weight="bold")
        ax.text(x + w / 2, h - 0.45, "a process", ha="center", va="center", fontsize=8, style="italic")
        for i, line in enumerate(lines):
            ax.text(x + w / 2, h - 0.75 - 0.3 * i, line, ha="center", va="center", fontsize=9)
    ax.add_patch(FancyBboxPatch((-0.2, -0.95), width + 0.4, h + 1.15, boxstyle="round,pad=0.05", fill=False,
                                edgecolor="#444444", lw=1.2, linestyle="--"))
    ax.text(width / 2, -0.5, f"the world: world_size = {n}\ncollectives over backend {backend}",
            ha="center", va="center", fontsize=10)
    if note:
        ax.text(width / 2, -1.3, note, ha="center", va="center", fontsize=8, color="#8a4b00")
    ax.set_xlim(min(-0.4, width / 2 - box / 2 - 0.2), max(width + 0.4, width / 2 + box / 2 + 0.2))
    ax.set_ylim(-1.5, top + 0.75)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def hang(report, title: str = ""):
    """One lane per rank of a hang report (a ``RankTimeoutError``): its function running, then either a
    wait in the collective until ``timeout`` (the ranks in ``report.waited``) or a return that never joined
    it (``report.returned``); ranks busy outside any collective (``report.busy``) run on to the timeout."""
    n, timeout = report.world_size, float(report.timeout)
    run = min(0.08 * timeout, 0.5)  # the function's own work before the collective: drawn, not measured
    fig, ax = plt.subplots(figsize=(8, 0.55 * n + 1.4))
    for r in range(n):
        ax.add_patch(Rectangle((0, r - 0.3), run, 0.6, color=KIND_COLORS["compute"]))
        if r in report.waited:
            ax.add_patch(Rectangle((run, r - 0.3), timeout - run, 0.6, color=KIND_COLORS["comm"]))
            ax.text((run + timeout) / 2, r, "waits in the collective", ha="center", va="center", fontsize=9)
            ax.plot([timeout], [r], marker="X", color="#b00000", markersize=11)
        elif r in report.busy:
            ax.add_patch(Rectangle((run, r - 0.3), timeout - run, 0.6, color=KIND_COLORS["compute"], alpha=0.6))
            ax.text((run + timeout) / 2, r, "busy outside any collective", ha="center", va="center", fontsize=9)
            ax.plot([timeout], [r], marker="X", color="#b00000", markersize=11)
        elif r in report.returned:
            ax.add_patch(Rectangle((run, r - 0.3), timeout - run, 0.6, color=KIND_COLORS["idle"]))
            ax.text(run + 0.05 * timeout, r, "returned without joining", ha="left", va="center", fontsize=9)
    ax.axvline(timeout, color="#b00000", lw=1, linestyle="--")
    ax.text(timeout, -0.75, f" timeout = {timeout:g} s: parlab stops every rank (✕)", color="#b00000",
            ha="right", va="center", fontsize=9)
    kinds = [("its own work", KIND_COLORS["compute"]), ("waiting in the collective", KIND_COLORS["comm"]),
             ("returned", KIND_COLORS["idle"])]
    ax.legend([Rectangle((0, 0), 1, 1, color=c) for _, c in kinds], [k for k, _ in kinds], loc="upper left",
              ncol=3, frameon=False, fontsize=8)
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.set_ylim(n - 0.4, -1.05)
    ax.set_xlim(0, timeout * 1.03)
    ax.set_xlabel("seconds since the launch (the function's own work is drawn, not timed)")
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig
