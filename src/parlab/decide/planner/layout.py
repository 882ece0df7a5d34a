"""A layout (chapter 07): the sizes of its axes, dp, tp, pp, cp, ep (with etp) and vp, its ZeRO stage and HSDP's
shard groups, where each axis's groups lie among the ranks, and a model's layers and weights per pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from parlab.lab.checks import positive_int
from parlab.lab.topology import Topology

if TYPE_CHECKING:
    from parlab.decide.planner.workload import Workload

#: How context parallelism exchanges keys and values (:class:`Layout`'s ``cp_kind``): ``"ring"`` (ring
#: attention: cp − 1 K/V blocks passed around, each hidden behind the attention of the one before; torchtitan's and
#: Megatron-Core's ``p2p``) or ``"all_gather"`` (every rank gathers the whole K/V before attention and
#: reduce-scatters their gradients after, exposed: Llama 3, Dubey et al. 2024, §3.3.2).
CP_KINDS = ("ring", "all_gather")


@dataclass(frozen=True)
class Layout:
    """A layout's axes: ``dp``, ``tp``, ``pp``, ``cp`` (context parallelism: each rank holds seq_len/cp tokens of
    every sequence, exchanging keys and values by ``cp_kind``, :data:`CP_KINDS`), ``ep`` (expert parallelism:
    the routed experts split ep ways over ranks carved from tp × cp × dp, Megatron-Core's MoE parallel
    folding), ``etp`` (expert tensor parallelism: 1, each expert whole on its rank, or ``tp``, split as the
    dense MLP is), ``vp`` (model chunks per pipeline rank: the interleaved 1F1B schedule, chapter 06); and
    ZeRO's stage over dp × cp (0: plain DDP). ``shard``: HSDP, ZeRO over groups of ``shard`` dp ranks (× cp)
    and the groups replicated over the other dp/shard, their gradients all-reduced across (chapters 04, 08);
    ``None``: ZeRO over every dp rank."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    cp: int = 1
    ep: int = 1
    vp: int = 1
    shard: int | None = None
    etp: int = 1
    cp_kind: str = "ring"

    def __post_init__(self):
        for axis in ("dp", "tp", "pp", "cp", "ep", "vp", "etp"):
            positive_int(axis, getattr(self, axis), f"the layout's {axis} size")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r} must be 0, 1, 2 or 3")
        if self.cp_kind not in CP_KINDS:
            raise ValueError(f"cp_kind={self.cp_kind!r}; choose one of {', '.join(map(repr, CP_KINDS))}")
        if self.etp not in (1, self.tp):
            raise ValueError(f"etp={self.etp}: expert tensor parallelism is 1 (each expert whole) or tp={self.tp}")
        if (self.tp * self.cp * self.dp) % (self.ep * self.etp):
            raise ValueError(f"ep × etp = {self.ep * self.etp} must divide tp × cp × dp = "
                             f"{self.tp * self.cp * self.dp} (the experts' ranks are the dense layers' ranks, folded)")
        if self.shard is not None:
            positive_int("shard", self.shard, "dp ranks per HSDP shard group")
            if self.dp % self.shard or not self.zero_stage:
                raise ValueError(f"shard={self.shard}: HSDP shards a ZeRO stage (zero_stage={self.zero_stage}) over "
                                 f"groups of shard dp ranks, so shard must divide dp={self.dp} and zero_stage be 1-3")

    @property
    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def replicas(self) -> int:
        """HSDP's replicated groups (1 without HSDP)."""
        return self.dp // self.shard if self.shard else 1

    def group(self, axis: str) -> list[int]:
        """Rank 0's group on ``axis``, as the planner places ranks (tp innermost, then cp, then dp, then pp):
        ``"dp_cp"`` every rank holding the same dense weights; ``"shard"`` and ``"replicate"`` HSDP's two;
        ``"ep"`` the ranks splitting the experts (consecutive ranks with etp = 1, every tp-th with etp = tp);
        ``"edp"`` the ranks holding the same experts; else the topology's axis."""
        t, c, inner = self.tp, self.cp, self.tp * self.cp * self.dp
        stride = self.etp  # with etp = tp the experts' ranks step over tensor-parallel positions
        groups = {"dp_cp": [i * t for i in range(self.dp * c)],
                  "shard": [i * t for i in range((self.shard or self.dp) * c)],
                  "replicate": [i * t * c * (self.shard or self.dp) for i in range(self.replicas)],
                  "ep": [i * stride for i in range(self.ep)],
                  "edp": [i * stride * self.ep for i in range(inner // (self.ep * self.etp))]}
        return groups[axis] if axis in groups else self.topology.group_ranks(axis, 0)

    def __str__(self) -> str:
        axes = [f"{name} {size}" for name, size in (("TP", self.tp), ("CP", self.cp), ("PP", self.pp),
                                                     ("DP", self.dp)) if size > 1]
        name = " × ".join(axes) or "1 GPU"
        if self.ep > 1:
            name += f", EP {self.ep}" + (f" (ETP {self.etp})" if self.etp > 1 else "")
        if self.vp > 1:
            name += f", {self.vp} chunks"
        if self.cp > 1 and self.cp_kind != "ring":
            name += " (CP all-gather)"
        if self.shard and self.zero_stage and self.dp > 1:
            return name + f" + HSDP (ZeRO-{self.zero_stage} over {self.shard}, × {self.replicas})"
        zero = f" + ZeRO-{self.zero_stage}" if self.zero_stage and self.dp * self.cp > 1 else ""
        return name + zero


def stage_layers(workload: Workload, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage, first to last, as evenly as the slowest stage allows: the last stage also
    runs the output layer (:attr:`Workload.output_flops`, as many layers' worth of FLOPs as it costs), so it
    may take fewer layers; every stage at least one. Real pipelines split unevenly too (BLOOM: 70 layers on
    12 stages, Megatron-DeepSpeed's ``--pp-partition-method``; Megatron-LM's
    ``--decoder-last-pipeline-num-layers``)."""
    layers = workload.layers
    pp = positive_int("pp", pp, "pipeline stages")
    if pp > layers:
        raise ValueError(f"pp={pp} stages for {layers} layers: every stage needs at least one layer")
    if pp == 1:
        return (layers,)
    out = workload.output_flops / workload.layer_flops  # the output layer, in layers

    def slowest(last):
        rest = layers - last
        return max(-(-rest // (pp - 1)), last + out)

    last = min((n for n in range(1, layers - pp + 2)), key=lambda n: (slowest(n), -n))
    q, r = divmod(layers - last, pp - 1)
    return tuple([q] * (pp - 1 - r) + [q + 1] * r + [last])


def stage_params(workload: Workload, pp: int) -> tuple[float, ...]:
    """Weights per stage: its layers; the first also the embedding (and whatever else of the root is not the
    output layer), the last the output layer and final norm (a copy of the embedding when the two are tied,
    as Megatron-LM keeps one on each end)."""
    w, per_stage = workload, stage_layers(workload, pp)
    tied = getattr(w.config, "tie_word_embeddings", False)
    first_end = w.root_params - (0 if tied else w.output_params)
    if pp == 1:
        return (w.num_params,)
    params = [n * w.layer_params for n in per_stage]
    params[0] += first_end
    params[-1] += w.output_params
    return tuple(params)
