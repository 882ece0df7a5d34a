"""A layout's step (chapter 07): the slowest stage's computation, the bubble, TP's and PP's messages and data
parallelism's collectives (:mod:`parlab.planner.data_parallel`), priced part by part."""

from __future__ import annotations

import math
from dataclasses import dataclass

from parlab.checks import positive_int
from parlab.measure.memory import MemoryEstimate
from parlab.planner import memory as _memory
from parlab.planner.data_parallel import STRATEGIES, predict_dp_step
from parlab.planner.hardware import BUCKET_BYTES, OPTIMIZER_BYTES_PER_PARAM, Cluster, collective_seconds, ring_costs
from parlab.planner.workload import Layout, Workload, stage_layers, stage_params


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` says of one layout: memory per rank (its heaviest pipeline stage), seconds per
    step and where they go, bytes each rank sends per step on each axis (nccl-tests sizes), the bubble, the
    layers per stage, and the model's and the hardware's FLOPs utilisation (``mfu``, ``hfu``)."""

    layout: Layout
    memory: MemoryEstimate
    step_s: float
    parts: dict
    bytes_by_axis: dict
    bubble: float
    micro_batches: int
    fits: bool
    stages: tuple = ()
    mfu: float = 0.0
    hfu: float = 0.0

    def tflops(self, peak: float) -> dict:
        """TFLOP/s per GPU, counted as MFU and as HFU count them (``peak``: the GPU's FLOP/s)."""
        return {"model": self.mfu * peak / 1e12, "hardware": self.hfu * peak / 1e12}

    def row(self) -> str:
        return (f"{str(self.layout):<28}{self.memory.total / 1e9:>8.1f} GB{' ' if self.fits else '!'}"
                f"{self.step_s:>9.3f} s   MFU {self.mfu:4.0%}   bubble {self.bubble:5.1%}   "
                + "  ".join(f"{k} {v:.3f}" for k, v in self.parts.items() if v > 0))


def predict(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
            reshard: str | None = None, chunks: int = 1) -> Prediction:
    """Memory per rank and seconds per step of ``workload`` under ``layout`` on ``cluster`` (a model: see
    the module docstring for what it counts and what it leaves out). ``implementation`` and ``reshard``: as
    :func:`predict_dp_step` takes them; ``reshard=None``: ZeRO-3 beside a pipeline as
    ``torch.distributed.pipelining`` runs FSDP2 (``"after_step"``), else FSDP2's default (``"after_forward"``).
    ``chunks``: model chunks per pipeline rank (the interleaved 1F1B schedule, chapter 06): the bubble
    shrinks to (p − 1)/v slots of a whole stage, and a micro-batch crosses v times as many stage boundaries."""
    return _predict(workload, layout, cluster, implementation=implementation, reshard=reshard, chunks=chunks)


def _predict(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
             reshard: str | None = None, chunks: int = 1) -> Prediction:
    """:func:`predict` itself."""
    topo = layout.topology
    chunks = positive_int("chunks", chunks, "model chunks per pipeline rank (1: no interleaving)")
    if topo.world_size != cluster.world_size:
        raise ValueError(f"layout {layout} uses {topo.world_size} ranks; the cluster has {cluster.world_size}")
    if layout.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={layout.zero_stage!r} must be 0, 1, 2 or 3")
    if reshard is None:
        reshard = "after_step" if layout.pp > 1 else "after_forward"
    w, (dp, tp, pp) = workload, (layout.dp, layout.tp, layout.pp)
    if w.global_batch % (dp * w.micro_batch):
        raise ValueError(f"global_batch={w.global_batch} does not split into dp={dp} replicas of micro-batches "
                         f"of {w.micro_batch}")
    m = w.global_batch // (dp * w.micro_batch)  # micro-batches per replica per step
    stages = stage_layers(w, pp)
    # the slowest stage sets the pipeline's pace; the heaviest holds the most memory
    work = [n + (w.output_flops / w.layer_flops if s == pp - 1 else 0.0) for s, n in enumerate(stages)]
    slow = max(range(pp), key=work.__getitem__)
    psi = max(stage_params(w, pp)) / tp  # weights of the heaviest rank
    tokens = w.micro_batch * w.seq_len
    rate = cluster.gpu.flops * cluster.utilization
    layers_s = stages[slow] * w.layer_flops * tokens / tp / rate  # one micro-batch's forward of its layers
    output_s = (w.output_flops * tokens / tp / rate) if slow == pp - 1 else 0.0
    # the layers' memory-bound work: what they save for backward, read and written once per pass at HBM speed
    layers_s += stages[slow] * w.layer_bytes(tp) / cluster.gpu.memory_bandwidth
    forward = layers_s + output_s
    backward = 2 * forward + (layers_s if w.checkpointing else 0.0)  # recomputation redoes the layers' forward
    activation = w.micro_batch * w.seq_len * w.hidden * w.value_bytes  # one (b, s, h) tensor
    tp_link, pp_link = cluster.link(topo, "tp"), cluster.link(topo, "pp")
    # Megatron's TP: two all-reduces forward and two backward per layer, two more when recomputing
    all_reduce = collective_seconds("all_reduce", activation, ring_costs(tp_link, tp)) if tp > 1 else 0.0
    tp_forward = 2 * stages[slow] * all_reduce
    tp_backward = (2 + (2 if w.checkpointing else 0)) * stages[slow] * all_reduce
    # between stages each TP rank sends 1/t of the activation, and the next stage's TP group all-gathers it
    # over its own link (Narayanan et al. 2021, §4.1, the scatter/gather optimisation)
    p2p_s = 0.0
    if pp > 1:
        p2p_s = collective_seconds("send", activation / tp, ring_costs(pp_link, pp))
        if tp > 1:
            p2p_s += collective_seconds("all_gather", activation, ring_costs(tp_link, tp))
    p2p_s *= chunks  # interleaved: every chunk's boundary is a send
    slots = m + (pp - 1) / chunks  # the pipeline's slots per step, (p − 1)/v of them the bubble (chapter 06)
    forward_s = slots * (forward + tp_forward + p2p_s)
    backward_s = slots * (backward + tp_backward + p2p_s)
    optimizer_s = psi * OPTIMIZER_BYTES_PER_PARAM / cluster.gpu.memory_bandwidth
    grad_bytes = psi * w.value_bytes
    # ZeRO-3 (FSDP2, keeping its root from forward to backward): the root's share of this rank's weights,
    # spread over the stages as evenly as the weights are
    root = w.root_params / (tp * pp) * w.value_bytes if layout.zero_stage == 3 else 0.0
    if dp > 1:
        step = predict_dp_step(STRATEGIES[layout.zero_stage], ring_costs(cluster.link(topo, "dp"), dp), grad_bytes,
                               dp, forward_s, backward_s, optimizer_s,
                               buckets=max(1, math.ceil(grad_bytes / BUCKET_BYTES)), blocks=max(1, stages[slow]),
                               overlap=cluster.overlap, micro_batches=m, root_bytes=root,
                               implementation=implementation, reshard=reshard)
    else:
        step = forward_s + backward_s + optimizer_s
    optimizer_part = optimizer_s / (dp if layout.zero_stage else 1)
    parts = {"compute": m * (forward + backward), "bubble": (slots - m) * (forward + backward),
             "tp": slots * (tp_forward + tp_backward), "pp": slots * 2 * p2p_s, "optimizer": optimizer_part}
    parts["dp"] = max(0.0, step - sum(parts.values()))
    zero3_bytes = {"after_forward": m * (3 * grad_bytes - root),  # FSDP2 gathers its root once per pass
                   "after_backward": 2 * m * grad_bytes, "after_step": 2 * grad_bytes}[reshard]
    dp_bytes = {0: grad_bytes, 1: 2 * grad_bytes, 2: (m + 1) * grad_bytes, 3: zero3_bytes}[layout.zero_stage]
    tp_calls = (6 if w.checkpointing else 4) * stages[slow] * m
    bytes_by_axis = {"dp": dp_bytes if dp > 1 else 0, "tp": tp_calls * activation if tp > 1 else 0,
                     "pp": 2 * m * chunks * activation / tp if pp > 1 else 0}
    # ZeRO-3 resharding only after the step holds the weights and whole gradients through it: stage 1's memory
    held_stage = 1 if layout.zero_stage == 3 and reshard == "after_step" else layout.zero_stage
    memory = _memory.stage_memory(w, layout, held_stage, psi)
    peak = cluster.world_size * cluster.gpu.flops * step
    return Prediction(layout, memory, step, parts, bytes_by_axis, (slots - m) / slots, m,
                      memory.total <= cluster.gpu.memory, stages, w.model_flops() / peak, w.hardware_flops() / peak)
