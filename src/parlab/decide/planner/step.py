"""A layout's step (chapter 07): the slowest stage's computation, the bubble, TP's and PP's messages and data
parallelism's collectives (:mod:`parlab.decide.planner.data_parallel`), priced part by part."""

from __future__ import annotations

from dataclasses import dataclass, replace

from parlab.lab.checks import positive_int
from parlab.lab.measure.memory import MemoryEstimate
from parlab.decide.planner import memory as _memory
from parlab.decide.planner.data_parallel import STRATEGIES, bucket_count, predict_dp_step
from parlab.decide.planner.hardware import OPTIMIZER_BYTES_PER_PARAM, Cluster, collective_seconds, ring_costs
from parlab.decide.planner.workload import Layout, Workload, stage_layers, stage_params


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
    chunks: int = 1

    def tflops(self, peak: float) -> dict:
        """TFLOP/s per GPU, counted as MFU and as HFU count them (``peak``: the GPU's FLOP/s)."""
        return {"model": self.mfu * peak / 1e12, "hardware": self.hfu * peak / 1e12}

    def row(self) -> str:
        name = str(self.layout) + (f", {self.chunks} chunks" if self.chunks > 1 else "")
        return (f"{name:<28}{self.memory.total / 1e9:>8.1f} GB{' ' if self.fits else '!'}"
                f"{self.step_s:>9.3f} s   MFU {self.mfu:4.0%}   bubble {self.bubble:5.1%}   "
                + "  ".join(f"{k} {v:.3f}" for k, v in self.parts.items() if v > 0))


#: The cost terms :func:`predict` can leave out (``without=``), each to show what it adds (``tests/test_planner.py``).
TERMS = ("attention", "attention_kernel", "memory_bound", "recompute", "tp", "pp", "bubble", "dp", "dp_overlap",
         "latency", "optimizer")
#: DeepSpeed ZeRO-3's prefetch buffer, in parameters: ``stage3_prefetch_bucket_size``'s default, 5e7,
#: "maximum number of parameter elements to fetch ahead of use" (``deepspeed/runtime/zero/config.py``); a
#: tensor larger than it is gathered when needed, not ahead.
DEEPSPEED_PREFETCH_PARAMS = 5e7
#: DeepSpeed ZeRO-3's ``stage3_max_reuse_distance`` and ``stage3_max_live_parameters`` defaults, both 1e9
#: parameters (``deepspeed/runtime/zero/config.py``): a gathered parameter is released unless it will be used
#: again within that many parameters' fetches, and no more than that many are held gathered at once.
DEEPSPEED_MAX_REUSE_DISTANCE = 1e9
DEEPSPEED_MAX_LIVE_PARAMS = 1e9


