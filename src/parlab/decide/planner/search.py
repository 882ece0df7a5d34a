"""Searching the layouts of a cluster (chapter 07), and reading back the layout a recommendation names."""

from __future__ import annotations

import dataclasses
import re

from parlab.decide.planner import step
from parlab.decide.planner.hardware import Cluster
from parlab.decide.planner.step import Prediction
from parlab.decide.planner.workload import Layout, Workload, stage_layers


def candidates(workload: Workload, cluster: Cluster, zero_stages=(0, 1, 2, 3), chunks=(1,),
               **options) -> list[Prediction]:
    """Every layout of ``cluster`` the model and batch allow, predicted; those that fit first, fastest first.
    TP divides the query heads and the K/V heads (:meth:`~parlab.decide.planner.workload.Workload.tp_refusal`) and may span up to four nodes (tried, and priced at the links it crosses); PP is
    any number of stages up to the layers (uneven stages: :func:`stage_layers`); the batch must divide into
    whole micro-batches per replica. ``chunks``: the interleaving depths to try beside a pipeline (each
    where every chunk keeps a layer: :func:`~parlab.decide.planner.step.predict`); a ZeRO stage that no
    implementation runs beside a pipeline is left out (:func:`~parlab.decide.planner.step.unsupported`);
    ``options`` go to ``predict``
    (``implementation``, ``reshard``, ``tp_overlap``, ``without``); with ``tp_overlap=True`` the layouts with
    TP are priced with sequence parallelism, which the overlap needs (:func:`~parlab.decide.planner.step.predict`)."""
    return _candidates(workload, cluster, zero_stages, chunks, **options)


def _candidates(workload: Workload, cluster: Cluster, zero_stages=(0, 1, 2, 3), chunks=(1,),
                **options) -> list[Prediction]:
    n, out = cluster.world_size, []
    with_sp = (dataclasses.replace(workload, sequence_parallel=True)
               if options.get("tp_overlap") and not workload.sequence_parallel else workload)
    for tp in (t for t in range(1, min(n, 4 * cluster.gpus_per_node) + 1) if n % t == 0 and not workload.tp_refusal(t)
               and (t <= cluster.gpus_per_node and cluster.gpus_per_node % t == 0 or t % cluster.gpus_per_node == 0)):
        for pp in (p for p in range(1, workload.layers + 1) if n % (tp * p) == 0):
            dp = n // (tp * pp)
            if workload.global_batch % (dp * workload.micro_batch):
                continue
            smallest = min(stage_layers(workload, pp))
            for stage in (z for z in (zero_stages if dp > 1 else (0,))
                          if not step.unsupported(Layout(dp=dp, pp=pp, zero_stage=z),
                                                  options.get("implementation", "megatron"))):
                for v in (c for c in chunks if c == 1 or 1 < pp and c <= smallest):
                    out.append(step._predict(with_sp if tp > 1 else workload,
                                             Layout(dp=dp, tp=tp, pp=pp, zero_stage=stage), cluster, chunks=v, **options))
    return sorted(out, key=lambda p: (not p.fits, p.step_s))


def layout_of(label: str) -> Layout | None:
    """The layout a ``parlab.decide.advice`` recommendation names: ``"TP 8 × PP 2 × DP 2 + ZeRO-1"``, ``"DDP ×32"``,
    ``"ZeRO-3 ×8"``, ``"PP 8 × DP 1"``; ``None`` for one that leaves the stage open (``"ZeRO ×8"``: measure)."""
    zero = re.search(r"ZeRO-(\d)", label)
    stage = int(zero.group(1)) if zero else 0
    whole = re.match(r"(DDP|ZeRO(?:-\d)?) ×(\d+)", label)
    if whole:
        return None if whole.group(1) == "ZeRO" else Layout(dp=int(whole.group(2)), zero_stage=stage)
    axes = {name.lower(): int(size) for name, size in re.findall(r"\b(TP|PP|DP) (\d+)", label)}
    if not axes:
        raise ValueError(f"label={label!r} names no layout (e.g. 'TP 8 × PP 2 × DP 2 + ZeRO-1', 'DDP ×8')")
    return Layout(**axes, zero_stage=stage)
