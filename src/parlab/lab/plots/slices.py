"""Which rank holds which slice of a tensor, before and after each collective (tensor parallelism, chapter 05).

A :class:`Slab` is one tensor as the ranks see it: ``owners[u]`` is the rank whose slice unit ``u`` (a
feature, a head, a token, a word) belongs to, along the tensor's split ``axis``. A :class:`Frame` is one
moment: each slab's state on each rank, one of

- ``WHOLE``: the whole tensor, the same on every rank (grey);
- ``OWN``: only this rank's units (its colour), the rest not held;
- ``GATHERED``: every unit, each in its owner's colour (after an all-gather);
- ``PARTIAL``: a tensor of the whole shape holding this rank's partial sum (hatched; an all-reduce or a
  reduce-scatter adds them up);
- ``None``: not computed yet.

The builders read the objects the chapter runs: :func:`linear_frames` the feature indices each rank's
column- and row-parallel layer keeps (``layer.shards``), :func:`mlp_frames` a plan's column and row layers
(Megatron's f and g), :func:`sequence_frames` sequence parallelism's regions, :func:`vocab_frames` the
vocabulary-parallel loss, :func:`heads_frames` attention's heads and grouped-query attention's KV heads.
:func:`frames_steps` gives a ``(draw, labels)`` pair for :func:`~parlab.lab.plots.steps.step_through`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate, groupby

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab.lab.plots.colors import lighter, rank_color

WHOLE, OWN, GATHERED, PARTIAL = "whole", "own", "gathered", "partial"
GREY = "#B8B8B8"


@dataclass(frozen=True)
class Slab:
    """One tensor: ``owners[u]`` the rank owning unit ``u`` along ``axis`` (1: columns, 0: rows);
    ``size`` its drawn (width, height); ``shape`` a label such as "b × 4h"."""

    name: str
    owners: tuple
    axis: int = 1
    size: tuple = (1.0, 1.0)
    shape: str = ""


@dataclass
class Frame:
    """One moment: ``label`` says what just happened; ``states[name]`` is each rank's state of that slab."""

    label: str
    slabs: list
    states: dict
    changed: set = field(default_factory=set)


