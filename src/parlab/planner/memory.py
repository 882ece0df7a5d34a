"""Memory per rank under a layout (chapter 07): chapter 01's estimator, for the heaviest pipeline stage."""

from __future__ import annotations

from dataclasses import replace

from parlab.measure.memory import MemoryEstimate, estimate_memory
from parlab.planner.workload import Layout, Workload


def stage_memory(workload: Workload, layout: Layout, zero_stage: int, weights: float) -> MemoryEstimate:
    """:func:`parlab.measure.estimate_memory` for the rank holding ``weights`` (its heaviest stage's share):
    the model states of those weights under ``zero_stage`` over the dp ranks, and the activations the
    estimator counts for the architecture (the first stage of a 1F1B pipeline keeps p micro-batches of its
    L/p layers: all the layers' worth, Korthikanti et al. 2022, §4.2.3)."""
    w, n = workload, layout.dp * layout.tp * layout.pp
    common = dict(precision=w.precision, optimizer=w.optimizer, world_size=n, zero_stage=zero_stage,
                  tp_size=layout.tp, pp_size=layout.pp)
    # The config itself, so that activations follow the architecture (chapter 01); the estimator builds it
    # once on the meta device and caches it, so pricing many layouts costs no rebuilds.
    whole = estimate_memory(w.config, micro_batch=w.micro_batch, seq_len=w.seq_len, checkpointing=w.checkpointing,
                            **common)
    if layout.pp == 1:
        return whole
    states = estimate_memory(num_params=max(1, round(weights * layout.tp * layout.pp)), **common)
    return replace(states, activations=whole.activations, notes=whole.notes + (
        f"model states of the heaviest of {layout.pp} stages",))
