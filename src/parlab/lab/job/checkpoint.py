"""What a sharded checkpoint of ``torch.distributed.checkpoint`` (DCP) holds on disk (chapter 08).

``dcp.save`` writes one file per rank, ``__<rank>_0.distcp``, with that rank's shards, and one
``.metadata`` file that says which piece of which tensor lies where. Loading reads the metadata and, on
each rank of the new world size, only the pieces of its new shards: resharding is a read plan, not a copy
of the whole model onto one rank. :func:`contents` reads a checkpoint folder back: bytes per rank file and
the bytes of the tensors the metadata describes (what the estimator predicts), the rest being each
entry's serialisation: about 1.5–2 kB per piece (the rank files' bytes beyond the tensors' values, divided by
the entries the metadata lists; 1.5 kB for chapter 08's GPT-2 with torch 2.13), noticeable only for tiny models.
"""

from __future__ import annotations

import os
import re

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def contents(path: str) -> dict:
    """``{"files": {rank: bytes}, "tensor_bytes": {key: bytes}, "metadata": bytes}`` of a DCP folder."""
    files = {int(m.group(1)): os.path.getsize(os.path.join(path, name))
             for name in os.listdir(path) if (m := re.fullmatch(r"__(\d+)_0\.distcp", name))}
    meta = FileSystemReader(path).read_metadata()
    tensors = {}
    for key, item in meta.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            numel = 1
            for size in item.size:
                numel *= size
            tensors[key] = numel * item.properties.dtype.itemsize
    return {"files": dict(sorted(files.items())), "tensor_bytes": tensors,
            "metadata": os.path.getsize(os.path.join(path, ".metadata"))}


def plot_bytes_per_rank(saved: dict, estimate_bytes: float, title: str = "a sharded checkpoint, per rank"):
    """Bars: the file each rank wrote; a line: the estimator's bytes per rank."""
    import matplotlib.pyplot as plt

    ranks = list(saved["files"])
    fig, ax = plt.subplots(figsize=(8, 2.6))
    ax.bar(ranks, [b / 1e3 for b in saved["files"].values()], label="file written by the rank")
    ax.axhline(estimate_bytes / 1e3, color="k", ls="--", label="estimate: weights + momentum, / N")
    ax.set(xlabel="rank", ylabel="kB", xticks=ranks, title=title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig
