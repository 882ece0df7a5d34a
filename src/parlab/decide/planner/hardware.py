"""The machine (chapter 07; chapters 02, 04, 05 and 06 use its links and collectives): links and their α-β
costs on a ring, GPUs, a cluster of nodes, and the fitted constants of each GPU generation: its share of peak
(:data:`UTILIZATIONS`) and a mixture of experts' fixed cost per local expert (:data:`EXPERT_SECONDS`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from parlab.lab.checks import positive_int
from parlab.lab.parallel.ddp import DEFAULT_BUCKET_BYTES
from parlab.lab.topology import Topology


@dataclass(frozen=True)
class Link:
    """A link between two GPUs: ``alpha`` seconds per message, ``bandwidth`` bytes/s (one direction, per GPU)."""

    name: str
    alpha: float
    bandwidth: float
    source: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.bandwidth / 1e9:g} GB/s, α = {self.alpha * 1e6:g} µs"


#: The links of the course, one figure each: bytes/s one GPU can send one way while every GPU of its node
#: does the same (between nodes: a node's adapters shared by its GPUs). Bandwidth: what NCCL's ring reaches,
#: nccl-tests' "bus bandwidth", which is by its definition the B of :func:`ring_costs`' formulas (not the
#: line rate: on NVLink NCCL loses ~20 % to its protocol); InfiniBand's line rates are within 4 % of what
#: NVIDIA measures, and kept; Ethernet's is an assumed line rate. α: assumed (typical order).
LINKS = {
    "nvlink": Link("NVLink 3 (NVSwitch)", 2e-6, 230e9,
                   "NCCL's bus bandwidth on 8 A100 SXM: 12 links at ~20 GB/s effective (25 GB/s line rate) "
                   "'should reach 230 GB/s' (NCCL's maintainer, NVIDIA/nccl-tests#149; 232.5 measured: "
                   "NVIDIA/nccl-tests#175), of the 300 GB/s line rate each way (A100 datasheet: 600 GB/s of NVLink "
                   "per GPU, both directions together)"),
    "pcie": Link("PCIe 4.0, 8-GPU server", 5e-6, 20e9,
                 "measured: ~20 GB/s nccl-tests all-reduce bus bandwidth on an 8 × A100 PCIe server once the "
                 "ring crosses the sockets (NVIDIA/nccl-tests#178); one x16 link's 31.5 GB/s (PCI-SIG: 16 GT/s × "
                 "16 lanes, 128b/130b) is what one pair reaches, not a ring of 8 behind switches and two sockets "
                 "(8 GPUs on PCIe 5.0 reach 28 GB/s: NVIDIA/nccl#1639)"),
    "infiniband": Link("InfiniBand HDR, 8 × 200 Gb/s per node", 5e-6, 25e9,
                       "NVIDIA DGX A100: eight 200 Gb/s HDR adapters, one per GPU (25 GB/s each); NVIDIA measures "
                       "192 GB/s all-reduce bus bandwidth between DGX A100 nodes over the eight (NVIDIA/nccl#812)"),
    "ethernet": Link("Ethernet 100 Gb/s", 30e-6, 100e9 / 8 / 8,
                     "one 100 Gb/s port per node, shared by its eight GPUs"),
    "nvlink4": Link("NVLink 4 (NVSwitch)", 2e-6, 370e9,
                    "NCCL's effective NVLink bandwidth on 8 H100 SXM, ~370 GB/s bus bandwidth with the ring (any "
                    "op but an all-reduce, or NCCL_ALGO=RING), of the 450 GB/s line rate each way (H100 SXM "
                    "datasheet: 900 GB/s both directions together) after ~20 % protocol overhead (NCCL's "
                    "maintainer, NVIDIA/nccl-tests#212); an all-reduce with NVLink SHARP (NCCL >= 2.17, CUDA 12) "
                    "reports ~480, which the planner does not price (torch 2.0.1's NCCL 2.14, as llm-foundry "
                    "ran, has none)"),
    "infiniband_ndr": Link("InfiniBand NDR, 8 × 400 Gb/s per node", 5e-6, 50e9,
                           "NVIDIA DGX H100: eight 400 Gb/s ConnectX-7 adapters, one per GPU (50 GB/s each; 48-49 "
                           "GB/s measured per adapter: NVIDIA/nccl-tests#267)"),
    "nvlink_h800": Link("NVLink (H800, export variant)", 2e-6, 160e9,
                        "DeepSeek-V3 technical report (arXiv:2412.19437), §3.2.2: on its H800 cluster 'NVLink offers a "
                        "bandwidth of 160 GB/s', the achievable figure (the H800's NVLink line rate is 400 GB/s both "
                        "directions together)"),
    "nvlink5": Link("NVLink 5 (NVSwitch)", 2e-6, 740e9,
                    "assumed: NVLink 4's measured ratio of NCCL bus bandwidth to line rate (370 of 450 GB/s, "
                    "NVIDIA/nccl-tests#212) applied to NVLink 5's 900 GB/s each way (B200 / GB200 datasheets: 1.8 TB/s "
                    "per GPU, both directions together); not yet a measured figure"),
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


@dataclass(frozen=True)
class GPU:
    """One accelerator: ``memory`` (bytes), peak dense ``flops`` (FLOP/s in bf16/fp16, the training precision's
    matrix products; fp32 training is priced at this rate too, as TF32's) and ``memory_bandwidth`` (bytes/s,
    what an optimizer step and the memory-bound work are bound by). ``fp8_flops``: peak dense FP8 FLOP/s,
    ``None`` where the GPU has no FP8 tensor cores (the A100: a run in FP8 is refused). ``generation``: whose
    fitted shares of peak it takes (:data:`UTILIZATIONS`). ``attention_flops``: the FLOP/s each fused attention
    kernel's forward and backward reach on it (``{"sdpa": ..., "cudnn": ...}``, the :class:`Workload`'s
    ``attention``), from published kernel benchmarks (``attention_source``); ``None``, or a kernel left out,
    where none is taken, and the kernel runs at the matrix products' rate."""

    name: str
    memory: float
    flops: float
    memory_bandwidth: float
    source: str = ""
    attention_flops: dict | None = None
    attention_source: str = ""
    fp8_flops: float | None = None
    generation: str = "a100"

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s of the matrix products in ``precision`` (``"fp8"``, else the 16-bit rate)."""
        if precision != "fp8":
            return self.flops
        if self.fp8_flops is None:
            raise ValueError(f"precision='fp8' on the {self.name}: it has no FP8 tensor cores (FP8 needs an H100, "
                             f"H800, B200 or GB200); choose precision='bf16'")
        return self.fp8_flops


A100 = GPU("A100 SXM4 80 GB", 80e9, 312e12, 2.039e12,
           "NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e")
_FA2_H100 = dict(attention_flops={"sdpa": 335e12, "cudnn": 1.5 * 335e12},
                 attention_source="sdpa: Dao 2023, FlashAttention-2 (arXiv:2307.08691), §4.1: on H100 'we obtain up to "
                                  "335 TFLOPs/s' (Fig. 7, forward + backward, head dim 64 and 128); 34 % of peak, as "
                                  "FlashAttention-3's abstract puts it (Shah et al. 2024: 'only 35% utilization'). "
                                  "cudnn: FlashAttention-3's class (Transformer Engine's cuDNN kernel under Megatron-Core), "
                                  "the low end of its abstract's '1.5-2.0x' over FlashAttention-2, its backward gaining "
                                  "least")
H100 = GPU("H100 SXM5 80 GB", 80e9, 989e12, 3.35e12,
           "NVIDIA H100 datasheet (SXM): 989 TFLOP/s dense bf16 (1,979 with sparsity), 1,979 dense FP8, 3.35 TB/s HBM3",
           fp8_flops=1979e12, generation="h100", **_FA2_H100)
#: torchtitan's benchmark hosts (Grand Teton): H100s with 96 GB of HBM2e at 2.4 TB/s, at a 500 W power limit;
#: their peak is priced as the H100 SXM's (the power limit is not).
H100_96 = GPU("H100 96 GB HBM2e (Grand Teton, 500 W)", 96e9, 989e12, 2.4e12,
              "torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 'H100 GPUs with 96 GB HBM2e ... at the default "
              "500 W power limit'", fp8_flops=1979e12, generation="h100", **_FA2_H100)
#: The H100's export variant: the same chip and rates, NVLink cut to 400 GB/s (:data:`LINKS` ``"nvlink_h800"``).
H800 = GPU("H800 SXM5 80 GB", 80e9, 989e12, 3.35e12,
           "the H100 SXM5's compute and memory (NVIDIA's H800 is the H100 with its NVLink cut to 400 GB/s; DeepSeek-V3 "
           "report, §3.2.2)", fp8_flops=1979e12, generation="h100", **_FA2_H100)
B200 = GPU("B200 SXM 180 GB", 180e9, 2.25e15, 8e12,
           "NVIDIA DGX B200 datasheet, per GPU (÷ 8): 72 PFLOPS FP8 training with sparsity (4.5 dense per GPU), "
           "bf16 half of it (2.25 dense), 1,440 GB HBM3e and 64 TB/s (180 GB, 8 TB/s)",
           fp8_flops=4.5e15, generation="blackwell")
GB200 = GPU("GB200 (NVL72) 186 GB", 186e9, 2.5e15, 8e12,
            "NVIDIA GB200 NVL72 datasheet, per GPU (÷ 72): 720 PFLOPS FP8 with sparsity (5 dense per GPU), 360 "
            "PFLOPS FP16/BF16 with sparsity (2.5 dense), 13.4 TB HBM3e at 576 TB/s (186 GB, 8 TB/s)",
            fp8_flops=5e15, generation="blackwell")
GPUS = {"a100": A100, "h100": H100, "h100_96": H100_96, "h800": H800, "b200": B200, "gb200": GB200}
#: Share of peak FLOP/s the GPU reaches on the FLOPs it executes (hardware FLOPs utilisation of the
#: computation: recomputation counted; the bubble and exposed communication are priced apart, not in it).
#: The planner's one fitted constant for the A100 generation (0.62 until Narayanan et al.'s fp16 runs kept fp16
#: gradients, :meth:`~parlab.decide.planner.workload.Workload.grad_bytes`; 0.58 until NVLink was priced at what
#: NCCL reaches, 230 GB/s, not its 300 GB/s line rate): fitted on the five runs of
#: :data:`~parlab.decide.planner.published.CALIBRATION_RUNS` (Narayanan et al. 2021 Table 1's four rows, BLOOM 176B:
#: the value that centres their errors, :func:`~parlab.decide.planner.published.calibrated_utilization`); the runs
#: of :data:`~parlab.decide.planner.published.HELD_OUT_RUNS` (Table 2) fitted nothing. Their own figures bracket it:
#: 44 % of peak for a data-parallel-only GPT 1.7B and 52 % for GPT 1T, both including bubble and
#: communication (Narayanan et al. 2021, Table 1); PaLM's 57.8 % HFU on TPUs (Chowdhery et al. 2022,
#: Appendix B).
UTILIZATION = 0.61
#: The same share for the H100 (:func:`cluster_of` ``"h100"``), its generation's one fitted constant: fitted on
#: :data:`~parlab.decide.planner.published.H100_CALIBRATION_RUNS` (MosaicML's MPT 7B at 4k and 8k tokens on 8 H100s),
#: refitted once the fused attention kernel ran at its own published rate (:attr:`GPU.attention_flops`:
#: 0.56 before), and again once llm-foundry's FSDP1 was priced with its collectives exposed and MPT's exact
#: GELU (0.68 before; ``docs/planner.md``); NVLink 4 at what NCCL reaches (370 GB/s, not 450) left it at
#: 0.66, and counting MPT's elementwise ops eager (:meth:`~parlab.decide.planner.workload.Workload.elementwise_bytes`:
#: each its own kernel, as llm-foundry ran them) 0.68; the rows of :data:`~parlab.decide.planner.published.H100_HELD_OUT_RUNS` and
#: :data:`~parlab.decide.planner.published.H100_OUT_OF_SAMPLE_RUNS` fitted nothing, though the latter's
#: memory miss prompted the GELU change that moved it.
H100_UTILIZATION = 0.68
#: The B200's and GB200's share (:func:`cluster_of` ``"b200"``, ``"gb200"``), their generation's one fitted constant, of
#: the peak of whichever precision the products run in: fitted on the dense Llama 3 8B rows on 8 B200s and 8 GB200s in
#: FP8 (:data:`~parlab.decide.planner.field.FITTED`: 0.558, priced without recomputation as the runs ran; 0.619 while
#: they were priced with selective recomputation); no other row fitted it.
BLACKWELL_UTILIZATION = 0.56
#: Each generation's one fitted share, by the precision of the matrix products: the same share of FP8 peak as of
#: bf16 peak, so FP8's products run at most as much faster as the peaks say (twice), and every FP8 row priced
#: on an H100 fitted no share (``docs/planner.md``, "Today's layouts"). The A100 has no FP8.
UTILIZATIONS = {("a100", "bf16"): UTILIZATION, ("h100", "bf16"): H100_UTILIZATION, ("h100", "fp8"): H100_UTILIZATION,
                ("blackwell", "bf16"): BLACKWELL_UTILIZATION, ("blackwell", "fp8"): BLACKWELL_UTILIZATION}
#: Seconds a rank spends per local expert per MoE layer and micro-batch (forward and backward together) beyond its
#: FLOPs and bytes: the fixed cost of running each expert as its own small matrix products (Transformer Engine's
#: grouped linear layers launch and quantise expert by expert, and a dropless dispatch waits on the device for
#: the tokens each expert got), independent of how many tokens it got. One fitted constant per generation,
#: each on its MoE rows on the fewest GPUs (:data:`~parlab.decide.planner.field.EXPERT_FITTED`: 0.39 ms on the
#: Blackwells, 1.35 ms on the H100); the A100, with no MoE row, takes the H100's, assumed (``docs/ci.md``).
EXPERT_SECONDS = {"h100": 1.35e-3, "blackwell": 0.39e-3}
EXPERT_SECONDS["a100"] = EXPERT_SECONDS["h100"]  # assumed: no A100 MoE row
#: Bytes an Adam step reads and writes per parameter (fp32 master, two moments, gradient): memory-bound.
OPTIMIZER_BYTES_PER_PARAM = 32
#: DDP's and ZeRO-2's bucket size: ``DistributedDataParallel``'s default ``bucket_cap_mb=25``, in MiB
BUCKET_BYTES = DEFAULT_BUCKET_BYTES


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` GPUs; ``intra``: the link inside an NVLink domain, ``inter``: between
    domains (per GPU: a node's adapters shared by its GPUs). ``domain``: GPUs joined by ``intra``, by default
    one node; a GB200 NVL72 rack joins 72 (18 trays of 4), so tensor and expert parallelism can leave the
    tray. ``overlap``: collectives run beside computation (GPUs) or take turns with it (CPU ranks).
    ``utilization``: the GPU's share of peak on 16-bit matrix products, ``fp8_utilization`` on FP8 ones; by
    default its generation's fitted ones (:data:`UTILIZATIONS`). ``expert_seconds``: a local expert's fixed
    cost per MoE layer and micro-batch, by default its generation's (:data:`EXPERT_SECONDS`)."""

    gpu: GPU = A100
    gpus_per_node: int = 8
    nodes: int = 1
    intra: Link = LINKS["nvlink"]
    inter: Link = LINKS["infiniband"]
    utilization: float | None = None
    overlap: bool = True
    domain: int | None = None
    fp8_utilization: float | None = None
    expert_seconds: float | None = None

    def __post_init__(self):
        positive_int("gpus_per_node", self.gpus_per_node, "GPUs in a node")
        positive_int("nodes", self.nodes, "nodes in the cluster")
        if self.utilization is None:  # the GPU generation's fitted share
            object.__setattr__(self, "utilization", UTILIZATIONS[(self.gpu.generation, "bf16")])
        if self.fp8_utilization is None:
            object.__setattr__(self, "fp8_utilization", UTILIZATIONS.get((self.gpu.generation, "fp8")))
        if self.expert_seconds is None:
            object.__setattr__(self, "expert_seconds", EXPERT_SECONDS[self.gpu.generation])
        if not self.expert_seconds >= 0:
            raise ValueError(f"expert_seconds={self.expert_seconds!r}: a local expert's fixed cost per MoE layer and "
                             f"micro-batch, in seconds, at least 0")
        if self.domain is None:
            object.__setattr__(self, "domain", self.gpus_per_node)
        positive_int("domain", self.domain, "GPUs joined by the intra link (an NVLink domain)")

    def rate(self, precision: str) -> float:
        """FLOP/s the matrix products reach in ``precision``: peak × the fitted share."""
        share = self.fp8_utilization if precision == "fp8" else self.utilization
        return self.gpu.peak(precision) * share

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def link(self, topology: Topology, axis: str) -> Link:
        """The link a ring of ``axis``'s groups runs at (:meth:`span_link` of its first group)."""
        return self.span_link(topology.group_ranks(axis, 0))  # every group of an axis spans nodes alike

    def span_link(self, group) -> Link:
        """The link a ring over the ranks ``group`` runs at: ``intra`` if they stay in one NVLink domain
        (:attr:`domain`); else the adapters between domains, as many as the group has GPUs in each (NCCL runs
        one ring per adapter: a group spanning whole nodes of DGX A100s reaches 8 × 25 GB/s, measured 192:
        NVIDIA/nccl#812), at most the link inside the domain; one GPU per domain: one adapter (``inter``)."""
        domains = [r // self.domain for r in group]
        if len(set(domains)) == 1:
            return self.intra
        per_domain = domains.count(domains[0])
        if per_domain == 1:
            return self.inter
        return Link(f"{self.inter.name} (×{per_domain} per node)", max(self.inter.alpha, self.intra.alpha),
                    min(self.intra.bandwidth, per_domain * self.inter.bandwidth), self.inter.source)

    def all_to_all_seconds(self, group, nbytes: float) -> float:
        """Seconds of one all-to-all over the ranks ``group`` in which each rank holds ``nbytes`` (the nccl-tests
        size) and keeps 1/n: (n − 1) messages, and each rank's shares for ranks in its own domain cross
        ``intra`` while those for other domains cross its own adapter (``inter``), the two at once, so the
        slower sets the time (the ring formulas do not apply: nothing is forwarded)."""
        n = len(group)
        if n < 2:
            return 0.0
        domains = [r // self.domain for r in group]
        near = domains.count(domains[0]) - 1
        far = n - 1 - near
        inside = near / n * nbytes / self.intra.bandwidth
        outside = far / n * nbytes / self.inter.bandwidth if far else 0.0
        alpha = max(self.intra.alpha, self.inter.alpha if far else 0.0)
        return (n - 1) * alpha + max(inside, outside)

    def describe(self) -> str:
        where = f"{self.nodes} node{'s' if self.nodes > 1 else ''} × {self.gpus_per_node} {self.gpu.name}"
        return where + f"; inside a node {self.intra}" + (f"; between nodes {self.inter}" if self.nodes > 1 else "")


def cluster_of(name: str, nodes: int = 1, **changes) -> Cluster:
    """A cluster of nodes of one kind: ``"nvlink"``, DGX A100 (NVLink 3 inside, 8 × HDR between nodes);
    ``"pcie"``, 8 A100s on PCIe with the same adapters; ``"h100"``, DGX H100 (NVLink 4, 8 × NDR); ``"h800"``,
    DeepSeek-V3's H800 nodes (NVLink at 160 GB/s, 8 × NDR); ``"b200"``, DGX B200 (NVLink 5, 8 × NDR);
    ``"gb200"``, GB200 NVL72 trays of 4 GPUs, 18 to a 72-GPU NVLink domain (``nodes`` counts trays), one 400
    Gb/s adapter per GPU between racks. ``changes`` replace other fields (``inter=LINKS[...]``, ``gpu=...``)."""
    kinds = {"nvlink": dict(intra=LINKS["nvlink"]), "pcie": dict(intra=LINKS["pcie"]),
             "h100": dict(gpu=H100, intra=LINKS["nvlink4"], inter=LINKS["infiniband_ndr"]),
             "h800": dict(gpu=H800, intra=LINKS["nvlink_h800"], inter=LINKS["infiniband_ndr"]),
             "b200": dict(gpu=B200, intra=LINKS["nvlink5"], inter=LINKS["infiniband_ndr"]),
             "gb200": dict(gpu=GB200, gpus_per_node=4, domain=72, intra=LINKS["nvlink5"], inter=LINKS["infiniband_ndr"])}
    if name not in kinds:
        raise ValueError(f"name={name!r}; choose one of {', '.join(map(repr, kinds))} (the kind of node)")
    return Cluster(**{"nodes": nodes, **kinds[name], **changes})  # built whole: a default domain follows gpus_per_node
