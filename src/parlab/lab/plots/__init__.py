"""The course's pictures: every sequence of numbers the chapters measure is drawn with one of these.

- :func:`rank_tensors`   every rank's tensor before and after a collective (chapter 02)
- :func:`memory_bars`    stacked bytes per component (params, grads, DDP buckets, optimizer, activations) per bar
                         (chapter 01; ZeRO stages in 04)
- :func:`gantt`          per-rank timeline of compute / comm / idle events (chapters 02, 03, 06)
- :func:`bandwidth`      time, algbw and busbw against message size, with an α-β fit (chapter 02)
- :func:`pipeline`       a pipeline's forwards and backwards per rank, idle time, activations held (chapter 06)
- :func:`comm_bytes`     bytes per rank, one segment per op (chapter 03: DataParallel vs DDP)
- :func:`matmul_split`   a matrix product split by columns and by rows over the ranks (chapter 05)
- :func:`mesh`           which rank sits where on a mesh, and which ranks talk on each axis (chapter 07)
- :func:`step_through`   a mechanism that moves in steps: its first frame as a picture, a slider for the rest

One module per kind of picture: ``tensors`` (rank_tensors, matmul_split), ``memory`` (memory_bars),
``timeline`` (gantt), ``pipeline``, ``comm`` (bandwidth, comm_bytes), ``mesh``, and ``colors`` (the palette
they share); every name is importable from ``parlab.lab.plots`` as before.

Each returns the matplotlib ``Figure``; end the notebook line with ``;`` so it is drawn once.
``memory_bars(..., pyplot=False)`` makes a plain ``Figure`` that pyplot never sees: a widget callback,
which JupyterLab's kernel subshells run on another thread than the cells, draws that way.
"""

from parlab.lab.plots.colors import KIND_COLORS, MEMORY_COLORS, PIPELINE_COLORS
from parlab.lab.plots.comm import bandwidth, comm_bytes
from parlab.lab.plots.memory import memory_bars
from parlab.lab.plots.mesh import AXIS_TALK, mesh
from parlab.lab.plots.pipeline import pipeline
from parlab.lab.plots.steps import step_through
from parlab.lab.plots.tensors import matmul_split, rank_tensors
from parlab.lab.plots.timeline import LANES, gantt

__all__ = ["AXIS_TALK", "KIND_COLORS", "LANES", "MEMORY_COLORS", "PIPELINE_COLORS", "bandwidth", "comm_bytes", "gantt",
           "matmul_split", "memory_bars", "mesh", "pipeline", "rank_tensors", "step_through"]
