"""What each rank holds of a sharded model, and what each rank's file holds of its checkpoint, drawn from the
real objects (chapter 08): the local shapes of FSDP2's ``DTensor`` parameters on every rank, and the chunks a
``torch.distributed.checkpoint`` folder's metadata lists, each in the file of the rank that wrote it.

:func:`fsdp_holdings` runs on a rank after ``fully_shard``; :func:`held_shards` draws what every rank
returned. :func:`checkpoint_chunks` reads a DCP folder; :func:`checkpoint_pieces` draws its chunks by the
rank that wrote them, with the boundaries of the shards another world size will read.
"""

from __future__ import annotations

import os
import re

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from parlab.lab.plots.colors import rank_color
from parlab.lab.plots.steps import png


class ShownFigure(Figure):
    """A plain ``Figure`` that a notebook shows as a PNG when a cell ends with it (no pyplot involved)."""

    def _repr_png_(self) -> bytes:
        return png(self)


def fsdp_holdings(model, blocks) -> list[tuple[str, str, int, int, int]]:
    """On one rank, after ``fully_shard``: ``(unit, parameter, local rows, global rows, columns)`` for each
    parameter; ``unit`` is the block (one of ``blocks``, by module) that owns it, or ``"root"``. The rows
    are dim 0 of the ``DTensor`` (``Shard(0)``) and of this rank's local tensor."""
    names = {id(m): n for n, m in model.named_modules()}
    prefixes = [names[id(b)] + "." for b in blocks]
    rows = []
    for name, p in model.named_parameters():
        unit = next((pre[:-1] for pre in prefixes if name.startswith(pre)), "root")
        local = p.to_local() if hasattr(p, "to_local") else p
        columns = p.numel() // p.shape[0] if p.dim() else 1
        rows.append((unit, name, local.shape[0] if local.dim() else 1, p.shape[0] if p.dim() else 1, columns))
    return rows


def _units(first: list) -> list[str]:
    units = []
    for unit, *_ in first:
        if unit not in units:
            units.append(unit)
    return units[1:] + units[:1] if units and units[0] == "root" else units


def held_shards(per_rank: list[list[tuple]], title: str | None = None) -> Figure:
    """One bar per FSDP unit (each block, then the root), its parameters end to end, each as wide as its
    values; inside each parameter, every rank's rows of dim 0 in that rank's colour: what the rank keeps
    between uses. ``per_rank``: :func:`fsdp_holdings` of every rank, in rank order."""
    n = len(per_rank)
    units = _units(per_rank[0])
    fig = ShownFigure(figsize=(9, 0.55 * len(units) + 1.3))
    ax = fig.add_subplot()
    for y, unit in enumerate(units):
        x = 0
        for i, (u, name, _, total, cols) in enumerate(per_rank[0]):
            if u != unit:
                continue
            for r in range(n):
                width = per_rank[r][i][2] * cols
                ax.barh(y, width, left=x, color=rank_color(r), height=0.6)
                x += width
            ax.barh(y, total * cols, left=x - total * cols, fill=False, edgecolor="black", lw=0.6, height=0.6)
    ax.set_yticks(range(len(units)), units, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("values of the unit's parameters, end to end (each box a parameter, split on dim 0)")
    ax.set_title(title or f"after fully_shard on {n} ranks: each rank keeps its rows of every parameter", fontsize=10)
    ax.legend(handles=[Patch(color=rank_color(r), label=f"rank {r}") for r in range(n)], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def checkpoint_chunks(path: str) -> dict[str, dict]:
    """``{key: {"rows": dim 0 of the tensor, "chunks": [(first row, rows, rank of the file)]}}`` for every
    tensor of the DCP folder ``path``, read from its ``.metadata`` (which file holds which piece)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    meta = FileSystemReader(path).read_metadata()
    out = {}
    for key, item in meta.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata) or not len(item.size):
            continue
        chunks = []
        for chunk in item.chunks:
            where = meta.storage_data[MetadataIndex(key, chunk.offsets)]
            rank = int(re.fullmatch(r"__(\d+)_\d+\.distcp", os.path.basename(where.relative_path)).group(1))
            chunks.append((chunk.offsets[0], chunk.sizes[0], rank))
        out[key] = {"rows": item.size[0], "chunks": sorted(chunks)}
    return out


def checkpoint_pieces(chunks: dict[str, dict], keys: list[str], resume_world: int | None = None,
                      title: str | None = None) -> Figure:
    """Each tensor of ``keys`` as a bar over its dim 0, cut into the chunks of :func:`checkpoint_chunks`,
    each in the colour of the rank whose file holds it; dashed lines: where ``resume_world`` ranks' shards
    begin (``torch.chunk``'s split, as FSDP2 shards): each new rank reads the pieces between two lines."""
    fig = ShownFigure(figsize=(9, 0.32 * len(keys) + 1.4))
    ax = fig.add_subplot()
    writers = sorted({r for k in keys for *_, r in chunks[k]["chunks"]})
    for y, key in enumerate(keys):
        rows = chunks[key]["rows"]
        for first, size, rank in chunks[key]["chunks"]:
            ax.barh(y, size / rows, left=first / rows, color=rank_color(rank), height=0.65, edgecolor="white")
        if resume_world:
            step = -(-rows // resume_world)
            for cut in range(step, rows, step):
                ax.plot([cut / rows] * 2, [y - 0.42, y + 0.42], color="black", ls="--", lw=1)
    ax.set_yticks(range(len(keys)), [k.removeprefix("job.") for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("dim 0 of the tensor (rows), as a share of its length")
    handles = [Patch(color=rank_color(r), label=f"file of rank {r}") for r in writers]
    if resume_world:
        handles.append(Patch(facecolor="white", edgecolor="black", ls="--", label=f"shards at {resume_world} ranks"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "a sharded checkpoint: each piece in the file of the rank that wrote it", fontsize=10)
    fig.tight_layout()
    return fig
