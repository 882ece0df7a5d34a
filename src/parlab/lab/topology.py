"""Which rank does what: a topology with named axes, checked once, built once (chapter 07; used from 03 on).

``world_size`` ranks are arranged in a grid, a *mesh*, with one **axis** per kind of parallelism:

- ``pp``  pipeline stages (chapter 06): outermost, so a stage's ranks are a contiguous block of ranks;
- ``dp``  data-parallel replicas or ZeRO shards (chapters 03–04);
- ``cp``  context parallelism (chapter 10): each rank of a group holds a part of every sequence;
- ``tp``  tensor parallelism (chapter 05): innermost, so a tensor-parallel group is made of neighbouring
          ranks, which on a cluster are the GPUs of one node, joined by the fastest links.

Expert parallelism (chapter 10) adds no ranks: as in torchtitan's ``ParallelDims`` (experts "borrow all cp
and some dp_shard degree"), the ``ep`` ranks that share their experts are carved out of the ``dp × cp``
ranks of one pipeline stage and tensor-parallel position (when ``ep > 1``, ``ep`` must divide ``dp·cp`` and be
a multiple of ``cp``; ``ep = 1``, a dense model, allows any ``cp``). Two derived axes follow: ``ep``,
consecutive blocks of ``ep`` ranks along dp × cp (each holds
1/ep of the experts), and ``edp``, the ranks that hold the *same* experts (their gradients are averaged
there, as the dense weights' are over dp × cp). They are groups, not dims of the DeviceMesh. A third,
``dp_cp``, is dp and cp flattened into one (torchtitan's ``dp_shard_cp``): every rank that holds the same dense
weights, the group over which their gradients are summed when cp > 1 (each cp rank saw other tokens).

A rank's *coordinate* on an axis is its index along it; the ranks that differ only in that coordinate
form the axis's *group*, the ranks that talk for that kind of parallelism. With ``pp=2, dp=2, tp=2`` rank 5
is at ``pp=1, dp=0, tp=1``; its ``tp`` group is ranks 4 and 5, its ``dp`` group 5 and 7, its ``pp`` group
1 and 5. (torchtitan's ``ParallelDims`` is the model; as there, a mesh has *axes* and a tensor has *dims*.)

``Topology(dp=2, tp=2)`` is plain arithmetic, usable anywhere (chapter 07 draws meshes with it).
``Topology.build(tp=2)`` runs on a rank: it checks the sizes against the process group once, with one
message, and builds PyTorch's ``DeviceMesh`` once, with named axes. Strategies receive a *group* from it
(``topology.group("dp")``), never the topology itself, so each stays independent of the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from parlab.lab.checks import positive_int

AXES = ("pp", "dp", "cp", "tp")  # outermost to innermost: the DeviceMesh's dims
EXPERT_AXES = ("ep", "edp")  # derived from dp × cp (chapter 10): groups, no ranks of their own
FLAT_AXES = ("dp_cp",)  # dp and cp as one: the replicas of the dense weights (torchtitan's dp_shard_cp)


@dataclass(frozen=True)
class Topology:
    """Sizes of the ``pp``, ``dp``, ``cp`` and ``tp`` axes; ``mesh`` once built on a rank."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    mesh: object = field(default=None, compare=False, repr=False)  # torch DeviceMesh, after build()
    expert_groups: object = field(default=None, compare=False, repr=False)  # {"ep", "edp"}: groups, after build()

    def __post_init__(self):
        for axis in AXES:
            positive_int(axis, getattr(self, axis), f"ranks along the {axis} axis")
        positive_int("ep", self.ep, "ranks that share the experts among them")
        # The rule binds only when there are experts to place (torchtitan checks it only for ep > 1): a
        # dense model with ep = 1 may use any cp.
        if self.ep > 1 and ((self.dp * self.cp) % self.ep or self.ep % self.cp):
            raise ValueError(f"ep={self.ep} must divide dp × cp = {self.dp} × {self.cp} and be a multiple of "
                             f"cp={self.cp}: expert parallelism borrows the ranks of dp × cp (torchtitan's rule)")

    # -- sizes and coordinates: arithmetic only, no process group needed ----------------------------
    @classmethod
    def infer(cls, world_size: int, *, dp: int | None = None, tp: int = 1, pp: int = 1, cp: int = 1,
              ep: int = 1) -> Topology:
        """The topology of ``world_size`` ranks; ``dp`` defaults to what the other axes leave.

        This is the one place that checks ``pp × dp × cp × tp == world_size``.
        """
        positive_int("world_size", world_size, "the number of ranks")
        for name, value in (("tp", tp), ("pp", pp), ("cp", cp)):
            positive_int(name, value, f"ranks along the {name} axis")
        model_parallel = tp * pp * cp
        if dp is None:
            if world_size % model_parallel:
                raise ValueError(f"world_size={world_size} is not a multiple of tp × pp × cp = {tp} × {pp} × "
                                 f"{cp} = {model_parallel}; the data-parallel size dp is what remains, so choose "
                                 f"sizes whose product divides the number of ranks")
            dp = world_size // model_parallel
        positive_int("dp", dp, "ranks along the dp axis")
        if dp * model_parallel != world_size:
            raise ValueError(f"pp × dp × cp × tp = {pp} × {dp} × {cp} × {tp} = {dp * model_parallel} ranks, but "
                             f"world_size={world_size}: the axes' sizes must multiply to the number of ranks")
        return cls(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def sizes(self) -> dict[str, int]:
        """Axis -> size, outermost first."""
        return {axis: getattr(self, axis) for axis in AXES}

    def coords(self, rank: int) -> dict[str, int]:
        """Axis -> the coordinate of ``rank`` (row-major, ``tp`` fastest)."""
        self._check_rank(rank)
        out = {}
        for axis in reversed(AXES):
            rank, out[axis] = divmod(rank, getattr(self, axis))
        return {axis: out[axis] for axis in AXES}

    def rank_at(self, **coords: int) -> int:
        """The rank at the given coordinates (axes not named are 0)."""
        unknown = set(coords) - set(AXES)
        if unknown:
            raise ValueError(f"unknown axis {sorted(unknown)}; the axes are {', '.join(AXES)}")
        rank = 0
        for axis in AXES:
            c, size = coords.get(axis, 0), getattr(self, axis)
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < size:
                raise ValueError(f"{axis}={c!r} must be an int in 0..{size - 1}")
            rank = rank * size + c
        return rank

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """The ranks in ``rank``'s group along ``axis``: those that differ from it only there (for ``ep`` and
        ``edp``: its block of ep ranks along dp × cp, and the ranks at its place in the other blocks)."""
        self._check_axis(axis)
        c = self.coords(rank)
        if axis == "dp_cp":
            return [self.rank_at(**dict(c, dp=f // self.cp, cp=f % self.cp)) for f in range(self.dp * self.cp)]
        if axis in EXPERT_AXES:
            flat = c["dp"] * self.cp + c["cp"]  # rank's index along dp × cp
            if axis == "ep":
                along = range(flat - flat % self.ep, flat - flat % self.ep + self.ep)
            else:
                along = range(flat % self.ep, self.dp * self.cp, self.ep)
            return [self.rank_at(**dict(c, dp=f // self.cp, cp=f % self.cp)) for f in along]
        return [self.rank_at(**dict(c, **{axis: i})) for i in range(getattr(self, axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, each a list of ranks (what ``DeviceMesh`` creates for that axis)."""
        self._check_axis(axis)
        seen, out = set(), []
        for r in range(self.world_size):
            g = self.group_ranks(axis, r)
            if g[0] not in seen:
                seen.add(g[0])
                out.append(g)
        return out

    def describe(self) -> str:
        """One line per rank: its coordinates. For reading a mesh, or printing it in a notebook."""
        used = [a for a in AXES if getattr(self, a) > 1] or ["dp"]
        head = " × ".join(f"{a}={getattr(self, a)}" for a in used)
        lines = [f"{self.world_size} ranks: {head}" + (f", experts over ep={self.ep}" if self.ep > 1 else "")]
        for r in range(self.world_size):
            c = self.coords(r)
            lines.append(f"  rank {r}: " + ", ".join(f"{a}={c[a]}" for a in used)
                         + (f", ep group {self.group_ranks('ep', r)}" if self.ep > 1 else ""))
        return "\n".join(lines)

    # -- on a rank: the DeviceMesh and what strategies need from it ---------------------------------
    @classmethod
    def build(cls, *, dp: int | None = None, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
              device_type: str | None = None) -> Topology:
        """On every rank of an initialised process group: check the sizes, build the named DeviceMesh."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from parlab.lab import runtime
        if not dist.is_initialized():
            raise RuntimeError("Topology.build() needs an initialised process group: call it on a rank "
                               "(inside parlab.launch, or under torchrun)")
        topo = cls.infer(dist.get_world_size(), dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
        # Every axis is in the mesh, size 1 included, so that code can always ask for an axis's group.
        mesh = init_device_mesh(device_type or runtime.device().type, tuple(topo.sizes.values()),
                                mesh_dim_names=AXES)
        if topo.dp > 1 and topo.cp > 1:  # otherwise dp_cp is the dp or the cp axis itself
            mesh["dp", "cp"]._flatten("dp_cp")
        experts = None
        if ep > 1:  # every rank creates every group, in the same order (torch.distributed's rule)
            experts = {axis: dist.new_subgroups_by_enumeration(topo.groups(axis))[0] for axis in EXPERT_AXES}
        return replace(topo, mesh=mesh, expert_groups=experts)

    def built(self, device_type: str | None = None) -> Topology:
        """This topology with its DeviceMesh, on every rank: itself if built already, else built now."""
        if self.mesh is not None:
            return self
        return Topology.build(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, device_type=device_type)

    @property
    def rank(self) -> int:
        return self._mesh().get_rank()

    def coord(self, axis: str) -> int:
        """This rank's coordinate on ``axis`` (its rank within that axis's group)."""
        self._check_axis(axis)
        if axis in EXPERT_AXES + FLAT_AXES:
            import torch.distributed as dist

            return dist.get_rank(self.group(axis))
        return self._mesh().get_local_rank(axis)

    def group(self, axis: str):
        """The process group of this rank along ``axis``: what a strategy for that axis is given."""
        self._check_axis(axis)
        if axis in EXPERT_AXES:
            self._mesh()
            if self.expert_groups is None:
                raise ValueError(f"ep=1: there is no {axis!r} group (every rank holds every expert); build "
                                 f"the topology with ep > 1")
            return self.expert_groups[axis]
        if axis in FLAT_AXES:
            return self.submesh(axis).get_group()
        return self._mesh().get_group(axis)

    def submesh(self, axis: str):
        """The 1-D DeviceMesh along ``axis`` (what FSDP2 and DTensor take)."""
        if axis in EXPERT_AXES:
            raise ValueError(f"{axis!r} is a group carved out of dp × cp, not a dim of the DeviceMesh: use group()")
        self._check_axis(axis)
        if axis == "dp_cp" and not (self.dp > 1 and self.cp > 1):
            axis = "cp" if self.cp > 1 else "dp"
        return self._mesh()[axis]

    @property
    def pp_stage(self) -> int:
        return self.coord("pp")

    @property
    def is_first_stage(self) -> bool:
        return self.pp_stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_stage == self.pp - 1

    # -- checks ---------------------------------------------------------------------------------------
    def _mesh(self):
        if self.mesh is None:
            raise RuntimeError("this Topology has no DeviceMesh: create it on a rank with Topology.build(...)")
        return self.mesh

    def _check_axis(self, axis) -> None:
        if axis not in AXES + EXPERT_AXES + FLAT_AXES:
            raise ValueError(f"axis={axis!r} is not an axis; the axes are {', '.join(AXES + EXPERT_AXES + FLAT_AXES)}")

    def _check_rank(self, rank) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} must be an int in 0..{self.world_size - 1}")