def deepspeed_backward_gathers(layer_params: float, recompute: str) -> int:
    """All-gathers of one layer per backward under DeepSpeed's ZeRO-3 (:func:`zero3_step`'s
    ``backward_gathers``): 2 when full recomputation's forward gathers the layer and releases it before its
    backward gathers it again, else 1. It is released when the distance to its next use exceeds
    :data:`DEEPSPEED_MAX_REUSE_DISTANCE`: between a tensor's use in the recomputed forward and in the
    backward, every tensor of the layer is fetched once each way, 2 × ``layer_params`` (per rank); or when the
    layer alone exceeds :data:`DEEPSPEED_MAX_LIVE_PARAMS`. So a layer of more than 0.5 B parameters (GPT-3's
    1.8 B) is gathered three times a step, a smaller one twice."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute={recompute!r}; choose 'none', 'selective' or 'full'")
    if layer_params <= 0:
        raise ValueError(f"layer_params={layer_params!r} must be positive (one layer's parameters on a rank)")
    if recompute != "full":
        return 1
    kept = 2 * layer_params <= DEEPSPEED_MAX_REUSE_DISTANCE and layer_params <= DEEPSPEED_MAX_LIVE_PARAMS
    return 1 if kept else 2


def predict(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
            reshard: str | None = None, chunks: int = 1, tp_overlap: bool = False, without=(),
            grad_dtype: str | None = None) -> Prediction:
    """Memory per rank and seconds per step of ``workload`` under ``layout`` on ``cluster`` (a model: see
    the package docstring for what it counts and what it leaves out). ``implementation`` and ``reshard``: as
    :func:`predict_dp_step` takes them; ``reshard=None``: ZeRO-3 beside a pipeline as
    ``torch.distributed.pipelining`` runs FSDP2 (``"after_step"``), else FSDP2's default (``"after_forward"``).
    The implementation and precision also set the gradients' dtype, in memory and in the bytes reduced
    (:meth:`Workload.grad_bytes`): Megatron-LM in bf16 keeps and reduces them in fp32 (18 bytes per
    parameter), in fp16 in fp16; DeepSpeed's BF16_Optimizer (bf16, stage 0 or 1) in fp32 too; DeepSpeed's
    ZeRO-2/3 and the course in the compute dtype. ``grad_dtype`` (``"fp32"``, ``"bf16"``, ``"fp16"``) prices
    the dtype the run being priced used instead of that default (Megatron-Core's ``grad_reduce_in_fp32`` is
    off by default; FSDP2's ``reduce_dtype``). Each implementation's gradient buckets are its own
    (:func:`~parlab.decide.planner.data_parallel.bucket_bytes`). A ZeRO stage no implementation runs beside a pipeline
    (:func:`unsupported`: ZeRO-2, and DeepSpeed's ZeRO-3) is refused. ZeRO-3 is FSDP2's (one all-gather per block, the next
    block prefetched) except under ``"deepspeed"``: DeepSpeed's ZeRO-3 as Narayanan et al. 2021 ran it, one
    all-gather per parameter tensor, prefetched only where a tensor fits its prefetch buffer
    (:data:`DEEPSPEED_PREFETCH_PARAMS`). ``chunks``: model chunks per pipeline rank (the interleaved 1F1B
    schedule, chapter 06), at most the layers of the smallest stage: the bubble shrinks to (p − 1)/v slots
    of a whole stage, and a micro-batch crosses v times as many stage boundaries. ``tp_overlap``: TP's
    collectives run beside the matrix products (Megatron-LM's ``--tp-comm-overlap``, torchtitan's async
    TP), so only what exceeds the layers' computation counts, for a TP group inside a node (across nodes TP
    stays exposed: Transformer Engine's overlap is single-node); off as 2021 Megatron ran; with tp > 1 it needs
    ``workload.sequence_parallel``, as Megatron-LM refuses the overlap without SP. ``without``: cost
    terms left out (:data:`TERMS`), to see what each adds."""
    return _predict(workload, layout, cluster, implementation=implementation, reshard=reshard, chunks=chunks,
                    tp_overlap=tp_overlap, without=without, grad_dtype=grad_dtype)


def _predict(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
             reshard: str | None = None, chunks: int = 1, tp_overlap: bool = False, without=(),
             grad_dtype: str | None = None) -> Prediction:
    """:func:`predict` itself: the checks, then the step part by part, the bytes and the memory."""
    w, off = workload, set(without)
    m, stages, reshard, chunks, cluster = _checked(w, layout, cluster, reshard, chunks, off, implementation)
    if tp_overlap and layout.tp > 1 and not w.sequence_parallel:
        raise ValueError(f"tp_overlap=True with tp={layout.tp} needs sequence parallelism (Megatron-LM's arguments.py: "
                         f"TP communication/GEMM overlap 'can happen only when sequence parallelism is enabled'; "
                         f"torchtitan's async TP is built on it): use a Workload with sequence_parallel=True")
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    # the slowest stage sets the pipeline's pace; the heaviest holds the most memory
    work = [n + (w.output_flops / w.layer_flops if s == pp - 1 else 0.0) for s, n in enumerate(stages)]
    slow = max(range(pp), key=work.__getitem__)
    psi = max(stage_params(w, pp)) / tp  # weights of the heaviest rank
    layers_s, forward, backward = _computation(w, stages[slow], slow == pp - 1, tp, cluster, off)
    tp_forward, tp_backward, p2p_s = _messages(w, layout, cluster, stages[slow], chunks, off)
    # beside the layers' matrix products only what they cannot cover is exposed; inside a node only, as
    # Transformer Engine's comm+GEMM overlap runs (NVIDIA/TransformerEngine#1071): TP across nodes stays exposed
    if tp_overlap and cluster.link(layout.topology, "tp") == cluster.intra:
        output_s = forward - layers_s
        tp_forward, tp_backward = max(0.0, tp_forward - layers_s), max(0.0, tp_backward - (backward - 2 * output_s))
    # the pipeline's slots per step, (p − 1)/v of them the bubble (chapter 06)
    slots = m + (0 if "bubble" in off else (pp - 1) / chunks)
    forward_s = slots * (forward + tp_forward + p2p_s)
    backward_s = slots * (backward + tp_backward + p2p_s)
    optimizer_s = 0.0 if "optimizer" in off else psi * OPTIMIZER_BYTES_PER_PARAM / cluster.gpu.memory_bandwidth
    grad_value = w.grad_bytes(implementation, layout.zero_stage, grad_dtype)  # the run's, else its framework's
    zero3, deepspeed3 = layout.zero_stage == 3, layout.zero_stage == 3 and implementation == "deepspeed"
    prefetch = not deepspeed3 or w.layer_tensors[1] / tp <= DEEPSPEED_PREFETCH_PARAMS
    if dp > 1 and "dp" not in off:
        # ZeRO-3 (FSDP2, keeping its root from forward to backward): the root's share of this rank's weights
        root = w.root_params / (tp * pp) * w.value_bytes if zero3 else 0.0
        step = predict_dp_step(STRATEGIES[layout.zero_stage], ring_costs(cluster.link(layout.topology, "dp"), dp),
                               psi * w.value_bytes, dp, forward_s, backward_s, optimizer_s,
                               buckets=bucket_count(implementation, dp, psi * grad_value, grad_value),
                               blocks=max(1, stages[slow]), overlap=cluster.overlap and "dp_overlap" not in off,
                               micro_batches=m, root_bytes=root, implementation=implementation, reshard=reshard,
                               gathers_per_block=w.layer_tensors[0] if deepspeed3 else 1, prefetch=prefetch,
                               backward_gathers=(deepspeed_backward_gathers(w.layer_params / tp, w.recompute)
                                                 if deepspeed3 else 1),
                               reduce_bytes=psi * grad_value)
    else:
        step = forward_s + backward_s + optimizer_s / (dp if layout.zero_stage and dp > 1 else 1)
    parts = {"compute": m * (forward + backward), "bubble": (slots - m) * (forward + backward),
             "tp": slots * (tp_forward + tp_backward), "pp": slots * 2 * p2p_s,
             "optimizer": optimizer_s / (dp if layout.zero_stage else 1)}
    parts["dp"] = max(0.0, step - sum(parts.values()))
    bytes_by_axis = _bytes_by_axis(w, layout, stages[slow], m, chunks, psi, grad_value, reshard)
    # ZeRO-3 resharding only after the step holds the weights and whole gradients through it: stage 1's memory
    held_stage = 1 if zero3 and reshard == "after_step" else layout.zero_stage
    working = (_memory.zero3_working_set(w, layout, units=2 if prefetch else 1, grad_bytes=grad_value,
                                         root_kept=not deepspeed3) if held_stage == 3 and dp > 1 else 0.0)
    memory = _memory.stage_memory(w, layout, held_stage, psi, fp32_grads=grad_value == 4 and w.value_bytes == 2,
                                  working_set=working)
    peak = cluster.world_size * cluster.gpu.flops * step
    return Prediction(layout, memory, step, parts, bytes_by_axis, (slots - m) / slots, m,
                      memory.total <= cluster.gpu.memory, stages, w.model_flops() / peak, w.hardware_flops() / peak,
                      chunks)


def unsupported(layout: Layout, implementation: str = "megatron") -> str | None:
    """Why no implementation runs ``layout``'s ZeRO stage beside its pipeline, or ``None`` if one does
    (:func:`predict` refuses the first, :func:`~parlab.decide.planner.search.candidates` leaves it out).
    ZeRO-2 shards the gradients, but beside a pipeline every implementation keeps them whole through the
    step: DeepSpeed's ``PipelineEngine`` asserts a ZeRO stage below 2 (``deepspeed/runtime/pipe/engine.py``),
    Megatron-LM's distributed optimizer keeps a whole gradient buffer (ZeRO-1), FSDP2 under
    ``torch.distributed.pipelining`` keeps whole gradients until the last backward (chapter 07 §4), and the
    course's ``parallelize`` has no ZeRO-2. DeepSpeed's ZeRO-3 does not run beside its pipeline either;
    ZeRO-3 under ``"megatron"`` or ``"course"`` is FSDP2's, which does."""
    if implementation == "fsdp1" and layout.dp > 1 and (layout.zero_stage in (1, 2) or layout.pp > 1):
        return (f"{layout}: implementation 'fsdp1' prices PyTorch FSDP1 as llm-foundry ran it, FULL_SHARD without a "
                f"pipeline: zero_stage 3 (or 0, plain DDP) and pp=1; for ZeRO-1/2 or a pipeline use 'megatron', "
                f"'deepspeed' or 'course'")
    if layout.pp == 1 or layout.dp == 1 or layout.zero_stage < 2:
        return None
    if layout.zero_stage == 2:
        return (f"{layout}: ZeRO-2 beside a pipeline is run by no implementation priced here (DeepSpeed's "
                f"PipelineEngine asserts zero stage < 2; Megatron-LM's distributed optimizer and FSDP2 under "
                f"torch.distributed.pipelining keep whole gradients through the step, which is ZeRO-1's memory); "
                f"use zero_stage=1, or 3 (FSDP2: implementation 'megatron' or 'course')")
    if implementation == "deepspeed":
        return (f"{layout}: DeepSpeed's PipelineEngine asserts zero stage < 2, so its ZeRO-3 does not run beside "
                f"a pipeline; use zero_stage=1, or implementation='course' (FSDP2 under torch.distributed.pipelining)")
    return None


def _checked(w: Workload, layout: Layout, cluster: Cluster, reshard, chunks, off, implementation="megatron"):
    """(micro-batches per replica, layers per stage, reshard, chunks, cluster) once the arguments are checked;
    ``"latency"`` left out: the cluster's links with α = 0."""
    topo = layout.topology
    chunks = positive_int("chunks", chunks, "model chunks per pipeline rank (1: no interleaving)")
    if off - set(TERMS):
        raise ValueError(f"without={sorted(off - set(TERMS))}: not cost terms; choose from {', '.join(TERMS)}")
    if topo.world_size != cluster.world_size:
        raise ValueError(f"layout {layout} uses {topo.world_size} ranks; the cluster has {cluster.world_size}")
    if layout.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={layout.zero_stage!r} must be 0, 1, 2 or 3")
    why = unsupported(layout, implementation) or w.tp_refusal(layout.tp)
    if why:
        raise ValueError(why)
    if reshard is None:
        reshard = "after_step" if layout.pp > 1 else "after_forward"
    dp, pp = layout.dp, layout.pp
    if w.global_batch % (dp * w.micro_batch):
        raise ValueError(f"global_batch={w.global_batch} does not split into dp={dp} replicas of micro-batches "
                         f"of {w.micro_batch}")
    stages = stage_layers(w, pp)
    if chunks > 1 and (pp == 1 or chunks > min(stages)):
        raise ValueError(f"chunks={chunks}: each of a pipeline rank's chunks needs at least one layer; "
                         + ("pp=1 has no pipeline to interleave (use chunks=1)" if pp == 1 else
                            f"{w.layers} layers on pp={pp} stages leave {min(stages)} on the smallest, so chunks "
                            f"may be 1 to {min(stages)}"))
    if "latency" in off:
        cluster = replace(cluster, intra=replace(cluster.intra, alpha=0.0), inter=replace(cluster.inter, alpha=0.0))
    return w.global_batch // (dp * w.micro_batch), stages, reshard, chunks, cluster


def _computation(w: Workload, layers: int, last: bool, tp: int, cluster: Cluster, off) -> tuple[float, float, float]:
    """(the layers' forward, the whole forward, the backward) of one micro-batch on the slowest stage's rank,
    which holds ``layers`` layers (and the output layer if ``last``), in seconds."""
    tokens, rate = w.micro_batch * w.seq_len, cluster.gpu.flops * cluster.utilization
    attention = 0.0 if "attention" in off else w.attention_flops
    # a fused kernel (sdpa) runs attention's FLOPs at its own published rate where the GPU has one; eager
    # attention's QKᵀ and weighted sum are matrix products like the rest
    kernel = cluster.gpu.attention_flops if w.attention == "sdpa" and "attention_kernel" not in off else None
    attention_s = layers * attention * tokens / tp / (kernel or rate)
    layers_s = layers * (w.layer_flops - w.attention_flops) * tokens / tp / rate + attention_s
    output_s = (w.output_flops * tokens / tp / rate) if last else 0.0
    # the layers' memory-bound work: what they save for backward, read and written once per pass at HBM speed
    if "memory_bound" not in off:
        layers_s += layers * w.layer_bytes(tp) / cluster.gpu.memory_bandwidth
    forward = layers_s + output_s
    redo = {"full": layers_s, "selective": attention_s}[w.recompute] \
        if w.recompute != "none" and "recompute" not in off else 0.0
    # backward: twice the forward, plus what recomputation redoes (the layers' forward, or their attention
    # core); a fused attention kernel's backward recomputes the scores too (Workload.fused_backward_flops)
    fused = attention_s * w.fused_backward_flops / w.attention_flops
    return layers_s, forward, 2 * forward + redo + fused


def _messages(w: Workload, layout: Layout, cluster: Cluster, layers: int, chunks: int, off) -> tuple[float, float, float]:
    """(TP's forward, TP's backward, one pipeline boundary's messages) per micro-batch on the slowest stage."""
    topo, tp, pp = layout.topology, layout.tp, layout.pp
    activation = w.micro_batch * w.seq_len * w.hidden * w.value_bytes  # one (b, s, h) tensor
    tp_link, pp_link = cluster.link(topo, "tp"), cluster.link(topo, "pp")
    # Megatron's TP: two all-reduces forward and two backward per layer, two more when recomputing (SP's
    # all-gather and reduce-scatter in their place move the same bytes in as many ring steps)
    all_reduce = collective_seconds("all_reduce", activation, ring_costs(tp_link, tp)) if tp > 1 else 0.0
    if "tp" in off:
        all_reduce = 0.0
    tp_forward = 2 * layers * all_reduce
    tp_backward = (2 + (2 if w.checkpointing else 0)) * layers * all_reduce
    # between stages each TP rank sends 1/t of the activation, and the next stage's TP group all-gathers it
    # over its own link (Narayanan et al. 2021, §4.1, the scatter/gather optimisation)
    p2p_s = 0.0
    if pp > 1 and "pp" not in off:
        p2p_s = collective_seconds("send", activation / tp, ring_costs(pp_link, pp))
        if tp > 1:
            p2p_s += collective_seconds("all_gather", activation, ring_costs(tp_link, tp))
    return tp_forward, tp_backward, p2p_s * chunks  # interleaved: every chunk's boundary is a send


def _bytes_by_axis(w: Workload, layout: Layout, layers: int, m: int, chunks: int, psi: float, grad_value: int,
                   reshard: str) -> dict:
    """Bytes each rank sends per step on each axis (nccl-tests sizes)."""
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    activation = w.micro_batch * w.seq_len * w.hidden * w.value_bytes
    weights, reduced = psi * w.value_bytes, psi * grad_value  # what ZeRO gathers; one reduce-scatter's bytes
    root = w.root_params / (tp * pp) * w.value_bytes if layout.zero_stage == 3 else 0.0
    zero3 = {"after_forward": m * (2 * weights - root + reduced),  # FSDP2 gathers its root once per pass
             "after_backward": m * (weights + reduced), "after_step": weights + reduced}[reshard]
    dp_bytes = {0: reduced, 1: reduced + weights, 2: m * reduced + weights, 3: zero3}[layout.zero_stage]
    tp_calls = (6 if w.checkpointing else 4) * layers * m
    return {"dp": dp_bytes if dp > 1 else 0, "tp": tp_calls * activation if tp > 1 else 0,
            "pp": 2 * m * chunks * activation / tp if pp > 1 else 0}
