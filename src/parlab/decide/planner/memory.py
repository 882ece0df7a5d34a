"""Memory per rank under a layout (chapter 07): chapter 01's estimator, for the heaviest pipeline stage."""

from __future__ import annotations

from dataclasses import replace

from parlab.lab.measure.memory import MemoryEstimate, estimate_memory
from parlab.decide.planner.workload import Layout, Workload


def stage_memory(workload: Workload, layout: Layout, zero_stage: int, weights: float, *, fp32_grads: bool = False,
                 working_set: float = 0.0) -> MemoryEstimate:
    """:func:`parlab.lab.measure.estimate_memory` for the rank holding ``weights`` (its heaviest stage's share):
    the model states of those weights under ``zero_stage`` over the dp ranks, and the activations the
    estimator counts for the architecture (the first stage of a 1F1B pipeline keeps p micro-batches of its
    L/p layers: all the layers' worth, Korthikanti et al. 2022, §4.2.3). ``fp32_grads``: gradients kept in
    fp32 (Megatron-LM's bf16: 18 bytes per parameter with Adam). ``working_set``: bytes ZeRO-3 holds
    gathered beyond its shards (:func:`zero3_working_set`), added to the weights and gradients."""
    w, n = workload, layout.dp * layout.tp * layout.pp
    common = dict(precision=w.precision, optimizer=w.optimizer, world_size=n, zero_stage=zero_stage,
                  tp_size=layout.tp, pp_size=layout.pp, fp32_grads=fp32_grads and w.precision != "fp32")
    # The config itself, so that activations follow the architecture (chapter 01); the estimator builds it
    # once on the meta device and caches it, so pricing many layouts costs no rebuilds.
    whole = estimate_memory(w.config, micro_batch=w.micro_batch, seq_len=w.seq_len, checkpointing=w.checkpointing,
                            attention=w.kept_attention, sequence_parallel=w.sequence_parallel and layout.tp > 1,
                            **common)
    if layout.pp > 1:
        states = estimate_memory(num_params=max(1, round(weights * layout.tp * layout.pp)), **common)
        whole = replace(states, activations=whole.activations, notes=whole.notes + (
            f"model states of the heaviest of {layout.pp} stages",))
    if not working_set:
        return whole
    return replace(whole, buckets=whole.buckets + round(working_set), notes=whole.notes + (
        f"ZeRO-3's working set, {working_set / 1e9:.1f} GB gathered (in buckets)",))


def zero3_working_set(workload: Workload, layout: Layout, *, units: int, grad_bytes: int,
                      root_kept: bool) -> float:
    """Bytes ZeRO-3 holds whole on a rank beyond its shards: ``units`` gathered blocks (one layer each: the
    one computing, and the next one when prefetching) in the compute dtype, each with its unsharded gradient
    of ``grad_bytes`` per value before the reduce-scatter, and the root (embeddings, output layer) when the
    implementation keeps it gathered through the step (FSDP2's ``fully_shard`` of the root module). DeepSpeed's
    estimator adds 4 × the largest layer likewise (``estimate_zero3_model_states_mem_needs``)."""
    w, tp = workload, layout.tp
    block = units * w.layer_params / tp * (w.value_bytes + grad_bytes)
    return block + (w.root_params / (tp * layout.pp) * w.value_bytes if root_kept else 0.0)
