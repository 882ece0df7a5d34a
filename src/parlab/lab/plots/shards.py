"""Who holds which shard, when: ZeRO's stages drawn from the flat buffers they shard (chapter 04).

:func:`flat_groups` lays a module's parameters into the flat groups a ZeRO stage builds, with the stage's
own ``_layout`` and :class:`~parlab.lab.parallel.zero_flat.FlatParams`, without launching ranks.
:func:`zero_frames` walks one training step of a stage over those groups: after each phase, which slice of
the weights, the gradients and the optimizer state each rank holds. :func:`draw_frame` draws one phase as a
rank × {weights, gradients, optimizer state} grid, each slice coloured by the rank that owns it;
:func:`draw_kept` draws what every stage keeps after a step (before ``zero_grad``), data parallelism's whole
copies in one neutral colour; :func:`zero_steps` gives a
``(draw, labels)`` pair for :func:`~parlab.lab.plots.steps.step_through`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from parlab.lab.plots.colors import lighter, rank_color

KINDS = ("weights", "gradients", "optimizer state")
EMPTY, LOCAL, HELD, WHOLE = 0, 1, 2, 3  # not held; own gradient, not reduced; held; a copy no one owns (DDP)
NEUTRAL, UNREDUCED = "#9A9A9A", "#EDEDED"  # WHOLE's colour; LOCAL's, under its hatching
FREED, FREED_STYLE = "#C44E52", (0, (2, 1.5))  # the outline of a shard freed in this phase: red, dashed
KEPT = "after a step, before zero_grad"  # the moment the first frame shows, and section 5's memory


@dataclass(frozen=True)
class Column:
    """One shard of one flat group: elements [start, stop) of ``group``'s padded buffer, owned by ``owner``;
    ``numel`` of that group are parameters, the rest padding."""
    group: int
    name: str
    start: int
    stop: int
    owner: int
    numel: int


@dataclass
class Layout:
    stage: int
    world_size: int
    groups: list  # FlatParams of rank 0, in the stage's order
    columns: list  # Column, group by group, shard by shard


@dataclass
class Frame:
    label: str
    state: dict  # kind -> (N, C) array of EMPTY / LOCAL / HELD
    changed: dict  # kind -> (N, C) bool: what this phase moved, updated or freed (freed: now EMPTY)


def flat_groups(stage: int, module, world_size: int, rank: int = 0, *, blocks=None, bucket_bytes=None) -> list:
    """The FlatParams a ZeRO ``stage`` (1, 2, 3) builds for ``module`` on ``rank``: the stage's own
    ``_layout`` (one group; buckets of ``bucket_bytes``; the root and one group per block of ``blocks``)."""
    from parlab.lab.parallel.ddp import DEFAULT_BUCKET_BYTES
    from parlab.lab.parallel.zero_flat import FlatParams
    from parlab.lab.parallel.zero_stage1 import ZeroStage1
    from parlab.lab.parallel.zero_stage2 import ZeroStage2
    from parlab.lab.parallel.zero_stage3 import ZeroStage3

    cls = {1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}[stage]
    params = [p for p in module.parameters() if p.requires_grad]
    names = {id(p): n for n, p in module.named_parameters()}
    if blocks is None:
        blocks = [m for m in module.children() if any(True for _ in m.parameters())]
    stand_in = SimpleNamespace(module=module, _blocks=list(blocks), bucket_bytes=bucket_bytes or DEFAULT_BUCKET_BYTES)
    return [FlatParams(label, ps, [names[id(p)] for p in ps], rank, world_size)
            for label, ps in cls._layout(stand_in, params)]


def layout(stage: int, module, world_size: int, **how) -> Layout:
    """Each group's shards and their owners, read from every rank's ``FlatParams.shard``."""
    per_rank = [flat_groups(stage, module, world_size, r, **how) for r in range(world_size)]
    columns = []
    for i, g in enumerate(per_rank[0]):
        for r in range(world_size):
            mine = per_rank[r][i].shard(torch.arange(g.padded_numel))  # the elements rank r owns
            columns.append(Column(i, g.name, int(mine[0]), int(mine[-1]) + 1, r, g.numel))
    return Layout(stage, world_size, per_rank[0], columns)


def zero_frames(lay: Layout) -> list[Frame]:
    """One training step of ``lay.stage``, phase by phase: who holds which shard after each."""
    n, groups = lay.world_size, np.array([c.group for c in lay.columns])
    own = np.array([c.owner for c in lay.columns])[None, :] == np.arange(n)[:, None]
    every = np.ones_like(own)
    state = {k: np.zeros(own.shape, int) for k in KINDS}
    state["weights"][every if lay.stage < 3 else own] = HELD
    state["optimizer state"][own] = HELD
    state["gradients"][own] = HELD  # the reduced shard the optimizer stepped with, kept until zero_grad
    if lay.stage == 1:  # stage 1's whole flat gradient buffer: the rest is this rank's own, unreduced
        state["gradients"][~own] = LOCAL
    frames = []

    def phase(label, *changes):
        changed = {k: np.zeros(own.shape, bool) for k in KINDS}
        for kind, mask, value in changes:
            state[kind][mask] = value
            changed[kind] |= mask
        frames.append(Frame(label, {k: v.copy() for k, v in state.items()}, changed))

    def group(i):
        return np.broadcast_to(groups == i, own.shape)

    phase(KEPT)
    if lay.stage == 1:
        phase("forward and backward: each rank's gradient of its own batch", ("gradients", every, LOCAL))
        phase("reduce-scatter: each rank receives the average of its shard", ("gradients", own, HELD))
    elif lay.stage == 2:
        _stage2_backward(lay, own, groups, phase)
    else:
        _stage3_passes(lay, own, group, phase)
    phase("optimizer step: each rank updates its own shard", ("weights", own, HELD), ("optimizer state", own, HELD))
    if lay.stage < 3:
        phase("all-gather: every rank receives the others' updated shards", ("weights", ~own, HELD))
    return frames


def _stage2_backward(lay, own, groups, phase) -> None:
    last = len(lay.groups) - 1
    shown = sorted({0, last // 2, last})  # at most three frames, however many buckets
    done = -1
    for b in shown:
        bucket = np.broadcast_to((groups > done) & (groups <= b), own.shape)
        freed = [("gradients", own, EMPTY)] if done < 0 else []  # zero_grad freed the last step's shards
        # each rank computed the bucket's whole gradient, sent the others' slices, and freed them
        phase(f"backward, bucket {b} of 0–{last}: reduce-scattered as it fills; the rest freed"
              + ("; zero_grad freed the last step's" if done < 0 else ""),
              *freed, ("gradients", bucket & ~own, EMPTY), ("gradients", bucket & own, HELD))
        done = b


def _stage3_passes(lay, own, group, phase) -> None:
    names = [g.name for g in lay.groups]
    root = names.index("root") if "root" in names else None
    units = [i for i in range(len(names)) if i != root]
    held = [] if root is None else [root]
    freed = [("gradients", own, EMPTY)]  # zero_grad freed the last step's gradient shards
    if root is not None:
        phase("forward, root: gather, held for the whole forward", *freed, ("weights", group(root), HELD))
    for k, i in enumerate(units):
        free = [("weights", group(units[k - 1]) & ~own, EMPTY)] if k else ([] if root is not None else freed)
        phase(f"forward, {names[i]}: gather, compute" + (f"; {names[units[k - 1]]} freed" if k else ""),
              *free, ("weights", group(i), HELD))
    ends = [units[-1]] + held
    phase("end of forward: free what is gathered", *[("weights", group(i) & ~own, EMPTY) for i in ends])
    if root is not None:
        phase("backward, root: gather again, held for the whole backward", ("weights", group(root), HELD))
    for k, i in enumerate(reversed(units)):
        prev = [("weights", group(units[::-1][k - 1]) & ~own, EMPTY)] if k else []
        phase(f"backward, {names[i]}: gather again, reduce-scatter its gradients, free the others' slices",
              *prev, ("weights", group(i), HELD), ("gradients", group(i) & ~own, EMPTY),
              ("gradients", group(i) & own, HELD))
    last = [units[0]] + held
    phase("end of backward" + (", root: reduce-scatter its gradients" if held else "") + "; free",
          *[("weights", group(i) & ~own, EMPTY) for i in last], *[("gradients", group(i) & ~own, EMPTY) for i in held],
          *[("gradients", group(i) & own, HELD) for i in held])


# -- drawing ------------------------------------------------------------------------------------------------

def _x(lay: Layout) -> tuple[np.ndarray, np.ndarray, float]:
    """Left edge and width of each column: widths in proportion to the shard, a gap between groups."""
    total = sum(c.stop - c.start for c in lay.columns)
    gap = 0.012 * total if len(lay.groups) <= 12 else 0.004 * total
    left, widths, x = [], [], 0.0
    for k, c in enumerate(lay.columns):
        if k and c.group != lay.columns[k - 1].group:
            x += gap
        left.append(x)
        widths.append(c.stop - c.start)
        x += c.stop - c.start
    return np.array(left), np.array(widths, float), x


def _grid(ax, lay: Layout, frame: Frame, labels: bool = True, margin: float = 0.14) -> None:
    """Three bands (weights, gradients, optimizer state) of one row per rank, one cell per column. The cells
    are added with ``add_artist`` and left out of the layout: the limits are set below, they are clipped to the
    axes, and ``add_patch``'s update of the data limits, and their extents in a bounding box, were most of a
    frame's drawing."""
    n = lay.world_size
    left, widths, right = _x(lay)
    for b, kind in enumerate(KINDS):
        top = b * (n + 1.2)
        for r in range(n):
            for j, c in enumerate(lay.columns):
                value, changed = frame.state[kind][r, j], frame.changed[kind][r, j]
                freed, moved = changed and value == EMPTY, changed and value != EMPTY
                face = {EMPTY: "white", LOCAL: UNREDUCED, WHOLE: NEUTRAL,
                        HELD: rank_color(c.owner) if c.owner == r else lighter(rank_color(c.owner), 0.6)}[value]
                ax.add_artist(Rectangle((left[j], top + r), widths[j], 0.86, facecolor=face,
                                       hatch="////" if value == LOCAL else None,
                                       edgecolor=FREED if freed else "black" if moved else "#BBBBBB",
                                       ls=FREED_STYLE if freed else "-", lw=1.3 if freed else 1.6 if moved else 0.4,
                                       in_layout=False))
                pad = max(0, c.stop - max(c.start, c.numel))  # zeros past the group's parameters
                if value in (LOCAL, HELD) and pad:  # DDP (WHOLE) pads nothing
                    w = widths[j] * pad / (c.stop - c.start)
                    ax.add_artist(Rectangle((left[j] + widths[j] - w, top + r), w, 0.86, facecolor="#555555", lw=0,
                                           in_layout=False))
        if labels:
            ax.text(-0.72 * margin * right, top + n / 2 - 0.1, kind.replace(" ", "\n"), ha="center", va="center",
                    fontsize=9, fontweight="bold")
            for r in range(n):
                ax.text(-0.008 * right, top + r + 0.43, f"rank {r}", ha="right", va="center", fontsize=7.5)
    starts = {}
    for j, c in enumerate(lay.columns):
        starts.setdefault(c.group, [left[j], left[j] + widths[j]])[1] = left[j] + widths[j]
    bottom = len(KINDS) * (n + 1.2) - 0.9
    if len(lay.groups) <= 4:
        for g, (a, z) in starts.items():
            ax.text((a + z) / 2, bottom, lay.groups[g].name, ha="center", va="top", fontsize=8)
    else:
        ax.text(right / 2, bottom, f"{len(lay.groups)} buckets, in the order backward fills them",
                ha="center", va="top", fontsize=8)
    ax.set_xlim(-margin * right if labels else -0.01 * right, right * 1.005)
    ax.set_ylim(bottom + 0.9, -0.3)
    ax.axis("off")


