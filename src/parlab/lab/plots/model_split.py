"""What each rank holds of a model under 3-D parallelism, drawn from the mesh: :func:`model_on_mesh`.

Pipeline parallelism gives each stage whole blocks; tensor parallelism splits the large matrices of each
block over the ``tp`` ranks; data parallelism copies what a (stage, tp) pair holds to every replica. The
picture is a grid: one column per rank, one row per piece of the model.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab.lab.plots.colors import lighter, rank_color


def held_pieces(topology, stage_blocks) -> dict[int, dict[str, str]]:
    """``{rank: {piece: "whole" or "k/t"}}``: the pieces of the model ``rank`` holds. ``stage_blocks[s]`` is
    stage s's pieces, each ``(name, split)``: ``split`` True where TP splits it over the ``tp`` ranks (the
    rank holds slice ``tp coordinate + 1`` of ``t``)."""
    if len(stage_blocks) != topology.pp:
        raise ValueError(f"{len(stage_blocks)} stages of blocks for pp = {topology.pp}")
    out = {}
    for rank in range(topology.world_size):
        c = topology.coords(rank)
        out[rank] = {name: (f"{c['tp'] + 1}/{topology.tp}" if split and topology.tp > 1 else "whole")
                     for name, split in stage_blocks[c["pp"]]}
    return out


def model_on_mesh(topology, stage_blocks, title: str = "") -> Figure:
    """One column per rank (labelled ``pp,dp,tp``), one row per piece of the model (``stage_blocks``, as
    :func:`held_pieces` takes them). A rank's pieces are filled: a TP slice in the colour of its ``tp``
    coordinate, labelled k/t, a whole piece in grey; the other stages' pieces are left empty."""
    held = held_pieces(topology, stage_blocks)
    names = [name for blocks in stage_blocks for name, _ in blocks]
    n = topology.world_size
    fig = Figure(figsize=(1.6 + 0.62 * n, 0.9 + 0.34 * len(names)))
    ax = fig.subplots()
    for rank in range(n):
        c = topology.coords(rank)
        for row, name in enumerate(names):
            piece = held[rank].get(name)
            face = ("white" if piece is None else "#d9d9d9" if piece == "whole"
                    else lighter(rank_color(c["tp"]), 0.35))
            ax.add_patch(Rectangle((rank - 0.45, row - 0.42), 0.9, 0.84, facecolor=face,
                                   edgecolor="#555555" if piece else "#dddddd", lw=0.7))
            if piece:
                ax.text(rank, row, "" if piece == "whole" else piece, ha="center", va="center", fontsize=7)
        ax.text(rank, -0.75, f"{rank}\n{c['pp']},{c['dp']},{c['tp']}", ha="center", va="bottom", fontsize=7)
    per_stage = n // topology.pp
    for s in range(topology.pp):
        ax.annotate("", xy=(s * per_stage - 0.45, -1.75), xytext=((s + 1) * per_stage - 0.55, -1.75),
                    arrowprops=dict(arrowstyle="-", color="#333333", lw=1))
        ax.text((s + 0.5) * per_stage - 0.5, -1.85, f"stage {s}: ranks {s * per_stage}–{(s + 1) * per_stage - 1}",
                ha="center", va="bottom", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xticks([])
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(len(names) - 0.5, -2.6)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("rank (pp, dp, tp): grey = whole on the rank; k/t = the rank's slice of a TP-split piece",
                  fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