def contiguous(units: int, world_size: int) -> tuple:
    """Owners of ``units`` split in ``world_size`` contiguous blocks (rank r: units r·u/t … (r+1)·u/t − 1)."""
    if units % world_size:
        raise ValueError(f"{units} units do not split evenly over {world_size} ranks")
    return tuple(u * world_size // units for u in range(units))


def from_indices(indices: list, units: int) -> tuple:
    """Owners from each rank's index list (``indices[r]``: the units rank r keeps), as a layer's ``shards``
    record them; every unit must be kept by exactly one rank."""
    owners = [None] * units
    for r, index in enumerate(indices):
        for u in index:
            if owners[int(u)] is not None:
                raise ValueError(f"unit {int(u)} is kept by rank {owners[int(u)]} and rank {r}")
            owners[int(u)] = r
    if None in owners:
        raise ValueError(f"units {[u for u, o in enumerate(owners) if o is None]} are kept by no rank")
    return tuple(owners)


def _walk(slabs: list, world_size: int, steps: list) -> list:
    """Frames from ``steps``: (label, {slab name: state, or a per-rank list of states}); a state persists."""
    state = {s.name: [None] * world_size for s in slabs}
    frames = []
    for label, changes in steps:
        changed = set()
        for name, value in changes.items():
            new = list(value) if isinstance(value, (list, tuple)) else [value] * world_size
            if new != state[name]:
                changed.add(name)
            state[name] = new
        frames.append(Frame(label, slabs, {k: list(v) for k, v in state.items()}, changed))
    return frames


def linear_frames(column_index: list, row_index: list, n_in: int, n_out: int) -> list:
    """Y = X·A on t ranks, split by columns then by rows; ``column_index[r]`` are the output features rank
    r's column-parallel layer keeps, ``row_index[r]`` the input features its row-parallel layer keeps."""
    t = len(column_index)
    cols, rows = from_indices(column_index, n_out), from_indices(row_index, n_in)
    x = Slab("X", (None,), 1, (0.9, 0.7), "b × k")
    x_rows = Slab("X", rows, 1, (0.9, 0.7), "b × k")
    a_cols = Slab("A", cols, 1, (1.2, 0.9), "k × n")
    a_rows = Slab("A", rows, 0, (1.2, 0.9), "k × n")
    y = Slab("Y", cols, 1, (1.2, 0.7), "b × n")
    column = _walk([x, a_cols, y], t, [
        ("by columns: X whole on every rank, A_r its n/t columns", {"X": WHOLE, "A": OWN}),
        ("Y_r = X·A_r: its own columns of Y, nothing sent", {"Y": OWN})])
    row = _walk([x_rows, a_rows, y], t, [
        ("by rows: X_r its k/t columns of X, A_r the same k/t rows of A", {"X": OWN, "A": OWN}),
        ("X_r·A_r: a partial sum of the whole Y on each rank", {"Y": PARTIAL}),
        ("all-reduce: Y = Σ_r X_r·A_r, whole on every rank", {"Y": WHOLE})])
    return column + row


def mlp_frames(column: str, row: str, world_size: int, hidden: int, ffn: int) -> list:
    """Megatron's MLP, ``column`` then ``row`` (the plan's layer names): f, the two layers and g, forward
    then backward (the gradients d·, right to left)."""
    t, h = world_size, contiguous(ffn, world_size)
    fwd = [Slab("X", (None,), 1, (0.7, 0.7), "b·s × h"), Slab("H", h, 1, (1.4, 0.7), f"b·s × {ffn // hidden}h"),
           Slab("Z", (None,), 1, (0.7, 0.7), "b·s × h")]
    bwd = [Slab("dX", (None,), 1, (0.7, 0.7), "b·s × h"), Slab("dH", h, 1, (1.4, 0.7), f"b·s × {ffn // hidden}h"),
           Slab("dZ", (None,), 1, (0.7, 0.7), "b·s × h")]
    return _walk(fwd, t, [
        ("forward: f is the identity, X whole on every rank", {"X": WHOLE}),
        (f"{column} (column): H_r = GeLU(X·A_r), its columns; GeLU needs no other column", {"H": OWN}),
        (f"{row} (row): H_r·B_r, a partial sum of Z", {"Z": PARTIAL}),
        ("g: all-reduce, Z whole on every rank (1st all-reduce)", {"Z": WHOLE})]) + _walk(bwd, t, [
        ("backward: dZ whole on every rank; g's backward is the identity", {"dZ": WHOLE}),
        (f"{row}: dH_r = dZ·B_rᵀ, its own columns", {"dH": OWN}),
        (f"{column}: dH_r·A_rᵀ, a partial sum of dX", {"dX": PARTIAL}),
        ("f's backward: all-reduce, dX whole on every rank (2nd all-reduce)", {"dX": WHOLE})])


def sequence_frames(world_size: int, seq_len: int, ffn_units: int = 8) -> list:
    """Sequence parallelism around one column-then-row block: tokens split outside it (norms, dropout,
    residual), an all-gather in place of f, a reduce-scatter in place of g."""
    t, tokens, ffn = world_size, contiguous(seq_len, world_size), contiguous(ffn_units * world_size, world_size)
    def slabs(d=""):
        return [Slab(f"{d}X", tokens, 0, (0.5, 0.9), "s × h"), Slab(f"{d}H", ffn, 1, (1.3, 0.9), "s × 4h"),
                Slab(f"{d}Z", tokens, 0, (0.5, 0.9), "s × h")]
    return _walk(slabs(), t, [
        ("norm, dropout, residual: each rank its s/t tokens", {"X": OWN}),
        ("all-gather along the sequence (f's place): X whole", {"X": GATHERED}),
        ("column, then row: a partial sum of Z for every token", {"H": OWN, "Z": PARTIAL}),
        ("reduce-scatter along the sequence (g's place): each rank the sum of its s/t tokens", {"Z": OWN})]) + \
        _walk(slabs("d"), t, [
            ("backward: dZ for each rank's s/t tokens", {"dZ": OWN}),
            ("all-gather (the reduce-scatter's backward): dZ whole; then row, then column", {"dZ": GATHERED, "dH": OWN}),
            ("column's backward: a partial sum of dX for every token", {"dX": PARTIAL}),
            ("reduce-scatter (the all-gather's backward): each rank dX of its s/t tokens", {"dX": OWN})])


def vocab_frames(world_size: int, vocab: int, tokens: int = 6) -> list:
    """The vocabulary-parallel loss: each rank its V/t words' logits, then three all-reduces of one number
    per token (the largest logit, the sum of exponentials, the target's logit)."""
    t = world_size
    words = contiguous(vocab, t)
    one = (None,)
    slabs = [Slab("logits", words, 1, (1.6, 0.8), "tokens × V"), Slab("max", one, 1, (0.16, 0.8), "tokens"),
             Slab("Σ exp", one, 1, (0.16, 0.8), "tokens"), Slab("z_target", one, 1, (0.16, 0.8), "tokens")]
    owner_of_target = [PARTIAL] * t
    return _walk(slabs, t, [
        ("the output layer, column-parallel: each rank the logits of its V/t words", {"logits": OWN}),
        ("all-reduce MAX of each token's largest logit", {"max": WHOLE}),
        ("all-reduce SUM of Σ exp(z − max) over each rank's words", {"Σ exp": WHOLE}),
        ("the target's logit: only its owner has it, the others add 0", {"z_target": owner_of_target}),
        ("all-reduce SUM: z_target whole; loss = log Σ exp − z_target on every rank", {"z_target": WHOLE})])


def heads_frames(decoders: dict, world_size: int) -> list:
    """Attention split by heads, one frame per decoder: ``decoders[name] = (heads, kv_heads, layout)`` with
    layout ``"split"`` (KV heads split like the queries) or ``"replicate"`` (every rank keeps them whole)."""
    frames = []
    for name, (heads, kv, layout) in decoders.items():
        q = Slab("Q heads", contiguous(heads, world_size), 1, (1.6, 0.5), f"{heads} heads")
        k = Slab("K/V heads", contiguous(kv, world_size) if layout == "split" else (None,) * kv, 1,
                 (1.6 * kv / heads, 0.5), f"{kv} head{'s' * (kv > 1)}")
        label = f"{name}: KV heads {'split like the queries' if layout == 'split' else 'replicated on every rank'}"
        frames += _walk([q, k], world_size, [(label, {"Q heads": OWN, "K/V heads": OWN if layout == "split" else WHOLE})])
        frames[-1].changed = set()  # each frame is a decoder of its own, not a step after the last
    return frames


# -- drawing ------------------------------------------------------------------------------------------------

def _face(state, owner, rank: int):
    if state == WHOLE or owner is None:
        return GREY if state != PARTIAL else lighter(rank_color(rank), 0.45)
    if state == OWN:
        return rank_color(owner) if owner == rank else "white"
    if state == GATHERED:
        return rank_color(owner) if owner == rank else lighter(rank_color(owner), 0.5)
    return lighter(rank_color(rank), 0.45)  # PARTIAL


def _slab(ax, slab: Slab, state, rank: int, x: float, y: float, moved: bool) -> None:
    """One slab on one rank: a cell per unit, outlined in white where there are 16 or fewer; past 16 the cells
    have no outline, and a run of units of one colour is one rectangle (a vocabulary of 128 words, an MLP of
    256 features: a frame's drawing was its thousand cells). Added with ``add_artist`` and left out of the layout:
    the limits are set by :func:`draw_frame`, the cells are clipped to the axes, and ``add_patch``'s update of
    the data limits, and the cells' extents in a bounding box, were most of a frame's time."""
    w, h = slab.size
    n = len(slab.owners)
    edge = dict(edgecolor="black" if moved else "#888888", lw=1.8 if moved else 0.6)
    if state is None:
        ax.add_artist(Rectangle((x, y), w, h, fill=False, ls=(0, (2, 2)), edgecolor="#BBBBBB", lw=0.6, in_layout=False))
        return
    faces = [_face(state, owner, rank) for owner in slab.owners]
    outlined = n <= 16 or state == PARTIAL
    runs = [1] * n if outlined else [len(list(run)) for _, run in groupby(faces)]  # units per rectangle
    bounds = [0, *accumulate(runs)]
    for u, v in zip(bounds, bounds[1:]):
        ux, uy, uw, uh = ((x + u * w / n, y, (v - u) * w / n, h) if slab.axis == 1
                          else (x, y + u * h / n, w, (v - u) * h / n))
        ax.add_artist(Rectangle((ux, uy), uw, uh, facecolor=faces[u], lw=0.8 if outlined else 0,
                                edgecolor="#444444" if state == PARTIAL else "white",
                                hatch="////" if state == PARTIAL else None, in_layout=False))
    ax.add_artist(Rectangle((x, y), w, h, fill=False, in_layout=False, **edge))


def draw_frame(frame: Frame, title: str = "") -> Figure:
    """One frame: a row per rank, a column per slab; a slab that just changed is outlined in black."""
    t = len(next(iter(frame.states.values())))
    gap, widths = 0.35, [s.size[0] for s in frame.slabs]
    height = max(s.size[1] for s in frame.slabs)
    total, pitch = sum(widths) + gap * (len(widths) - 1), height + 0.25
    fig = Figure(figsize=(1.3 * (total + 0.9), 1.3 * (t * pitch + 0.6) + 0.5))
    ax = fig.add_subplot()
    for r in range(t):
        x, y = 0.0, r * pitch
        ax.text(-0.08, y + height / 2, f"rank {r}", ha="right", va="center", fontsize=9, color=rank_color(r))
        for s, w in zip(frame.slabs, widths):
            _slab(ax, s, frame.states[s.name][r], r, x, y + (height - s.size[1]) / 2, s.name in frame.changed)
            if r == 0:
                ax.text(x + w / 2, -0.1, f"{s.name}" + (f"\n{s.shape}" if s.shape else ""), ha="center",
                        va="bottom", fontsize=8.5)
            x += w + gap
    ax.set_xlim(-0.75, total + 0.1)
    ax.set_ylim(t * pitch, -0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(frame.label, fontsize=9.5, loc="left", wrap=True)
    keys = [Rectangle((0, 0), 1, 1, facecolor=GREY), Rectangle((0, 0), 1, 1, facecolor=rank_color(0)),
            Rectangle((0, 0), 1, 1, facecolor=lighter(rank_color(0), 0.45), hatch="////"),
            Rectangle((0, 0), 1, 1, fill=False, edgecolor="black", lw=1.8)]
    fig.legend(keys, ["whole, the same on every rank", "a rank's own slice", "a partial sum", "just changed"],
               loc="lower center", ncol=2, fontsize=7.5, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def frames_steps(frames: list, title: str = "") -> tuple:
    """``(draw, labels)`` for :func:`~parlab.lab.plots.steps.step_through`: one frame per step."""
    return (lambda i: draw_frame(frames[i], title)), [f"{i + 1}" for i in range(len(frames))]
