"""The machine (chapter 07; chapters 02, 04, 05 and 06 use its links and collectives): links and their α-β
costs on a ring, GPUs, a cluster of nodes, and one fitted constant per GPU generation (:data:`UTILIZATION`,
:data:`H100_UTILIZATION`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    """One accelerator: ``memory`` (bytes), peak dense ``flops`` (FLOP/s in the training precision) and
    ``memory_bandwidth`` (bytes/s, what an optimizer step is bound by). ``attention_flops``: the FLOP/s a
    fused attention kernel's forward and backward reach on it, from a published kernel benchmark (its
    ``attention_source``); ``None`` where none is taken, and the kernel runs at the matrix products' rate."""

    name: str
    memory: float
    flops: float
    memory_bandwidth: float
    source: str = ""
    attention_flops: float | None = None
    attention_source: str = ""


A100 = GPU("A100 SXM4 80 GB", 80e9, 312e12, 2.039e12,
           "NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e")
H100 = GPU("H100 SXM5 80 GB", 80e9, 989e12, 3.35e12,
           "NVIDIA H100 datasheet (SXM): 989 TFLOP/s dense bf16 (1,979 with sparsity), 3.35 TB/s HBM3",
           attention_flops=335e12,
           attention_source="Dao 2023, FlashAttention-2 (arXiv:2307.08691), §4.1: on H100 'we obtain up to 335 "
                            "TFLOPs/s' (Fig. 7, forward + backward, head dim 64 and 128); 34 % of peak, as "
                            "FlashAttention-3's abstract puts it (Shah et al. 2024: 'only 35% utilization')")
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
#: 0.66; the rows of :data:`~parlab.decide.planner.published.H100_HELD_OUT_RUNS` and
#: :data:`~parlab.decide.planner.published.H100_OUT_OF_SAMPLE_RUNS` fitted nothing, though the latter's
#: memory miss prompted the GELU change that moved it.
H100_UTILIZATION = 0.66
#: Bytes an Adam step reads and writes per parameter (fp32 master, two moments, gradient): memory-bound.
OPTIMIZER_BYTES_PER_PARAM = 32
#: DDP's and ZeRO-2's bucket size: ``DistributedDataParallel``'s default ``bucket_cap_mb=25``, in MiB
BUCKET_BYTES = DEFAULT_BUCKET_BYTES


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` GPUs; ``intra``: the link inside a node, ``inter``: between nodes (per
    GPU: a node's adapters shared by its GPUs). ``overlap``: collectives run beside computation (GPUs) or
    take turns with it (CPU ranks). ``utilization``: the GPU's share of peak; by default its generation's fitted one,
    :data:`H100_UTILIZATION` for the :data:`H100`, else :data:`UTILIZATION` (the A100's)."""

    gpu: GPU = A100
    gpus_per_node: int = 8
    nodes: int = 1
    intra: Link = LINKS["nvlink"]
    inter: Link = LINKS["infiniband"]
    utilization: float | None = None
    overlap: bool = True

    def __post_init__(self):
        if self.utilization is None:  # the GPU generation's fitted share
            object.__setattr__(self, "utilization", H100_UTILIZATION if self.gpu == H100 else UTILIZATION)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def link(self, topology: Topology, axis: str) -> Link:
        """The link a ring of ``axis``'s groups runs at: ``intra`` if every group stays in a node; else the
        adapters between nodes, as many as the group has GPUs in each node (NCCL runs one ring per adapter:
        a group spanning whole nodes of DGX A100s reaches 8 × 25 GB/s, measured 192: NVIDIA/nccl#812), at
        most the link inside the node; one GPU per node: one adapter (``inter``)."""
        group = topology.group_ranks(axis, 0)  # every group of an axis spans nodes alike
        nodes = [r // self.gpus_per_node for r in group]
        if len(set(nodes)) == 1:
            return self.intra
        per_node = nodes.count(nodes[0])
        if per_node == 1:
            return self.inter
        return Link(f"{self.inter.name} (×{per_node} per node)", max(self.inter.alpha, self.intra.alpha),
                    min(self.intra.bandwidth, per_node * self.inter.bandwidth), self.inter.source)

    def describe(self) -> str:
        where = f"{self.nodes} node{'s' if self.nodes > 1 else ''} × {self.gpus_per_node} {self.gpu.name}"
        return where + f"; inside a node {self.intra}" + (f"; between nodes {self.inter}" if self.nodes > 1 else "")


def cluster_of(name: str, nodes: int = 1, **changes) -> Cluster:
    """A cluster of 8-GPU nodes: ``"nvlink"``, DGX A100 (NVLink 3 inside, 8 × HDR between nodes);
    ``"pcie"``, 8 A100s on PCIe with the same adapters; ``"h100"``, DGX H100 (NVLink 4, 8 × NDR).
    ``changes`` replace other fields (``inter=LINKS[...]``, ``gpu=...``)."""
    kinds = {"nvlink": dict(intra=LINKS["nvlink"]), "pcie": dict(intra=LINKS["pcie"]),
             "h100": dict(gpu=H100, intra=LINKS["nvlink4"], inter=LINKS["infiniband_ndr"])}
    if name not in kinds:
        raise ValueError(f"name={name!r}; choose 'nvlink', 'pcie' or 'h100' (the kind of node)")
    return replace(Cluster(nodes=nodes, **kinds[name]), **changes)
