"""One cost model for the course: links, collectives, and the time and memory of a training step under any
layout (chapter 07; chapters 04, 05 and 06 use its links and collectives).

**Links.** :data:`LINKS` names the links the course talks about, each with a latency α (seconds per
message, i.e. per step of a ring) and a bandwidth B (bytes per second, one direction, per GPU), and where
the bandwidth comes from. The bandwidths are the vendors' peak figures; nccl-tests usually reach 70–90 %
of them, so predictions are optimistic by as much. Every α is an assumption of the right order, not a
measurement: fit your own with chapter 02's ``sweep`` and ``fit_alpha_beta``.

**Collectives** (chapter 02's α-β model, T(m) = α + m·β per message, on a ring of n ranks; m is the
nccl-tests size: the whole buffer, all-gather's output, reduce-scatter's input):

- all-gather, reduce-scatter: n − 1 steps, each moving m/n over every link: (n−1)·α + (n−1)/n · m/B;
- all-reduce: a reduce-scatter then an all-gather: 2(n−1)·α + 2(n−1)/n · m/B;
- send/recv (a pipeline's boundary): α + m/B.

Two α's, then: a link's α is the latency of *one message* (one step of a ring); a collective's α is the
intercept of its whole call, T(m) = α_call + m·β_call, e.g. α_call = 2(n−1)·α for an all-reduce.
:func:`ring_costs` turns a link into (α_call, β_call) of each op; a curve fitted on a real machine
(``fit_alpha_beta`` over a ``sweep`` of whole calls) gives (α_call, β_call) directly and plugs in the same
way, and :func:`fitted_link` turns such a fit back into a link (per-message α, bandwidth B), so that it can
be priced at another ring size. :func:`collective_seconds` prices one call.

**A step** (:func:`predict`): a rank computes 6Ψ/(t·p) FLOPs per token (forward 2, backward 4) at a share of
its GPU's peak; tensor parallelism adds four all-reduces of one activation per layer per micro-batch
(Megatron: two forward, two backward), which nothing hides; a pipeline of p stages runs m micro-batches in
m + p − 1 slots (the bubble, chapter 06) and sends one activation each way per micro-batch;
data parallelism's collectives come from :func:`predict_dp_step` (chapter 04), which knows what each ZeRO
stage can hide behind, and that ZeRO-3's root (embeddings, output layer) has nothing to hide behind.
Memory per rank is :func:`parlab.measure.estimate_memory` (chapter 01).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from parlab.checks import positive_int
from parlab.measure.memory import MemoryEstimate, estimate_memory
from parlab.parallel.ddp import DEFAULT_BUCKET_BYTES
from parlab.parallel.topology import Topology


@dataclass(frozen=True)
class Link:
    """A link between two GPUs: ``alpha`` seconds per message, ``bandwidth`` bytes/s (one direction, per GPU)."""

    name: str
    alpha: float
    bandwidth: float
    source: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.bandwidth / 1e9:g} GB/s, α = {self.alpha * 1e6:g} µs"


#: The links of the course, one figure each. Bandwidth: the source named; α: assumed (typical order).
LINKS = {
    "nvlink": Link("NVLink 3 (NVSwitch)", 2e-6, 300e9,
                   "NVIDIA A100 datasheet: 600 GB/s of NVLink per GPU, both directions together"),
    "pcie": Link("PCIe 4.0 x16", 5e-6, 31.5e9,
                 "PCI-SIG: 16 GT/s per lane × 16 lanes, 128b/130b encoding, one direction"),
    "infiniband": Link("InfiniBand HDR", 5e-6, 25e9,
                       "NVIDIA DGX A100: eight 200 Gb/s HDR adapters, one per GPU"),
    "ethernet": Link("Ethernet 100 Gb/s", 30e-6, 100e9 / 8 / 8,
                     "one 100 Gb/s port per node, shared by its eight GPUs"),
}

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send")


def ring_costs(link: Link, world_size: int) -> dict[str, tuple[float, float]]:
    """(α_call, β_call) of each op, T(m) = α_call + m·β_call, for a ring of ``world_size`` ranks joined by
    ``link`` (whose α is per message): an all-gather or reduce-scatter takes n−1 steps and moves (n−1)/n of
    the buffer over each link; an all-reduce is the two in turn; a send is one message (chapter 02)."""
    n = positive_int("world_size", world_size, "ranks in the ring")
    one = ((n - 1) * link.alpha, (n - 1) / n / link.bandwidth)
    return {"all_gather": one, "reduce_scatter": one, "all_reduce": (2 * one[0], 2 * one[1]),
            "send": (link.alpha, 1 / link.bandwidth)}


def fitted_link(op: str, alpha: float, beta: float, world_size: int, name: str = "fitted") -> Link:
    """The link whose :func:`ring_costs` at ``world_size`` ranks give ``op`` the fitted whole-call intercept
    ``alpha`` (seconds) and slope ``beta`` (seconds per byte), as ``fit_alpha_beta`` returns them: per-message
    α = alpha / (ring steps of one call), B = (the share of the buffer each link carries) / beta. A model, then:
    it assumes the library runs a ring, so that the same link priced at another ring size scales as a ring
    would (chapter 05)."""
    n = positive_int("world_size", world_size, "ranks the fit was measured on")
    if n < 2:
        raise ValueError(f"world_size={n}: a fit on one rank measured no link; fit on 2 ranks or more")
    if op not in OPS:
        raise ValueError(f"op={op!r}; choose one of {', '.join(OPS)}")
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha={alpha!r} and beta={beta!r} must be at least 0 (seconds, seconds per byte)")
    steps, share = {"all_reduce": (2 * (n - 1), 2 * (n - 1) / n), "send": (1, 1.0)}.get(op, (n - 1, (n - 1) / n))
    return Link(name, alpha / steps, share / beta if beta > 0 else math.inf,
                f"fitted on {n} ranks from {op}'s sweep: α_call = {alpha * 1e6:.0f} µs, β_call = {beta:.3g} s/B")


def collective_seconds(op: str, nbytes: float, costs: dict) -> float:
    """Seconds one call of ``op`` on ``nbytes`` (the nccl-tests size) takes under ``costs`` (:func:`ring_costs`,
    or fitted ``{op: (α, β)}``)."""
    if op not in costs:
        raise ValueError(f"op={op!r} has no cost here; costs are given for {', '.join(costs)}")
    alpha, beta = costs[op]
    return alpha + nbytes * beta


# -- data parallelism: what each ZeRO stage sends, and what it can hide behind (chapter 04) ------------------

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
#: Whose ZeRO-1/2 is priced: what each overlaps with computation (see :func:`predict_dp_step`).
IMPLEMENTATIONS = ("megatron", "deepspeed", "course")
#: When ZeRO-3 frees (reshards) the weights it gathered, FSDP2's names (see :func:`predict_dp_step`).
RESHARDS = ("after_forward", "after_backward", "after_step")


def predict_dp_step(strategy: str, costs: dict, num_bytes: float, world_size: int, forward_s: float,
                    backward_s: float, optimizer_s: float, buckets: int = 1, blocks: int = 1,
                    overlap: bool = True, micro_batches: int = 1, root_bytes: float = 0.0,
                    root_gathers: int = 1, *, implementation: str = "megatron",
                    reshard: str = "after_forward") -> float:
    """Seconds per training step of one data-parallel strategy under the α-β model (a model, not a measurement).

    ``costs[op] = (α, β)`` per collective call (:func:`ring_costs`, or fitted with ``fit_alpha_beta``);
    ``num_bytes``: the gradients' (= the weights') size; ``forward_s``, ``backward_s``, ``optimizer_s``: one
    rank's compute in the step (the optimizer over all its weights: ZeRO divides it by N). ``buckets``:
    collectives DDP and stages 1/2 cut the gradients into; ``blocks``: stage 3's gather units. ``overlap``:
    communication runs beside computation (GPUs: NCCL on its own stream) and only the longer of the two
    counts; else (CPU: the same cores) they add. ``micro_batches``: forward/backward passes per step
    (gradient accumulation, or a pipeline): DDP and stage 1 reduce once, during the last backward; stage 2
    must reduce-scatter during every backward, since it keeps no whole gradient to accumulate into.

    ``implementation``: whose stages 1 and 2 are priced, since what they overlap is the implementation's
    choice, not ZeRO's:

    - ``"megatron"`` (default): Megatron-LM's distributed optimizer (``overlap_grad_reduce``,
      ``overlap_param_gather``): the gradients' reduce-scatter, bucket by bucket, during backward (stage 1:
      the last micro-batch's; stage 2: every one's), and the updated weights' all-gather during the next
      step's first forward (``megatron/core/distributed/README`` and ``distributed_data_parallel_config.py``);
    - ``"deepspeed"``: DeepSpeed's ``overlap_comm``: the reduce-scatter during backward as above; the
      all-gather of the updated weights runs inside ``step()``, after the optimizer, with nothing beside it
      (``deepspeed/runtime/zero/stage_1_and_2.py``: ``all_gather_dp_groups``);
    - ``"course"``: chapter 04's ``ZeroStage1``, which reduce-scatters after backward and all-gathers after
      the step (nothing hides), and ``ZeroStage2``, which reduce-scatters its buckets during backward.

    Only ZeRO's reduce-scatter (Ψ) can hide behind backward, not DDP's whole all-reduce (2Ψ).

    Stage 3 (FSDP2, DeepSpeed ZeRO-3) prefetches: the blocks' gathers hide behind forward, their gathers and
    reduce-scatters behind backward. ``reshard``: when it frees the gathered weights, in FSDP2's terms:

    - ``"after_forward"`` (FSDP2's default, DeepSpeed's stage 3): gathered for every forward and again for
      every backward, reduce-scattered after every backward: per micro-batch 2 all-gathers + 1 reduce-scatter;
    - ``"after_backward"`` (``reshard_after_forward=False``, micro-batches run one after another, as under
      gradient accumulation or the course's pipeline executor): kept from a forward to its backward, freed
      after that backward, so the next pass gathers again: per micro-batch 1 all-gather + 1 reduce-scatter;
    - ``"after_step"`` (``reshard_after_forward=False`` under ``torch.distributed.pipelining``, whose stage
      switches off resharding and gradient sync for every backward and reduces once when all are done:
      ``stage.py``'s ``backward_maybe_with_nosync`` and ``perform_reduce_grad``): 1 all-gather, during the
      first forward, and 1 reduce-scatter after the last backward, with nothing left to hide it; the weights
      and whole gradients stay on the rank through the step, which is stage 1's memory.

    Stage 3's root: ``root_bytes`` of ``num_bytes`` belong to the parameters outside the blocks (embeddings,
    final norm, output layer), one more gather unit. Its all-gather is the first thing forward needs and its
    reduce-scatter the last thing backward issues, so neither has computation to hide behind: both are on
    the critical path, once per pass, and so is a second gather in backward when the root is freed after
    forward (``root_gathers=2``: chapter 04's ``ZeroStage3``; FSDP2's ``fully_shard`` keeps the root from
    forward to backward: ``root_gathers=1``, the default).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    if reshard not in RESHARDS:
        raise ValueError(f"reshard={reshard!r}; choose one of {', '.join(RESHARDS)}")
    m = positive_int("micro_batches", micro_batches, "forward/backward passes per step")
    if not 0 <= root_bytes <= num_bytes:
        raise ValueError(f"root_bytes={root_bytes!r} must lie between 0 and num_bytes={num_bytes!r}")
    if root_gathers not in (1, 2):
        raise ValueError(f"root_gathers={root_gathers!r}: 1 (the root kept from forward to backward) or 2 "
                         f"(gathered again for backward)")

    def comm(op, calls, nbytes=num_bytes):
        alpha, beta = costs[op]
        return calls * alpha + nbytes * beta

    def beside(compute, communication):
        return max(compute, communication) if overlap else compute + communication

    n, first, last = world_size, forward_s / m, backward_s / m  # one pass: what a step's first/last can hide
    if strategy == "ddp":  # buckets all-reduced during the last backward
        return forward_s + backward_s - last + beside(last, comm("all_reduce", buckets)) + optimizer_s
    if strategy in ("zero1", "zero2"):
        reduce = (1 if strategy == "zero1" else m) * comm("reduce_scatter", buckets)
        if strategy == "zero1" and implementation == "course":  # one flat buffer after backward: nothing beside it
            backward = backward_s + comm("reduce_scatter", 1)
        elif strategy == "zero1":  # during the last backward
            backward = backward_s - last + beside(last, reduce)
        else:  # during every backward
            backward = beside(backward_s, reduce)
        if implementation == "megatron":  # the updated weights gathered under the next step's first forward
            forward = forward_s - first + beside(first, comm("all_gather", buckets))
            return forward + backward + optimizer_s / n
        gather = comm("all_gather", 1 if strategy == "zero1" else buckets)  # after the step
        return forward_s + backward + optimizer_s / n + gather
    # stage 3 with prefetch: the blocks' collectives hide behind the computation; the root's add
    body = num_bytes - root_bytes
    root = (root_gathers * comm("all_gather", 1, root_bytes) + comm("reduce_scatter", 1, root_bytes)
            if root_bytes else 0.0)
    if reshard == "after_forward":
        return (beside(forward_s, m * comm("all_gather", blocks, body))
                + beside(backward_s, m * (comm("all_gather", blocks, body) + comm("reduce_scatter", blocks, body)))
                + m * root + optimizer_s / n)
    root_gather = comm("all_gather", 1, root_bytes) if root_bytes else 0.0
    if reshard == "after_backward":  # the first forward gathers; each later pass's backward gathers again
        root_reduce = comm("reduce_scatter", 1, root_bytes) if root_bytes else 0.0
        return (beside(forward_s, comm("all_gather", blocks, body))
                + beside(backward_s, (m - 1) * comm("all_gather", blocks, body) + m * comm("reduce_scatter", blocks, body))
                + m * (root_gather + root_reduce) + optimizer_s / n)
    # after_step: one gather under the first forward, one reduce-scatter of everything after the last backward
    units = blocks + (1 if root_bytes else 0)
    return (forward_s - first + beside(first, comm("all_gather", blocks, body)) + root_gather + backward_s
            + comm("reduce_scatter", units) + optimizer_s / n)


# -- a machine, a model, a layout ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GPU:
    """One accelerator: ``memory`` (bytes), peak dense ``flops`` (FLOP/s in the training precision) and
    ``memory_bandwidth`` (bytes/s, what an optimizer step is bound by)."""

    name: str
    memory: float
    flops: float
    memory_bandwidth: float
    source: str = ""


A100 = GPU("A100 SXM4 80 GB", 80e9, 312e12, 2.039e12,
           "NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e")
#: Share of peak FLOP/s that training reaches (model FLOPs utilisation): an assumption, typical of
#: well-tuned large runs (Chowdhery et al. 2022 report 46 % for PaLM; Narayanan et al. 2021 about 50 %).
UTILIZATION = 0.4
#: Bytes an Adam step reads and writes per parameter (fp32 master, two moments, gradient): memory-bound.
OPTIMIZER_BYTES_PER_PARAM = 32
#: DDP's and ZeRO-2's bucket size: ``DistributedDataParallel``'s default ``bucket_cap_mb=25``, in MiB
BUCKET_BYTES = DEFAULT_BUCKET_BYTES


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` GPUs; ``intra``: the link inside a node, ``inter``: between nodes.
    ``overlap``: collectives run beside computation (GPUs) or take turns with it (CPU ranks)."""

    gpu: GPU = A100
    gpus_per_node: int = 8
    nodes: int = 1
    intra: Link = LINKS["nvlink"]
    inter: Link = LINKS["infiniband"]
    utilization: float = UTILIZATION
    overlap: bool = True

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def link(self, topology: Topology, axis: str) -> Link:
        """The slowest link a ring of ``axis``'s groups crosses: ``intra`` if every group stays in a node."""
        group = topology.group_ranks(axis, 0)  # every group of an axis spans nodes alike
        return self.intra if len({r // self.gpus_per_node for r in group}) == 1 else self.inter

    def describe(self) -> str:
        where = f"{self.nodes} node{'s' if self.nodes > 1 else ''} × {self.gpus_per_node} {self.gpu.name}"
        return where + f"; inside a node {self.intra}" + (f"; between nodes {self.inter}" if self.nodes > 1 else "")


def root_params(config) -> int:
    """The parameters outside a transformers model's stack of layers (its largest ``nn.ModuleList``): the
    embeddings, the final norm and an untied output layer, which ZeRO-3 gathers as one root unit (chapter 04).
    Counted on the meta device, as :func:`parlab.measure.count_params` counts Ψ."""
    from torch import nn

    from parlab.measure.activations import meta_model

    model = meta_model(config.to_json_string())
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not stacks:
        raise ValueError(f"config of {config.model_type!r} builds a model with no list of layers")
    layers = {id(p) for p in max(stacks, key=lambda m: sum(p.numel() for p in m.parameters())).parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in layers)


@dataclass(frozen=True)
class Workload:
    """A model and its batch: ``model`` a transformers config or a ``parlab.advice`` preset name;
    ``global_batch`` sequences of ``seq_len`` tokens per step, ``micro_batch`` of them per forward pass."""

    model: object
    global_batch: int
    seq_len: int
    micro_batch: int = 1
    precision: str = "bf16"
    optimizer: str = "adam"
    checkpointing: bool = False
    num_params: int = field(init=False)
    root_params: int = field(init=False)
    config: object = field(init=False, repr=False)

    def __post_init__(self):
        from parlab.advice import preset
        from parlab.measure import count_params

        config = preset(self.model) if isinstance(self.model, str) else self.model
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "num_params", count_params(config))
        object.__setattr__(self, "root_params", root_params(config))
        positive_int("global_batch", self.global_batch, "sequences per step")
        positive_int("seq_len", self.seq_len, "tokens per sequence")
        positive_int("micro_batch", self.micro_batch, "sequences per forward pass")

    @property
    def layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def value_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Layout:
    """Sizes of the mesh's axes and the ZeRO stage of its data-parallel axis (0: plain DDP)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0

    @property
    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, pp=self.pp)

    def __str__(self) -> str:
        axes = [f"{name} {size}" for name, size in (("TP", self.tp), ("PP", self.pp), ("DP", self.dp)) if size > 1]
        return (" × ".join(axes) or "1 GPU") + (f" + ZeRO-{self.zero_stage}" if self.zero_stage else "")


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` says of one layout: memory per rank, seconds per step and where they go,
    bytes each rank sends per step on each axis (nccl-tests sizes), the bubble."""

    layout: Layout
    memory: MemoryEstimate
    step_s: float
    parts: dict
    bytes_by_axis: dict
    bubble: float
    micro_batches: int
    fits: bool

    def row(self) -> str:
        return (f"{str(self.layout):<28}{self.memory.total / 1e9:>8.1f} GB{' ' if self.fits else '!'}"
                f"{self.step_s:>9.3f} s   bubble {self.bubble:5.1%}   "
                + "  ".join(f"{k} {v:.3f}" for k, v in self.parts.items() if v > 0))


def predict(workload: Workload, layout: Layout, cluster: Cluster, *, implementation: str = "megatron",
            reshard: str | None = None) -> Prediction:
    """Memory per rank and seconds per step of ``workload`` under ``layout`` on ``cluster`` (a model: see
    the module docstring for what it counts and what it leaves out). ``implementation`` and ``reshard``: as
    :func:`predict_dp_step` takes them; ``reshard=None``: ZeRO-3 beside a pipeline as
    ``torch.distributed.pipelining`` runs FSDP2 (``"after_step"``), else FSDP2's default (``"after_forward"``)."""
    if reshard is None:
        reshard = "after_step" if layout.pp > 1 else "after_forward"
    topo = layout.topology
    if topo.world_size != cluster.world_size:
        raise ValueError(f"layout {layout} uses {topo.world_size} ranks; the cluster has {cluster.world_size}")
    if layout.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={layout.zero_stage!r} must be 0, 1, 2 or 3")
    w, (dp, tp, pp) = workload, (layout.dp, layout.tp, layout.pp)
    if w.global_batch % (dp * w.micro_batch):
        raise ValueError(f"global_batch={w.global_batch} does not split into dp={dp} replicas of micro-batches "
                         f"of {w.micro_batch}")
    m = w.global_batch // (dp * w.micro_batch)  # micro-batches per replica per step
    psi = w.num_params / (tp * pp)  # weights per rank (even split assumed, as estimate_memory does)
    tokens = w.micro_batch * w.seq_len
    forward = 2 * psi * tokens / (cluster.gpu.flops * cluster.utilization)  # one micro-batch on this rank
    backward = 2 * forward + (forward if w.checkpointing else 0)  # recomputation redoes the forward
    activation = w.micro_batch * w.seq_len * w.hidden * w.value_bytes  # one (b, s, h) tensor
    layers = w.layers / pp
    tp_s = 4 * layers * collective_seconds("all_reduce", activation, ring_costs(cluster.link(topo, "tp"), tp)) \
        if tp > 1 else 0.0
    p2p_s = collective_seconds("send", activation, ring_costs(cluster.link(topo, "pp"), pp)) if pp > 1 else 0.0
    slots = m + pp - 1  # the pipeline's slots per step, p − 1 of them the bubble (chapter 06)
    forward_s = slots * (forward + tp_s / 2 + p2p_s)
    backward_s = slots * (backward + tp_s / 2 + p2p_s)
    optimizer_s = psi * OPTIMIZER_BYTES_PER_PARAM / cluster.gpu.memory_bandwidth
    grad_bytes = psi * w.value_bytes
    # ZeRO-3 (FSDP2, keeping its root from forward to backward): the root's share of this rank's weights,
    # spread over the stages as evenly as the weights are
    root = w.root_params / (tp * pp) * w.value_bytes if layout.zero_stage == 3 else 0.0
    if dp > 1:
        step = predict_dp_step(STRATEGIES[layout.zero_stage], ring_costs(cluster.link(topo, "dp"), dp), grad_bytes,
                               dp, forward_s, backward_s, optimizer_s,
                               buckets=max(1, math.ceil(grad_bytes / BUCKET_BYTES)), blocks=max(1, round(layers)),
                               overlap=cluster.overlap, micro_batches=m, root_bytes=root,
                               implementation=implementation, reshard=reshard)
    else:
        step = forward_s + backward_s + optimizer_s
    optimizer_part = optimizer_s / (dp if layout.zero_stage else 1)
    parts = {"compute": m * (forward + backward), "bubble": (pp - 1) * (forward + backward),
             "tp": slots * tp_s, "pp": slots * 2 * p2p_s, "optimizer": optimizer_part}
    parts["dp"] = max(0.0, step - sum(parts.values()))
    zero3_bytes = {"after_forward": m * (3 * grad_bytes - root),  # FSDP2 gathers its root once per pass
                   "after_backward": 2 * m * grad_bytes, "after_step": 2 * grad_bytes}[reshard]
    dp_bytes = {0: grad_bytes, 1: 2 * grad_bytes, 2: (m + 1) * grad_bytes, 3: zero3_bytes}[layout.zero_stage]
    bytes_by_axis = {"dp": dp_bytes if dp > 1 else 0, "tp": 4 * layers * m * activation if tp > 1 else 0,
                     "pp": 2 * m * activation if pp > 1 else 0}
    # The config itself, so that activations follow the architecture (chapter 01); the estimator builds it
    # once on the meta device and caches it, so pricing many layouts costs no rebuilds.
    # ZeRO-3 resharding only after the step holds the weights and whole gradients through it: stage 1's memory
    held_stage = 1 if layout.zero_stage == 3 and reshard == "after_step" else layout.zero_stage
    memory = estimate_memory(w.config, precision=w.precision, optimizer=w.optimizer,
                             world_size=topo.world_size, zero_stage=held_stage, tp_size=tp, pp_size=pp,
                             micro_batch=w.micro_batch, seq_len=w.seq_len, checkpointing=w.checkpointing)
    return Prediction(layout, memory, step, parts, bytes_by_axis, (pp - 1) / slots, m,
                      memory.total <= cluster.gpu.memory)


def candidates(workload: Workload, cluster: Cluster, zero_stages=(0, 1, 2, 3)) -> list[Prediction]:
    """Every layout of ``cluster`` the model and batch allow (TP within a node, dividing the heads; PP
    dividing the layers; the batch dividing into replicas), predicted; those that fit first, fastest first."""
    heads = workload.config.num_attention_heads
    n, out = cluster.world_size, []
    for tp in (t for t in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % t == 0 and heads % t == 0):
        for pp in (p for p in range(1, workload.layers + 1) if workload.layers % p == 0 and n % (tp * p) == 0):
            dp = n // (tp * pp)
            if workload.global_batch % (dp * workload.micro_batch):
                continue
            for stage in zero_stages if dp > 1 else (0,):
                out.append(predict(workload, Layout(dp=dp, tp=tp, pp=pp, zero_stage=stage), cluster))
    return sorted(out, key=lambda p: (not p.fits, p.step_s))


def layout_of(label: str) -> Layout | None:
    """The layout a ``parlab.advice`` recommendation names: ``"TP 8 × PP 2 × DP 2 + ZeRO-1"``, ``"DDP ×32"``,
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


def cluster_of(name: str, nodes: int = 1, **changes) -> Cluster:
    """A cluster of 8-GPU A100 nodes whose GPUs talk over ``name`` inside a node (``"nvlink"`` or
    ``"pcie"``) and over InfiniBand between nodes; ``changes`` replace other fields (``inter=LINKS[...]``)."""
    if name not in ("nvlink", "pcie"):
        raise ValueError(f"name={name!r}; choose 'nvlink' or 'pcie' (the link inside a node)")
    return replace(Cluster(nodes=nodes, intra=LINKS[name]), **changes)


# -- DDP's buckets as PyTorch cuts them (chapter 06) ---------------------------------------------------------

def ddp_buckets(model, value_bytes: int = 2, bucket_bytes: int | None = None) -> list[int]:
    """Bytes of each bucket PyTorch's ``DistributedDataParallel`` all-reduces per step for ``model`` (a
    transformers config or a ``parlab.advice`` preset name) whose gradients take ``value_bytes`` each (2:
    a bf16 model; 4: fp32 weights, as under ``torch.autocast``). Each bucket is one all-reduce: on a ring,
    2(n−1) messages (:func:`ring_costs`).

    ``bucket_bytes``: DDP's ``bucket_cap_mb`` in bytes; ``None``, DDP's default: 25 MiB
    (``torch/nn/parallel/distributed.py``: ``_DEFAULT_BUCKET_CAP_MB = 25``, ``_MB_TO_BYTES = 1024 * 1024``),
    and then a first bucket of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), as DDP rebuilds them after
    the first step (chapter 03). The assignment is DDP's own function,
    ``dist._compute_bucket_assignment_by_size`` (a bucket closes once it holds the cap or more, so a few
    large weights make buckets larger than the cap and fewer than bytes ÷ cap), run over the parameters in
    reverse order on the meta device: nothing is allocated."""
    import torch
    import torch.distributed as dist

    from parlab.advice import preset
    from parlab.measure.activations import meta_model

    dtypes = {2: torch.bfloat16, 4: torch.float32}
    if value_bytes not in dtypes:
        raise ValueError(f"value_bytes={value_bytes!r}; choose 2 (bf16 gradients) or 4 (fp32 gradients)")
    if bucket_bytes is not None:
        positive_int("bucket_bytes", bucket_bytes, "bytes per bucket (DDP's bucket_cap_mb × 2**20)")
    config = preset(model) if isinstance(model, str) else model
    grads = [torch.empty(p.numel(), dtype=dtypes[value_bytes], device="meta")
             for p in reversed(list(meta_model(config.to_json_string()).parameters()))]
    limits = ([dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_BYTES] if bucket_bytes is None
              else [bucket_bytes])
    buckets, _ = dist._compute_bucket_assignment_by_size(grads, limits, [False] * len(grads))
    return [sum(grads[i].numel() * value_bytes for i in bucket) for bucket in buckets]