def _legend(fig: Figure, n: int, whole: bool = False) -> None:
    handles = [Patch(facecolor=rank_color(r), label=f"rank {r}'s shard") for r in range(n)]
    handles += [Patch(facecolor=NEUTRAL, label="a whole copy, no owner (DDP)")] if whole else []
    handles += [Patch(facecolor=lighter(rank_color(0), 0.6), label="a copy of another rank's shard"),
                Patch(facecolor=UNREDUCED, hatch="////", edgecolor="#888888", label="own gradient, not reduced"),
                Patch(facecolor="white", edgecolor="black", lw=1.6, label="moved or updated in this phase"),
                Patch(facecolor="white", edgecolor=FREED, ls=FREED_STYLE, lw=1.3, label="freed in this phase"),
                Patch(facecolor="#555555", label="padding")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=7.5, frameon=False)


def draw_frame(lay: Layout, frame: Frame) -> Figure:
    """One phase of a ZeRO step: a plain Figure (for :func:`~parlab.lab.plots.steps.step_through`)."""
    n = lay.world_size
    fig = Figure(figsize=(10, 1.1 + 0.24 * 3 * (n + 1.2)))
    ax = fig.add_axes((0.01, 0.13, 0.98, 0.78))
    _grid(ax, lay, frame)
    fig.suptitle(f"ZeRO stage {lay.stage} · {frame.label}", fontsize=11, x=0.02, ha="left")
    _legend(fig, n)
    return fig


