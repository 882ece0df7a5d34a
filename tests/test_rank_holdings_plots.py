"""The pictures of what each rank holds (parlab.lab.plots.rank_holdings): FSDP2's shards per block per rank,
read from the DTensors, and a DCP checkpoint's pieces per rank file, read from its metadata."""

from __future__ import annotations

import torch
from matplotlib.colors import to_rgb

import parlab
from parlab.lab.plots.colors import rank_color
from parlab.lab.plots.rank_holdings import checkpoint_chunks, checkpoint_pieces, fsdp_holdings, held_shards


def _sharded_and_saved(path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 10), torch.nn.Linear(10, 3))  # 10 and 3 rows: uneven over 3
    blocks = [model[0]]
    for unit in [*blocks, model]:
        fully_shard(unit, mesh=parlab.lab.runtime.mesh())
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    return fsdp_holdings(model, blocks)


def test_held_shards_and_checkpoint_pieces_follow_the_ranks(tmp_path):
    path = str(tmp_path / "ckpt")
    per_rank = parlab.launch(_sharded_and_saved, 3, args=(path,), announce=False)
    units = {name: unit for unit, name, *_ in per_rank[0]}
    assert units == {"0.weight": "0", "0.bias": "0", "1.weight": "root", "1.bias": "root"}
    assert [held[0][2] for held in per_rank] == [4, 4, 2]  # torch.chunk's split of 10 rows over 3 ranks
    assert [held[2][2] for held in per_rank] == [1, 1, 1]
    fig = held_shards(per_rank)
    bars = [p for p in fig.axes[0].patches if p.get_fill()]
    first = bars[:3]  # block "0"'s weight, rank by rank: widths are the ranks' values, colours their own
    assert [b.get_width() for b in first] == [16, 16, 8]
    assert [to_rgb(b.get_facecolor()) for b in first] == [to_rgb(rank_color(r)) for r in range(3)]
    chunks = checkpoint_chunks(path)
    assert chunks["model.0.weight"] == {"rows": 10, "chunks": [(0, 4, 0), (4, 4, 1), (8, 2, 2)]}
    fig = checkpoint_pieces(chunks, ["model.0.weight"], resume_world=2)
    pieces = [p for p in fig.axes[0].patches]
    assert [round(p.get_width(), 2) for p in pieces] == [0.4, 0.4, 0.2]
    assert [to_rgb(p.get_facecolor()) for p in pieces] == [to_rgb(rank_color(r)) for r in range(3)]
    cuts = [line.get_xdata()[0] for line in fig.axes[0].lines]
    assert cuts == [0.5]  # 2 ranks' shards of 10 rows: 5 and 5
