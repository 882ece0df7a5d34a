"""Memory per rank under a layout (chapter 07): chapter 01's estimator, for the heaviest pipeline stage, with
the dense weights and the experts each sharded over their own ranks."""

from __future__ import annotations

from dataclasses import replace

from parlab.lab.measure.memory import MemoryEstimate, estimate_memory
from parlab.decide.planner.layout import Layout, stage_layers
from parlab.decide.planner.workload import Workload


def stage_memory(workload: Workload, layout: Layout, zero_stage: int, dense: float, experts: float = 0.0, *,
                 fp32_grads: bool = False, working_set: float = 0.0) -> MemoryEstimate:
    """:func:`parlab.lab.measure.estimate_memory` for the rank holding ``dense`` weights (its heaviest stage's
    share over tp) and ``experts`` (its share of the routed experts, over ep × etp): the model states of each
    under ``zero_stage``, ZeRO sharding the dense ones over dp × cp (HSDP: over its shard group × cp) and the
    experts over the ranks holding the same experts (edp); and the activations the estimator counts for the
    architecture (the first stage of a 1F1B pipeline keeps p micro-batches of its L/p layers: all the layers'
    worth, Korthikanti et al. 2022, §4.2.3), of seq_len/cp tokens under context parallelism. ``fp32_grads``:
    gradients kept in fp32 (Megatron-LM's bf16: 18 bytes per parameter with Adam). ``working_set``: bytes
    ZeRO-3 holds gathered beyond its shards (:func:`zero3_working_set`), added to the buckets."""
    w = workload
    precision = "bf16" if w.precision == "fp8" else w.precision  # FP8 keeps bf16 weights and fp32 masters
    common = dict(precision=precision, optimizer=w.optimizer, zero_stage=zero_stage,
                  fp32_grads=fp32_grads and precision != "fp32")
    # The config itself (a mixture of experts: its dense twin), so that activations follow the architecture
    # (chapter 01); the estimator builds it once on the meta device and caches it.
    acts = estimate_memory(w.dense, micro_batch=w.micro_batch, seq_len=w.seq_len, checkpointing=w.checkpointing,
                           attention=w.kept_attention, sequence_parallel=w.sequence_parallel and layout.tp > 1,
                           world_size=layout.tp * layout.pp, tp_size=layout.tp, pp_size=layout.pp, precision=precision)
    sharded = (layout.shard or layout.dp) * layout.cp
    states = estimate_memory(num_params=max(1, round(dense)), world_size=sharded, **common)
    notes = acts.notes + ((f"model states of the heaviest of {layout.pp} stages",) if layout.pp > 1 else ())
    if experts:
        edp = len(layout.group("edp"))
        held = max(1, edp // layout.replicas) if edp % layout.replicas == 0 else edp
        more = estimate_memory(num_params=max(1, round(experts)), world_size=held, **common)
        states = replace(states, params=states.params + more.params, grads=states.grads + more.grads,
                         optimizer=states.optimizer + more.optimizer)
        notes += (f"experts over ep {layout.ep} × etp {layout.etp}, sharded over {held}",)
    activations = -(-acts.activations // layout.cp)
    kept, eager = w.kept_layer_bytes(layout.tp), w.layer_bytes(layout.tp)
    if w.recompute == "op":  # what torchtitan's policy keeps, and one layer whole while it is recomputed
        whole = w.fused_layer_bytes(layout.tp) if w.fused else eager
        activations = round(activations * kept / eager + whole / layout.cp)
        notes += ("op-level selective checkpointing: every second matrix product's output and attention's kept",)
    elif w.fused and w.recompute != "full":  # what the fused kernels keep, against what the eager modules keep
        activations = round(activations * kept / eager)
        notes += ("fused kernels: what their matrix products and attention keep",)
    # offloaded: those layers' activations in host memory for each of the p micro-batches the first stage holds,
    # but one layer's in flight
    offloaded = layout.pp * min(w.offload_layers, max(stage_layers(w, layout.pp)) - 1)
    if offloaded > 1:
        activations -= round((offloaded - 1) * kept / layout.cp)
        notes += (f"offload: {offloaded} layer-micro-batches' activations in host memory, one in flight",)
    if layout.cp > 1:
        notes += (f"context parallel: activations of seq_len/{layout.cp} tokens per rank",)
    whole = replace(states, activations=activations, buckets=round(working_set), notes=notes + (
        (f"ZeRO-3's working set, {working_set / 1e9:.1f} GB gathered (in buckets)",) if working_set else ()))
    return whole


def zero3_working_set(workload: Workload, layout: Layout, *, units: int, grad_bytes: int,
                      root_kept: bool) -> float:
    """Bytes ZeRO-3 holds whole on a rank beyond its shards: ``units`` gathered blocks (one layer each: the
    one computing, and the next one when prefetching) in the compute dtype, each with its unsharded gradient
    of ``grad_bytes`` per value before the reduce-scatter, and the root (embeddings, output layer) when the
    implementation keeps it gathered through the step (FSDP2's ``fully_shard`` of the root module). DeepSpeed's
    estimator adds 4 × the largest layer likewise (``estimate_zero3_model_states_mem_needs``)."""
    w = workload
    block = units * w.rank_layer_params(layout) * (w.value_bytes + grad_bytes)
    return block + (w.root_params / (layout.tp * layout.pp) * w.value_bytes if root_kept else 0.0)
