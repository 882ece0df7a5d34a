"""A pipeline's schedule drawn: its forwards and backwards per rank, idle time, activations held (chapter 06).
"""

from __future__ import annotations

from matplotlib.patches import Rectangle

from parlab.lab.plots.colors import KIND_COLORS, PIPELINE_COLORS, lighter


def pipeline(events, title: str = "", unit: float = 1e-3, unit_name: str = "ms", memory: dict | None = None,
             memory_label: str = "activations held", ax=None):
    """A pipeline's timeline: one row per rank, one box per operation (``F3``, ``B3``, ``I3``, ``W3``; the
    boxes of a rank's later stages, ``F3s5``, in lighter shades), idle time grey. Works for recorded and
    simulated events alike (``parlab.lab.parallel.pipeline_schedule.simulate``). ``memory``: rank → list of
    ``(time, value)``, drawn as a step line per rank in a second panel. Drawn on a plain ``Figure``, not
    through pyplot, so that a widget may call it from any thread (chapter 06)."""
    from matplotlib.figure import Figure

    from parlab.lab.parallel.pipeline_schedule import Op

    events = [e for e in events if e.kind == "compute"]
    if not events:
        raise ValueError("pipeline() needs a timeline with compute events")
    ranks = sorted({e.rank for e in events})
    t0 = min(e.start for e in events)
    t1 = max(e.end for e in events)
    if ax is None:
        rows = 2 if memory else 1
        fig = Figure(figsize=(10, 0.55 * len(ranks) + 1.3 + (1.8 if memory else 0)))
        axes = fig.subplots(rows, 1, sharex=True, gridspec_kw={"height_ratios": [len(ranks) + 1, 3][:rows]},
                            squeeze=False)[:, 0]
        ax = axes[0]
    else:
        fig, axes = ax.figure, [ax]
    ops = [(e, Op.parse(e.name, stage=e.rank)) for e in events]
    stages = {r: sorted({op.stage for e, op in ops if e.rank == r}) for r in ranks}
    for y, r in enumerate(ranks):
        ax.barh(y, (t1 - t0) / unit, left=0, height=0.8, color=KIND_COLORS["idle"], linewidth=0)
    for e, op in ops:
        y = ranks.index(e.rank)
        chunk = stages[e.rank].index(op.stage)
        color = lighter(PIPELINE_COLORS[op.kind], 0.45 * chunk / max(1, len(stages[e.rank]) - 1))
        ax.barh(y, e.seconds / unit, left=(e.start - t0) / unit, height=0.8, color=color, edgecolor="white",
                linewidth=0.6)
        width = e.seconds / (t1 - t0)
        text = f"{op.kind}{op.micro_batch}" if width > 0.028 else (str(op.micro_batch) if width > 0.012 else "")
        ax.text((e.start - t0 + e.seconds / 2) / unit, y, text, ha="center", va="center", color="white", fontsize=7)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlim(0, (t1 - t0) / unit)
    kinds = [k for k in PIPELINE_COLORS if any(op.kind == k for _, op in ops)]
    handles = [Rectangle((0, 0), 1, 1, color=PIPELINE_COLORS[k]) for k in kinds] + [
        Rectangle((0, 0), 1, 1, color=KIND_COLORS["idle"])]
    names = {"F": "forward", "B": "backward", "I": "backward: input grad", "W": "backward: weight grad"}
    ax.legend(handles, [names[k] for k in kinds] + ["idle"], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              frameon=False, fontsize=8)
    ax.set_title(title, fontsize=10)
    if memory:
        _memory_panel(axes[1], memory, ranks, t0, unit, memory_label)
    axes[-1].set_xlabel(f"time ({unit_name})")
    fig.tight_layout()
    return fig


def _memory_panel(ax, memory: dict, ranks: list, t0: float, unit: float, label: str) -> None:
    """Each rank's ``memory`` points, ``(time, value)``, as a step line from the timeline's start."""
    for r in ranks:
        points = memory.get(r, [])
        if points:
            ax.step([(t - t0) / unit for t, _ in points], [v for _, v in points], where="post", label=f"rank {r}")
    ax.set_ylabel(label, fontsize=8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_ylim(bottom=0)
