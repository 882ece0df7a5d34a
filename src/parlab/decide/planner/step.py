"""A layout's step (chapter 07): the slowest stage's computation, the bubble, TP's and PP's messages and data
parallelism's collectives (:mod:`parlab.decide.planner.data_parallel`), priced part by part."""

from __future__ import annotations

import numbers

from dataclasses import dataclass, replace

from parlab.lab.measure.memory import MemoryEstimate
from parlab.decide.planner import memory as _memory
from parlab.decide.planner.data_parallel import STRATEGIES, bucket_count, predict_dp_step
from parlab.decide.planner.hardware import OPTIMIZER_BYTES_PER_PARAM, Cluster, collective_seconds, ring_costs
from parlab.decide.planner.layout import Layout
from parlab.decide.planner import terms as _terms
from parlab.decide.planner.recompute import blend, recomputed_share
from parlab.decide.planner.layout import stage_layers, stage_params
from parlab.decide.planner.workload import Workload


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` says of one layout: memory per rank (its heaviest pipeline stage), seconds per
    step and where they go, bytes each rank sends per step on each axis (nccl-tests sizes), the bubble, the
    layers per stage, and the model's and the hardware's FLOPs utilisation (``mfu``, ``hfu``; against the
    GPU's 16-bit peak whatever the precision, as the field reports FP8 runs: Llama 3, torchtitan)."""

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
        name = str(self.layout)
        return (f"{name:<28}{self.memory.total / 1e9:>8.1f} GB{' ' if self.fits else '!'}"
                f"{self.step_s:>9.3f} s   MFU {self.mfu:4.0%}   bubble {self.bubble:5.1%}   "
                + "  ".join(f"{k} {v:.3f}" for k, v in self.parts.items() if v > 0))


#: The cost terms :func:`predict` can leave out (``without=``), each to show what it adds (``tests/test_planner.py``).
TERMS = ("attention", "attention_kernel", "memory_bound", "recompute", "tp", "pp", "bubble", "dp", "dp_overlap",
         "latency", "optimizer", "fp8_scaling", "cp", "ep", "expert_fixed")
#: DeepSpeed ZeRO-3's prefetch buffer, in parameters: ``stage3_prefetch_bucket_size``'s default, 5e7,
#: "maximum number of parameter elements to fetch ahead of use" (``deepspeed/runtime/zero/config.py``); a
#: tensor larger than it is gathered when needed, not ahead.
DEEPSPEED_PREFETCH_PARAMS = 5e7
#: DeepSpeed ZeRO-3's ``stage3_max_reuse_distance`` and ``stage3_max_live_parameters`` defaults, both 1e9
#: parameters (``deepspeed/runtime/zero/config.py``): a gathered parameter is released unless it will be used
#: again within that many parameters' fetches, and no more than that many are held gathered at once.
DEEPSPEED_MAX_REUSE_DISTANCE = 1e9
DEEPSPEED_MAX_LIVE_PARAMS = 1e9
#: The share of the TP collectives that the layers' products cover which ``tp_overlap=True`` hides, per
#: implementation of TP: effective shares fitted on published runs (:data:`~parlab.decide.planner.field.TP_OVERLAP_FITTED`),
#: carrying what the planner prices TP at and what splitting the products costs, not only what the overlap hides.
#: Transformer Engine's comm+GEMM overlap (``"megatron"``): 0.27, on Megatron-Bridge's four runs with TP 4 (0.270,
#: loosely: ``docs/planner.md``; all of it was assumed before, which priced its held-out 405B with TP 8 on 1,024 H100
#: 22 % fast, now 8 %). PyTorch's async TP (``"course"``, torchtitan's): 0.2, on the one pair of runs that differ in
#: async TP alone (0.194). ``"deepspeed"`` and ``"fsdp1"`` run Megatron-LM's TP (:data:`TP_OF`).
TP_OVERLAP_HIDDEN = {"megatron": 0.27, "course": 0.2}
TP_OF = {"deepspeed": "megatron", "fsdp1": "megatron"}


def deepspeed_backward_gathers(layer_params: float, recompute: str) -> int:
    """All-gathers of one layer per backward under DeepSpeed's ZeRO-3 (:func:`zero3_step`'s
    ``backward_gathers``): 2 when full recomputation's forward gathers the layer and releases it before its
    backward gathers it again, else 1. It is released when the distance to its next use exceeds
    :data:`DEEPSPEED_MAX_REUSE_DISTANCE`: between a tensor's use in the recomputed forward and in the
    backward, every tensor of the layer is fetched once each way, 2 × ``layer_params`` (per rank); or when the
    layer alone exceeds :data:`DEEPSPEED_MAX_LIVE_PARAMS`. So a layer of more than 0.5 B parameters (GPT-3's
    1.8 B) is gathered three times a step, a smaller one twice."""
    if recompute not in ("none", "selective", "op", "full"):
        raise ValueError(f"recompute={recompute!r}; choose 'none', 'selective', 'op' or 'full'")
    if layer_params <= 0:
        raise ValueError(f"layer_params={layer_params!r} must be positive (one layer's parameters on a rank)")
    if recompute != "full":
        return 1
    kept = 2 * layer_params <= DEEPSPEED_MAX_REUSE_DISTANCE and layer_params <= DEEPSPEED_MAX_LIVE_PARAMS
    return 1 if kept else 2


def predict(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
            reshard: str | None = None, tp_overlap: bool | float = False, ep_overlap: bool = False, without=(),
            grad_dtype: str | None = None) -> Prediction:
    """Memory per rank and seconds per step of ``workload`` under ``layout`` on ``cluster`` (a model: see
    the package docstring for what it counts and what it leaves out). The layout carries its axes (dp, tp,
    pp, cp, ep, etp, vp, HSDP's shard), the workload its model and precision, the cluster its GPU's rates and
    links. ``implementation`` and ``reshard``: as :func:`predict_dp_step` takes them; ``reshard=None``: ZeRO-3
    beside a pipeline as ``torch.distributed.pipelining`` runs FSDP2 (``"after_step"``), else FSDP2's default
    (``"after_forward"``). The implementation and precision also set the gradients' dtype, in memory and in
    the bytes reduced (:meth:`Workload.grad_bytes`): Megatron-LM in bf16 or FP8 keeps and reduces them in
    fp32 (18 bytes per parameter), in fp16 in fp16; DeepSpeed's BF16_Optimizer (bf16, stage 0 or 1) in fp32
    too; DeepSpeed's ZeRO-2/3 and the course in the compute dtype. ``grad_dtype`` (``"fp32"``, ``"bf16"``,
    ``"fp16"``) prices the dtype the run being priced used instead of that default (Megatron-Core's
    ``grad_reduce_in_fp32`` is off by default; FSDP2's ``reduce_dtype``). Each implementation's gradient
    buckets are its own (:func:`~parlab.decide.planner.data_parallel.bucket_bytes`). A ZeRO stage no
    implementation runs beside a pipeline (:func:`unsupported`: ZeRO-2, and DeepSpeed's ZeRO-3) is refused.
    ZeRO-3 is FSDP2's (one all-gather per block, the next block prefetched) except under ``"deepspeed"``:
    DeepSpeed's ZeRO-3 as Narayanan et al. 2021 ran it, one all-gather per parameter tensor, prefetched only
    where a tensor fits its prefetch buffer (:data:`DEEPSPEED_PREFETCH_PARAMS`). ``layout.vp``: model chunks
    per pipeline rank (the interleaved 1F1B schedule, chapter 06), at most the layers of the smallest stage:
    the bubble shrinks to (p − 1)/v slots of a whole stage, and a micro-batch crosses v times as many stage
    boundaries. ``tp_overlap``: TP's collectives run beside the matrix products (Megatron-LM's
    ``--tp-comm-overlap``, torchtitan's async TP), so only what exceeds the layers' computation counts (of what
    they cover, the implementation's share :data:`TP_OVERLAP_HIDDEN` is hidden; a number from 0 to 1 sets the
    share instead), for a
    TP group inside an NVLink domain (across domains TP stays exposed: Transformer Engine's overlap is
    single-node); off as 2021 Megatron ran; with tp > 1 it needs ``workload.sequence_parallel``, as
    Megatron-LM refuses the overlap without SP. ``ep_overlap``: the experts' all-to-alls run beside another
    micro-batch's computation (DeepSeek-V3's DualPipe, Megatron-Core's ``--overlap-moe-expert-parallel-comm``),
    so only what exceeds it counts; off: exposed. ``without``: cost terms left out (:data:`TERMS`), to see
    what each adds. A workload that recomputes only some layers (``recompute_layers``) is priced between the
    predictions without recomputation and with all of it, weighted by :func:`~parlab.decide.planner.recompute.recomputed_share`."""
    return _predict(workload, layout, cluster, implementation=implementation, reshard=reshard,
                    tp_overlap=tp_overlap, ep_overlap=ep_overlap, without=without, grad_dtype=grad_dtype)


def _predict(workload: Workload, layout: Layout, cluster: Cluster, **options) -> Prediction:
    """:func:`predict` itself, and :func:`~parlab.decide.planner.search.candidates`' for each layout: a workload
    that recomputes some layers priced between no recomputation and all of it
    (:func:`~parlab.decide.planner.recompute.blend`), else
    :func:`_priced`."""
    share = recomputed_share(workload, layout)
    whole = workload if workload.recompute_layers is None else replace(workload, recompute_layers=None)
    if share == 1.0:
        return _priced(whole, layout, cluster, **options)
    kept = replace(workload, recompute="none", checkpointing=False, recompute_layers=None)
    return blend(_priced(kept, layout, cluster, **options), _priced(whole, layout, cluster, **options), share,
                 cluster.gpu.memory)


def _overlap_share(tp_overlap):
    """``tp_overlap`` as a flag (``True``/``False``, numpy's ``bool_`` too) or a share from 0 to 1; else refused."""
    if str(getattr(tp_overlap, "dtype", "")) == "bool":  # numpy's bool_ is a flag, not the share 1.0
        return bool(tp_overlap)
    if isinstance(tp_overlap, numbers.Real) and 0 <= tp_overlap <= 1:  # a bool is a Real too
        return tp_overlap
    raise ValueError(f"tp_overlap={tp_overlap!r}: True, False, or the share of the covered TP time hidden, 0 to 1")


def _priced(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
            reshard: str | None = None, tp_overlap: bool | float = False, ep_overlap: bool = False, without=(),
            grad_dtype: str | None = None) -> Prediction:
    """One prediction: the checks, then the step part by part, the bytes and the memory."""
    w, off = workload, set(without)
    m, stages, reshard, cluster = _checked(w, layout, cluster, reshard, off, implementation)
    tp_overlap = _overlap_share(tp_overlap)
    if tp_overlap and layout.tp > 1 and not w.sequence_parallel:
        raise ValueError(f"tp_overlap=True with tp={layout.tp} needs sequence parallelism (Megatron-LM's arguments.py: "
                         f"TP communication/GEMM overlap 'can happen only when sequence parallelism is enabled'; "
                         f"torchtitan's async TP is built on it): use a Workload with sequence_parallel=True")
    hidden = TP_OVERLAP_HIDDEN[TP_OF.get(implementation, implementation)] if tp_overlap is True else float(tp_overlap)
    pp, v = layout.pp, layout.vp
    # the slowest stage sets the pipeline's pace; the heaviest holds the most memory
    work = [n + (w.output_flops / w.layer_flops if s == pp - 1 else 0.0) for s, n in enumerate(stages)]
    slow = max(range(pp), key=work.__getitem__)
    dense, experts = _rank_weights(w, layout)
    psi = dense + experts  # weights of the heaviest rank
    layers_s, forward, backward, attention_s = _computation(w, stages[slow], slow == pp - 1, layout, cluster, off)
    tp_forward, tp_backward, p2p_s = _messages(w, layout, cluster, stages[slow], off)
    # beside the layers' matrix products only what they cannot cover is exposed; inside a domain only, as
    # Transformer Engine's comm+GEMM overlap runs (NVIDIA/TransformerEngine#1071): TP across nodes stays exposed
    if hidden and cluster.link(layout.topology, "tp") == cluster.intra:
        output_s = forward - layers_s
        tp_forward -= hidden * min(tp_forward, layers_s)
        tp_backward -= hidden * min(tp_backward, backward - 2 * output_s)
    cp_forward, cp_backward = _terms.context(w, layout, cluster, stages[slow], attention_s, off)
    ep_forward, ep_backward = _terms.experts(w, layout, cluster, stages[slow], off)
    if ep_overlap:  # beside another micro-batch's layers (DualPipe): what they cannot cover
        ep_forward, ep_backward = max(0.0, ep_forward - layers_s), max(0.0, ep_backward - 2 * layers_s)
    # the pipeline's slots per step, (p − 1)/v of them the bubble (chapter 06)
    slots = m + (0 if "bubble" in off else (pp - 1) / v)
    forward_s = slots * (forward + tp_forward + cp_forward + ep_forward + p2p_s)
    backward_s = slots * (backward + tp_backward + cp_backward + ep_backward + p2p_s)
    optimizer_s = 0.0 if "optimizer" in off else psi * OPTIMIZER_BYTES_PER_PARAM / cluster.gpu.memory_bandwidth
    grad_value = w.grad_bytes(implementation, layout.zero_stage, grad_dtype)  # the run's, else its framework's
    deepspeed3 = layout.zero_stage == 3 and implementation == "deepspeed"
    prefetch = not deepspeed3 or w.layer_tensors[1] / layout.tp <= DEEPSPEED_PREFETCH_PARAMS
    step = _data_parallel(w, layout, cluster, implementation=implementation, reshard=reshard, weights=(dense, experts),
                          times=(forward_s, backward_s, optimizer_s), m=m, blocks=max(1, stages[slow]),
                          grad_value=grad_value, prefetch=prefetch, off=off)
    parts = {"compute": m * (forward + backward), "bubble": (slots - m) * (forward + backward),
             "tp": slots * (tp_forward + tp_backward), "cp": slots * (cp_forward + cp_backward),
             "ep": slots * (ep_forward + ep_backward), "pp": slots * 2 * p2p_s,
             "optimizer": optimizer_s / (layout.dp if layout.zero_stage else 1)}
    parts["dp"] = max(0.0, step - sum(parts.values()))
    bytes_by_axis = _bytes_by_axis(w, layout, stages[slow], m, psi, grad_value, reshard)
    memory = _memory_of(w, layout, reshard, (dense, experts), grad_value, prefetch, deepspeed3)
    peak = cluster.world_size * cluster.gpu.flops * step  # MFU against the 16-bit peak, as FP8 runs report it
    return Prediction(layout, memory, step, parts, bytes_by_axis, (slots - m) / slots, m,
                      memory.total <= cluster.gpu.memory, stages, w.model_flops() / peak, w.hardware_flops() / peak, v)


def _rank_weights(w: Workload, layout: Layout) -> tuple[float, float]:
    """(dense weights, routed experts' weights) of the heaviest pipeline stage's rank: the stage's dense ones
    over tp, its share of the experts over ep × etp."""
    per_layer = w.expert_params / w.layers
    per_stage = stage_params(w, layout.pp)
    stage = max(range(layout.pp), key=per_stage.__getitem__)
    params, layers = per_stage[stage], stage_layers(w, layout.pp)[stage]
    experts = layers * per_layer
    return (params - experts) / layout.tp, experts / (layout.ep * layout.etp)


def _memory_of(w, layout, reshard, weights, grad_value, prefetch, deepspeed3):
    """Memory per rank: ZeRO-3 resharding only after the step holds the weights and whole gradients through
    it (stage 1's memory); else the layout's stage, with ZeRO-3's working set."""
    held_stage = 1 if layout.zero_stage == 3 and reshard == "after_step" else layout.zero_stage
    working = (_memory.zero3_working_set(w, layout, units=2 if prefetch else 1, grad_bytes=grad_value,
                                         root_kept=not deepspeed3) if held_stage == 3 and layout.dp > 1 else 0.0)
    return _memory.stage_memory(w, layout, held_stage, *weights, fp32_grads=grad_value == 4 and w.value_bytes == 2,
                                working_set=working)


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


def _checked(w: Workload, layout: Layout, cluster: Cluster, reshard, off, implementation="megatron"):
    """(micro-batches per replica, layers per stage, reshard, cluster) once the arguments are checked;
    ``"latency"`` left out: the cluster's links with α = 0."""
    if off - set(TERMS):
        raise ValueError(f"without={sorted(off - set(TERMS))}: not cost terms; choose from {', '.join(TERMS)}")
    if layout.world_size != cluster.world_size:
        raise ValueError(f"layout {layout} uses {layout.world_size} ranks; the cluster has {cluster.world_size}")
    why = unsupported(layout, implementation) or w.tp_refusal(layout.tp)
    if why:
        raise ValueError(why)
    cluster.gpu.peak(w.precision)  # refuses FP8 on a GPU without it
    if layout.ep > 1 and not w.experts:
        raise ValueError(f"ep={layout.ep}: this model has no experts to split (a dense config); use ep=1")
    if w.experts and w.experts[0] % layout.ep:
        raise ValueError(f"ep={layout.ep} does not divide the model's {w.experts[0]} routed experts")
    if layout.cp > 1 and w.seq_len % (2 * layout.cp):
        raise ValueError(f"cp={layout.cp}: seq_len={w.seq_len} must split into 2 × cp chunks (load-balanced causal "
                         f"attention gives each rank two)")
    if reshard is None:
        reshard = "after_step" if layout.pp > 1 else "after_forward"
    dp, pp, v = layout.dp, layout.pp, layout.vp
    if w.global_batch % (dp * w.micro_batch):
        raise ValueError(f"global_batch={w.global_batch} does not split into dp={dp} replicas of micro-batches "
                         f"of {w.micro_batch}")
    stages = stage_layers(w, pp)
    if v > 1 and (pp == 1 or v > w.layers // pp):  # Megatron splits the layers evenly over pp × vp chunks
        raise ValueError(f"vp={v}: each of a pipeline rank's chunks needs at least one layer; "
                         + ("pp=1 has no pipeline to interleave (use vp=1)" if pp == 1 else
                            f"{w.layers} layers on pp={pp} stages give each {w.layers // pp}, so vp "
                            f"may be 1 to {w.layers // pp}"))
    if "latency" in off:
        cluster = replace(cluster, intra=replace(cluster.intra, alpha=0.0), inter=replace(cluster.inter, alpha=0.0))
    return w.global_batch // (dp * w.micro_batch), stages, reshard, cluster


def _computation(w: Workload, layers: int, last: bool, layout: Layout, cluster: Cluster, off):
    """(the layers' forward, the whole forward, the backward, one layer's attention core forward) of one
    micro-batch on the slowest stage's rank, which holds ``layers`` layers (and the output layer if ``last``),
    in seconds. The linear layers run at the precision's rate (FP8: :meth:`Cluster.rate`), attention's core
    and the output layer at the 16-bit one; each rank computes seq_len/cp of the tokens."""
    tp, tokens = layout.tp, w.micro_batch * w.seq_len / layout.cp
    rate, linear_rate = cluster.rate("bf16"), cluster.rate(w.precision)
    attention = 0.0 if "attention" in off else w.attention_flops
    # a fused kernel (sdpa) runs attention's FLOPs at its own published rate where the GPU has one; eager
    # attention's QKᵀ and weighted sum are matrix products like the rest
    kernel = (cluster.gpu.attention_flops or {}).get(w.attention) if "attention_kernel" not in off else None
    one_attention = attention * tokens / tp / (kernel or rate)
    layers_s = layers * ((w.layer_flops - w.attention_flops) * tokens / tp / linear_rate + one_attention)
    output_s = (w.output_flops * tokens / tp / rate) if last else 0.0
    # the layers' memory-bound work (Workload.elementwise_bytes) at HBM speed; backward's beyond twice forward's
    moved = (0.0, 0.0) if "memory_bound" in off else w.elementwise_bytes(tp)
    memory_s, backward_memory = (layers * b / layout.cp / cluster.gpu.memory_bandwidth for b in moved)
    layers_s += memory_s
    forward = layers_s + output_s
    # torchtitan's op-level policy reruns k, o and up, and every memory-bound op of the layer
    op_redo = layers * w.op_recompute_flops * tokens / tp / linear_rate + memory_s if w.recompute == "op" else 0.0
    redo = {"full": layers_s, "selective": layers * one_attention, "op": op_redo}[w.recompute] \
        if w.recompute != "none" and "recompute" not in off else 0.0
    # FP8's casts (memory-bound): each linear layer's inputs, output gradients and weights
    scaling = 0.0 if "fp8_scaling" in off else _terms.fp8_scaling(w, layers, tokens, layout, cluster)
    # backward: twice the forward, plus what recomputation redoes (the layers' forward, or their attention
    # core); a fused attention kernel's backward recomputes the scores too (Workload.fused_backward_flops)
    fused = layers * one_attention * w.fused_backward_flops / w.attention_flops
    # each local expert's fixed cost per layer, beyond its FLOPs (terms.expert_fixed)
    fixed_forward, fixed_backward = _terms.expert_fixed(w, layout, cluster, layers, off)
    if redo and w.recompute == "full":  # full recomputation runs each expert forward again
        fixed_backward += fixed_forward
    return (layers_s, forward + scaling / 3 + fixed_forward,
            2 * forward + redo + fused + 2 * scaling / 3 + fixed_backward + backward_memory - 2 * memory_s,
            one_attention)


def _messages(w: Workload, layout: Layout, cluster: Cluster, layers: int, off) -> tuple[float, float, float]:
    """(TP's forward, TP's backward, one pipeline boundary's messages) per micro-batch on the slowest stage."""
    topo, tp, pp = layout.topology, layout.tp, layout.pp
    activation = w.micro_batch * w.seq_len / layout.cp * w.hidden * w.value_bytes  # one (b, s/cp, h) tensor
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
    return tp_forward, tp_backward, p2p_s * layout.vp  # interleaved: every chunk's boundary is a send


def _data_parallel(w: Workload, layout: Layout, cluster: Cluster, *, implementation, reshard, weights, times, m,
                   blocks, grad_value, prefetch, off) -> float:
    """The step with data parallelism's collectives (:func:`predict_dp_step`), over the dp × cp ranks that hold
    the same dense weights (HSDP: its shard group, and an all-reduce of the shards across its replicas). The
    experts' gradients go over the smaller edp ring; they are priced on the dense ring at the bytes that take
    the same time there."""
    forward_s, backward_s, optimizer_s = times
    n = (layout.shard or layout.dp) * layout.cp
    if n * layout.replicas == 1 or "dp" in off:
        return forward_s + backward_s + optimizer_s / (layout.dp if layout.zero_stage and layout.dp > 1 else 1)
    link = cluster.span_link(layout.group("shard"))
    costs = ring_costs(link, n) if n > 1 else {op: (0.0, 0.0) for op in ("all_gather", "reduce_scatter", "all_reduce", "send")}
    dense, experts = weights
    if experts:  # the experts' ring, as bytes on the dense one
        edp = layout.group("edp")
        beta = ring_costs(cluster.span_link(edp), len(edp))["reduce_scatter"][1] if len(edp) > 1 else 0.0
        experts *= beta / costs["reduce_scatter"][1] if costs["reduce_scatter"][1] else 0.0
    if layout.replicas > 1:  # HSDP: each shard's reduction also all-reduces its 1/n across the replicas
        alpha, beta = ring_costs(cluster.span_link(layout.group("replicate")), layout.replicas)["all_reduce"]
        costs = {**costs, **{op: (costs[op][0] + alpha, costs[op][1] + beta / n) for op in ("reduce_scatter", "all_reduce")}}
    psi, value = dense + experts, (1 if w.fp8_gather else w.value_bytes)
    zero3, deepspeed3 = layout.zero_stage == 3, layout.zero_stage == 3 and implementation == "deepspeed"
    root = min(w.root_params / (layout.tp * layout.pp) * w.value_bytes, psi * value) if zero3 else 0.0
    return predict_dp_step(STRATEGIES[layout.zero_stage], costs, psi * value, n, forward_s, backward_s, optimizer_s,
                           buckets=bucket_count(implementation, n, psi * grad_value, grad_value),
                           blocks=blocks, overlap=cluster.overlap and "dp_overlap" not in off,
                           micro_batches=m, root_bytes=root, implementation=implementation, reshard=reshard,
                           gathers_per_block=w.layer_tensors[0] if deepspeed3 else 1, prefetch=prefetch,
                           backward_gathers=(deepspeed_backward_gathers(w.layer_params / layout.tp, w.recompute)
                                             if deepspeed3 else 1),
                           reduce_bytes=psi * grad_value)


def _bytes_by_axis(w: Workload, layout: Layout, layers: int, m: int, psi: float, grad_value: int,
                   reshard: str) -> dict:
    """Bytes each rank sends per step on each axis (nccl-tests sizes)."""
    dp, tp, pp, cp, v = layout.dp, layout.tp, layout.pp, layout.cp, layout.vp
    activation = w.micro_batch * w.seq_len / cp * w.hidden * w.value_bytes
    weights, reduced = psi * (1 if w.fp8_gather else w.value_bytes), psi * grad_value  # what ZeRO gathers; reduces
    root = w.root_params / (tp * pp) * w.value_bytes if layout.zero_stage == 3 else 0.0
    zero3 = {"after_forward": m * (2 * weights - root + reduced),  # FSDP2 gathers its root once per pass
             "after_backward": m * (weights + reduced), "after_step": weights + reduced}[reshard]
    dp_bytes = {0: reduced, 1: reduced + weights, 2: m * reduced + weights, 3: zero3}[layout.zero_stage]
    tp_calls = (6 if w.checkpointing else 4) * layers * m
    block = _terms.kv_block(w, layout)
    cp_bytes = (m * layers * (3 * cp - 2) * block if layout.cp_kind == "ring" else m * layers * 2 * cp * block)
    routed = (w.micro_batch * w.seq_len / (cp * tp) * w.experts[1] * (w.capacity_factor or 1.0) * w.hidden
              * w.value_bytes if w.experts else 0.0)
    out = {"dp": dp_bytes if dp * cp > 1 else 0, "tp": tp_calls * activation if tp > 1 else 0,
           "pp": 2 * m * v * activation / tp if pp > 1 else 0}
    return {**out, **({"cp": cp_bytes} if cp > 1 else {}), **({"ep": 4 * m * layers * routed} if layout.ep > 1 else {})}