def draw_kept(layouts: list[Layout]) -> Figure:
    """What each rank keeps after a step, before ``zero_grad`` (what the memory counters see): data parallelism
    (everything, everywhere, no owner), then stages 1–3 (gradients whole in stage 1, a shard in 2 and 3)."""
    n = layouts[0].world_size
    fig = Figure(figsize=(12, 1.2 + 0.22 * 3 * (n + 1.2)))
    panels = [("data parallel (stage 0)", layouts[0], _everything(layouts[0]))]
    panels += [(f"stage {lay.stage}", lay, zero_frames(lay)[0]) for lay in layouts]
    for k, (title, lay, frame) in enumerate(panels):
        ax = fig.add_axes((0.34 + (k - 1) * 0.222, 0.14, 0.2, 0.72) if k else (0.01, 0.14, 0.3, 0.72))
        _grid(ax, lay, frame, labels=k == 0, margin=0.42)
        ax.text(0.5 if k else 0.42 / 1.42 + 0.5 / 1.42, 1.02, title, transform=ax.transAxes, ha="center", fontsize=10)
    fig.suptitle(f"{KEPT}: what each rank keeps (one cell: one rank's shard of a flat group)",
                 fontsize=11, x=0.02, ha="left")
    _legend(fig, n, whole=True)
    return fig


def _everything(lay: Layout) -> Frame:
    full = np.full((lay.world_size, len(lay.columns)), WHOLE)
    return Frame(KEPT, {k: full.copy() for k in KINDS}, {k: full < 0 for k in KINDS})


def zero_steps(module, world_size: int, stages=(1, 2, 3), *, blocks=None, bucket_bytes=None, overview=True):
    """``(draw, labels)`` for :func:`~parlab.lab.plots.steps.step_through`: what every stage keeps (when
    ``overview``), then one training step of each of ``stages``, phase by phase."""
    how = dict(blocks=blocks, bucket_bytes=bucket_bytes)
    wanted = set(stages) | ({1, 2, 3} if overview else set())
    lays = {s: layout(s, module, world_size, **how) for s in sorted(wanted)}
    frames = [(lays[s], f) for s in stages for f in zero_frames(lays[s])]
    labels = ([f"{KEPT}: what each stage keeps"] if overview else []) + [f"stage {lay.stage}: {f.label.split(':')[0]}"
                                                               for lay, f in frames]

    def draw(i: int) -> Figure:
        if overview and i == 0:
            return draw_kept([lays[s] for s in (1, 2, 3)])
        return draw_frame(*frames[i - overview])

    return draw, labels
