"""Searching the layouts of a cluster (chapter 07), and reading back the layout a recommendation names."""

from __future__ import annotations

import dataclasses
import re

from parlab.decide.planner import step
from parlab.decide.planner.hardware import Cluster
from parlab.decide.planner.step import Prediction
from parlab.decide.planner.layout import Layout
from parlab.decide.planner.workload import Workload
from parlab.decide.planner.layout import stage_layers


def candidates(workload: Workload, cluster: Cluster, zero_stages=(0, 1, 2, 3), vp=(1,), cp=(1,), ep=None,
               hsdp: bool = False, **options) -> list[Prediction]:
    """Every layout of ``cluster`` the model and batch allow, predicted; those that fit first, fastest first.
    TP divides the query heads and the K/V heads (:meth:`~parlab.decide.planner.workload.Workload.tp_refusal`)
    and may span up to four NVLink domains (tried, and priced at the links it crosses); PP is any number of
    stages up to the layers (uneven stages: :func:`stage_layers`); the batch must divide into whole
    micro-batches per replica. ``vp``: the interleaving depths to try beside a pipeline (each where every
    chunk keeps a layer: :func:`~parlab.decide.planner.step.predict`); ``cp``: the context-parallel sizes to
    try (each dividing the sequence into 2 × cp chunks); ``ep``: the expert-parallel sizes to try for a
    mixture of experts, by default every one dividing its experts and tp × cp × dp (etp 1), with etp = tp
    tried beside it; ``hsdp``: also try each sharded stage over groups of one NVLink domain's dp ranks,
    replicated across. A ZeRO stage that no implementation runs beside a pipeline is left out
    (:func:`~parlab.decide.planner.step.unsupported`); ``options`` go to ``predict`` (``implementation``,
    ``reshard``, ``tp_overlap``, ``ep_overlap``, ``without``); with ``tp_overlap=True`` the layouts with TP are
    priced with sequence parallelism, which the overlap needs (:func:`~parlab.decide.planner.step.predict`)."""
    return _candidates(workload, cluster, zero_stages, vp, cp, ep, hsdp, **options)


def _layouts(workload: Workload, cluster: Cluster, zero_stages, vp, cp, ep, hsdp, implementation):
    """Every layout :func:`candidates` prices, as (layout) in turn."""
    n, node, w = cluster.world_size, cluster.domain, workload
    for tp in (t for t in range(1, min(n, 4 * node) + 1) if n % t == 0 and not w.tp_refusal(t)
               and (t <= node and node % t == 0 or t % node == 0)):
        for c in (c for c in cp if n % (tp * c) == 0 and w.seq_len % (2 * c) == 0):
            for pp in (p for p in range(1, w.layers + 1) if n % (tp * c * p) == 0):
                dp = n // (tp * c * pp)
                if w.global_batch % (dp * w.micro_batch):
                    continue
                smallest = min(stage_layers(w, pp))
                for stage in (z for z in (zero_stages if dp * c > 1 else (0,))
                              if not step.unsupported(Layout(dp=dp, pp=pp, zero_stage=z), implementation)):
                    shards = (None,) + (tuple(s for s in range(1, dp) if dp % s == 0 and s * c * tp == node)
                                        if hsdp and stage else ())
                    for v in (v for v in vp if v == 1 or 1 < pp and v <= smallest):
                        for shard in shards:
                            for e, etp in _expert_sizes(w, tp, c, dp, ep):
                                yield Layout(dp=dp, tp=tp, pp=pp, cp=c, ep=e, etp=etp, vp=v, zero_stage=stage,
                                             shard=shard)


def _expert_sizes(w: Workload, tp: int, cp: int, dp: int, ep):
    """(ep, etp) pairs to try: (1, 1) for a dense model; else each ep of ``ep`` (every divisor of the experts
    by default) that the folded ranks allow, with etp 1 and, where tp > 1, etp = tp."""
    if not w.experts:
        yield 1, 1
        return
    sizes = ep or [e for e in range(1, w.experts[0] + 1) if w.experts[0] % e == 0]
    for e in sizes:
        for etp in sorted({1, tp}):
            if (tp * cp * dp) % (e * etp) == 0:
                yield e, etp


def _candidates(workload: Workload, cluster: Cluster, zero_stages=(0, 1, 2, 3), vp=(1,), cp=(1,), ep=None,
                hsdp=False, **options) -> list[Prediction]:
    with_sp = (dataclasses.replace(workload, sequence_parallel=True)
               if options.get("tp_overlap") and not workload.sequence_parallel else workload)
    out = [step._predict(with_sp if layout.tp > 1 else workload, layout, cluster, **options)
           for layout in _layouts(workload, cluster, zero_stages, vp, cp, ep, hsdp,
                                  options.get("implementation", "megatron"))]
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
