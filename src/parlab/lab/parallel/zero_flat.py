"""What ZeRO's three stages share (``zero.py`` tells the stages apart): the flat, padded buffers a group
of parameters is laid into, and the base that shards them (chapter 04).

:class:`FlatParams` lays a group's parameters end to end in one buffer whose length is rounded up with
zeros to a multiple of N, so that any parameter count shards over any N: rank r owns elements
[r·S, (r+1)·S), S = ⌈Ψ/N⌉. :class:`_Zero` checks its arguments, broadcasts rank 0's starting point,
builds each stage's groups and keeps this rank's master shards, with the optimizer that updates only them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map

from parlab.lab.parallel.comm import communicate


class FlatParams:
    """Parameters laid end to end in one flat buffer of ``padded_numel`` = N·S elements, S = ⌈Ψ/N⌉.

    The layout only: where each parameter lies and which slice is this rank's. The stage that owns it keeps
    its buffers here: ``master`` (this rank's shard, updated by the optimizer), ``full`` (the whole weights,
    when this rank holds them), ``grad`` (the flat gradient being reduced), ``grad_shard`` (its reduced
    shard) and ``work`` (a collective in flight).
    """

    def __init__(self, name: str, params: list, names: list[str], rank: int, world_size: int):
        self.name, self.params, self.names, self.rank = name, params, names, rank
        self.shapes = [p.shape for p in params]
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.numel = self.offsets[-1]  # Ψ of this group
        self.shard_numel = -(-self.numel // world_size)  # S = ceil(Ψ / N)
        self.padded_numel = self.shard_numel * world_size  # the last shards end in zeros
        self.master = self.full = self.grad = self.grad_shard = self.work = None

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's (S,) slice of a (N·S,) buffer."""
        return flat[self.rank * self.shard_numel:(self.rank + 1) * self.shard_numel]

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s slice of ``flat``, shaped like it."""
        return flat[self.offsets[i]:self.offsets[i + 1]].view(self.shapes[i])

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [self.view(flat, i) for i in range(len(self.params))]

    def flatten(self, tensors, dtype, device) -> torch.Tensor:
        """A new (N·S,) buffer holding ``tensors`` end to end (``None``: zeros), then zero padding."""
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for view, t in zip(self.views(flat), tensors):
            if t is not None:
                view.copy_(t)
        return flat


class _Zero(nn.Module):
    """What the stages share: checks, one starting point on every rank, the flat layout, the master shards
    (registered as this module's ``shards``) and the optimizer that updates only them."""

    def __init__(self, module: nn.Module, optimizer_class, process_group, param_dtype, reduce_dtype,
                 optimizer_kwargs: dict):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer class, e.g. torch.optim.AdamW; "
                            f"got {optimizer_class!r}")
        for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                raise ValueError(f"{name} must be a floating torch.dtype (e.g. torch.bfloat16) or None; got {dtype!r}")
        if not dist.is_initialized():
            raise RuntimeError("ZeRO needs an initialised process group: run inside parlab.launch (or torchrun "
                               "after dist.init_process_group)")
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("module has no trainable parameters to shard")
        kinds = sorted({f"{p.dtype} on {p.device}" for p in params})
        if len(kinds) > 1:
            raise ValueError(f"the flat buffers hold one dtype on one device; module's parameters are {kinds}")
        self.module = module
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        self.master_dtype, self.device = params[0].dtype, params[0].device
        self.param_dtype = param_dtype or self.master_dtype
        self.reduce_dtype = reduce_dtype or self.param_dtype
        with torch.no_grad():  # one starting point everywhere: rank 0's (chapter 03)
            for t in [*module.parameters(), *module.buffers()]:
                self._communicate("broadcast", t, None, src=0)
            names = {id(p): n for n, p in module.named_parameters()}
            self.groups = [FlatParams(label, ps, [names[id(p)] for p in ps], self.rank, self.world_size)
                           for label, ps in self._layout(params)]
            for g in self.groups:
                g.master = nn.Parameter(self._init_group(g))
        self.shards = nn.ParameterList([g.master for g in self.groups])
        self.optimizer = optimizer_class(self.shards, **optimizer_kwargs)

    def _layout(self, params: list) -> list[tuple[str, list]]:
        """(label, parameters) of each flat group."""
        raise NotImplementedError

    def _init_group(self, g: FlatParams) -> torch.Tensor:
        """Set up ``g``'s buffers; return this rank's shard of its weights in the master dtype."""
        raise NotImplementedError

    def _communicate(self, op: str, tensor: torch.Tensor, label, **kwargs):
        return communicate(op, tensor, self.process_group, label=label, **kwargs)

    def _master_flat(self, g: FlatParams) -> torch.Tensor:
        """The group's current weights, flattened in the master dtype: (N·S,)."""
        return g.flatten([p.detach() for p in g.params], self.master_dtype, self.device)

    def forward(self, *args, **kwargs):
        if self.param_dtype != self.master_dtype:  # float inputs in the compute dtype, as FSDP2 does
            args, kwargs = tree_map(self._cast, (args, kwargs))
        return self.module(*args, **kwargs)

    def _cast(self, x):
        return x.to(self.param_dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    @torch.no_grad()
    def step(self) -> None:
        """Reduce the gradients (what backward has not yet sent), update this rank's shard, share the result."""
        self._reduce_gradients()
        self.optimizer.step()
        self._publish()

    def _reduce_gradients(self) -> None:
        raise NotImplementedError

    def _publish(self) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for g in self.groups:
            g.master.grad = None

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every trained parameter, whole, in the master dtype, on every rank (not training: call it outside the
        ``CommLog`` that counts a step)."""
        out = {}
        for g in self.groups:
            flat = torch.empty(g.padded_numel, dtype=self.master_dtype, device=self.device)
            communicate("all_gather", g.master.detach(), self.process_group, output=flat)
            out.update((name, view.clone()) for name, view in zip(g.names, g.views(flat)))
        return out
