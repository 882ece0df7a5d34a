"""ZeRO from scratch: the Zero Redundancy Optimizer's three stages. Taught in chapter 04.

Data parallelism (chapter 03) keeps on every rank a whole copy of the weights, the gradients and the
optimizer state: 2Ψ + 2Ψ + KΨ bytes in mixed precision (K = 12 for Adam). ZeRO partitions them over the N
ranks of the data-parallel group instead (S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC 2020, arXiv:1910.02054, §5 and §7):

- :class:`ZeroStage1` (P_os): each rank keeps the optimizer state (and fp32 master weights) of its 1/N
  shard only. After backward the gradients are reduce-scattered (``reduce="reduce_scatter"``: each rank
  receives its Ψ/N, a volume of Ψ in the paper's count; or, naively, all-reduced, a volume of 2Ψ, of which
  each rank uses 1/N: ``"all_reduce"``); each rank updates its shard; the weights are all-gathered, Ψ. In
  all 2Ψ, what DDP's all-reduce costs (§7.2.1). This class overlaps nothing: Megatron-LM's distributed
  optimizer reduce-scatters during backward and all-gathers during the next forward (chapter 04, section 8).
- :class:`ZeroStage2` (P_os+g): the gradients too. They are reduce-scattered bucket by bucket *during*
  backward, as chapter 03's DDP v3 all-reduces them, and a full gradient lives only until its bucket has
  been sent: each rank keeps the gradient shard it updates with.
- :class:`ZeroStage3` (P_os+g+p): the weights too. Each block's weights are all-gathered just before its
  forward and freed after it, all-gathered again before its backward and freed after it, when its
  gradients are reduce-scattered: 3Ψ per step (§7.2.2). ``prefetch=True`` issues the next block's
  all-gather while this one computes, hiding communication at the cost of holding two blocks at once.

Flat buffers with padding: each group of parameters (the whole model for stage 1, a bucket for stage 2, a
block for stage 3) is laid end to end in one flat buffer whose length is rounded up with zeros to a
multiple of N (:class:`FlatParams`), so that any parameter count shards over any N: rank r owns elements
[r·S, (r+1)·S), S = ⌈Ψ/N⌉. The padding is zero in weights and gradients, and Adam keeps it zero.

Mixed precision: ``param_dtype=torch.bfloat16`` computes in bf16 while the optimizer updates fp32 master
shards (cast to bf16 before they are gathered); gradients are reduced in ``reduce_dtype`` (default
``param_dtype``), as FSDP2's ``MixedPrecisionPolicy`` does.

The three share one usage (inside a rank, with the process group initialised)::

    zero = ZeroStage3(model, torch.optim.AdamW, lr=1e-3, blocks=model.transformer.h, prefetch=True)
    loss = loss_fn(zero(x_shard), y_shard)
    loss.backward()
    zero.step()       # reduce what is left, update this rank's shard, (stages 1-2) all-gather the weights
    zero.zero_grad()

Every collective goes through ``parlab.parallel.comm.communicate`` on ``process_group`` (default: all
ranks; chapter 07 passes ``Topology.group("dp")``): ``on_collective=`` (a ``parlab.measure.CommLog``)
counts them, labelled with the group's name. :meth:`_Zero.full_state_dict` gathers the master weights
into whole tensors named like the model's parameters.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from parlab.checks import positive_int
from parlab.parallel.comm import OnCollective, check_callback, communicate
from parlab.parallel.ddp import DEFAULT_BUCKET_BYTES

REDUCE = ("reduce_scatter", "all_reduce")


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

    def __init__(self, module: nn.Module, optimizer_class, process_group, on_collective: OnCollective | None,
                 param_dtype, reduce_dtype, optimizer_kwargs: dict):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer class, e.g. torch.optim.AdamW; "
                            f"got {optimizer_class!r}")
        for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                raise ValueError(f"{name} must be a floating torch.dtype (e.g. torch.bfloat16) or None; got {dtype!r}")
        check_callback(on_collective)
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
        self.on_collective = on_collective
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
        return communicate(op, tensor, self.process_group, on_collective=self.on_collective, label=label, **kwargs)

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
        """Every trained parameter, whole, in the master dtype, on every rank (not recorded: not training)."""
        out = {}
        for g in self.groups:
            flat = torch.empty(g.padded_numel, dtype=self.master_dtype, device=self.device)
            communicate("all_gather", g.master.detach(), self.process_group, output=flat)
            out.update((name, view.clone()) for name, view in zip(g.names, g.views(flat)))
        return out


class ZeroStage1(_Zero):
    """P_os: optimizer state sharded; weights and gradients whole on every rank (chapter 04).

    One flat group holds the whole model. Backward accumulates gradients into one flat buffer (each
    ``.grad`` is a view of it); :meth:`step` reduces it (``reduce``: ``"reduce_scatter"`` delivers each rank
    only its Ψ/N, a volume of Ψ; ``"all_reduce"`` delivers everyone all Ψ, a volume of 2Ψ), updates this
    rank's shard with ``optimizer_class(**optimizer_kwargs)``, and all-gathers the weights (Ψ). Zero the
    gradients with :meth:`zero_grad` (it keeps the views). Rajbhandari et al. 2020, §5.1 and §7.2.1.
    """

    def __init__(self, module: nn.Module, optimizer_class=torch.optim.Adam, *, reduce: str = "reduce_scatter",
                 process_group=None, param_dtype=None, reduce_dtype=None, on_collective: OnCollective | None = None,
                 **optimizer_kwargs):
        if reduce not in REDUCE:
            raise ValueError(f"reduce={reduce!r}; choose one of {', '.join(map(repr, REDUCE))}")
        self.reduce = reduce
        super().__init__(module, optimizer_class, process_group, on_collective, param_dtype, reduce_dtype,
                         optimizer_kwargs)

    def _layout(self, params):
        return [("model", params)]

    def _replicate(self, g: FlatParams) -> torch.Tensor:
        """Whole weights on this rank: the parameters become views of one flat buffer, ``g.full``."""
        flat = self._master_flat(g)  # (N·S,) in the master dtype
        g.full = flat if self.param_dtype == self.master_dtype else flat.to(self.param_dtype)
        for p, view in zip(g.params, g.views(g.full)):
            p.data = view
        # fp32 training: the master shard *is* this rank's slice of the weights; mixed precision: an fp32 copy
        return g.shard(flat) if g.full is flat else g.shard(flat).clone()

    def _init_group(self, g):
        master = self._replicate(g)
        g.grad = torch.zeros_like(g.full)  # (N·S,) whole gradients: stage 1 does not shard them
        for p, view in zip(g.params, g.views(g.grad)):
            p.grad = view  # backward accumulates into the buffer in place
        return master

    def _reduce_gradients(self):
        for g in self.groups:
            for i, p in enumerate(g.params):
                if p.grad is None or p.grad.data_ptr() != g.view(g.grad, i).data_ptr():
                    raise RuntimeError(f"{g.names[i]}.grad is no longer a view of the flat gradient buffer: zero "
                                       f"gradients with ZeroStage1.zero_grad(), not the module's or an optimizer's")
            grad = g.grad if self.reduce_dtype == g.grad.dtype else g.grad.to(self.reduce_dtype)
            grad.div_(self.world_size)  # the sum of gradient / N over ranks is the average
            if self.reduce == "all_reduce":  # every rank receives the whole average, and uses 1/N of it
                self._communicate("all_reduce", grad, g.name)
            else:  # in place: this rank's shard of the input receives its shard of the sum
                self._communicate("reduce_scatter", grad, g.name, output=g.shard(grad))
            g.master.grad = g.shard(grad).to(self.master_dtype)  # a view when the dtypes agree

    def _publish(self):
        for g in self.groups:
            shard = g.shard(g.full)
            if shard.data_ptr() != g.master.data_ptr():
                shard.copy_(g.master)  # mixed precision: the updated fp32 shard, in the compute dtype
            self._communicate("all_gather", shard, g.name, output=g.full)  # in place: (S,) -> (N·S,)

    def zero_grad(self) -> None:
        for g in self.groups:
            g.grad.zero_()
            if g.master.grad is not None and g.master.grad.data_ptr() != g.shard(g.grad).data_ptr():
                g.master.grad = None


class ZeroStage2(ZeroStage1):
    """P_os+g: gradients sharded too, reduce-scattered bucket by bucket during backward (chapter 04).

    Parameters are grouped into buckets of about ``bucket_bytes`` in reverse order, as chapter 03's DDP
    does. A hook on each parameter copies its gradient into its bucket's flat buffer as soon as autograd
    has written it, and drops the full gradient; a complete bucket is reduce-scattered asynchronously,
    in bucket order on every rank, and once the next bucket is launched its buffer is released (at most
    two buckets in flight, DeepSpeed's double buffering). Each rank keeps only its reduced shard.
    One backward per step. Rajbhandari et al. 2020, §5.2.
    """

    def __init__(self, module: nn.Module, optimizer_class=torch.optim.Adam, *,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, process_group=None, param_dtype=None, reduce_dtype=None,
                 on_collective: OnCollective | None = None, **optimizer_kwargs):
        self.bucket_bytes = positive_int("bucket_bytes", bucket_bytes, "bytes of gradient per bucket")
        super().__init__(module, optimizer_class, process_group=process_group, param_dtype=param_dtype,
                         reduce_dtype=reduce_dtype, on_collective=on_collective, **optimizer_kwargs)
        self._where = {id(p): (g, i) for g in self.groups for i, p in enumerate(g.params)}
        self._reduce_order = list(self.groups)  # stage 3 reorders: the order backward finishes its blocks
        self._reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for g in self.groups for p in g.params]

    def _layout(self, params):
        buckets, current, size = [], [], 0
        for p in reversed(params):  # roughly the order backward produces gradients
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= self.bucket_bytes:  # full: close it (DDP's rule)
                buckets.append(current)
                current, size = [], 0
        return [(f"bucket {i}", b) for i, b in enumerate(buckets + [current] if current else buckets)]

    def _init_group(self, g):
        return self._replicate(g)

    def _reset(self) -> None:
        self._missing = {id(g): len(g.params) for g in self.groups}  # gradients not yet in each group
        self._ready: set[int] = set()  # parameters whose gradient has been taken this step
        self._launched: list[FlatParams] = []  # groups whose reduce-scatter has been issued, in order

    def _grad_ready(self, p) -> None:
        if id(p) in self._ready:
            raise RuntimeError("a second backward reached a parameter before step(): ZeRO stages 2 and 3 reduce "
                               "each gradient once per step")
        g, i = self._where[id(p)]
        if g.grad is None:  # the group's first gradient this step: its flat buffer, (N·S,)
            g.grad = torch.zeros(g.padded_numel, dtype=self.reduce_dtype, device=self.device)
        g.view(g.grad, i).copy_(p.grad)
        p.grad = None  # the full gradient is gone; its copy lives until the bucket has been sent
        self._ready.add(id(p))
        self._missing[id(g)] -= 1
        if self._missing[id(g)] == 0:
            self._group_done(g)
        self._launch_ready()

    def _group_done(self, g: FlatParams) -> None:
        """All of ``g``'s gradients are in (stage 3 frees its weights here)."""

    def _launch_ready(self) -> None:
        order = self._reduce_order
        while len(self._launched) < len(order) and self._missing[id(order[len(self._launched)])] == 0:
            self._launch(order[len(self._launched)])

    def _launch(self, g: FlatParams) -> None:
        """Average ``g``'s gradient and send each rank its shard, asynchronously."""
        # AVG: sum, then divide, in the collective, as FSDP2 does (stage 1 divides first, as DDP does); each
        # implementation then matches its PyTorch counterpart's arithmetic.
        g.grad_shard = torch.empty(g.shard_numel, dtype=self.reduce_dtype, device=self.device)  # (S,)
        g.work = self._communicate("reduce_scatter", g.grad, g.name, output=g.grad_shard, async_op=True,
                                   reduce_op=dist.ReduceOp.AVG)
        self._launched.append(g)
        if len(self._launched) > 1:  # double buffering: at most two in flight, so wait for the one before
            self._finish(self._launched[-2])

    def _finish(self, g: FlatParams) -> None:
        if g.work is not None:
            g.work.wait()
            g.work = None
        g.grad = None  # release the full flat gradient: the shard is all this rank keeps

    def forward(self, *args, **kwargs):
        self._check_reduced()
        return super().forward(*args, **kwargs)

    def _check_reduced(self) -> None:
        if self._launched:
            raise RuntimeError("the previous backward's gradients are still being reduced: call step() before "
                               "the next forward")

    def _reduce_gradients(self):
        for g in self._reduce_order[len(self._launched):]:  # some gradients never came (unused parameters)
            if g.grad is None:
                g.grad = torch.zeros(g.padded_numel, dtype=self.reduce_dtype, device=self.device)
            self._missing[id(g)] = 0
            self._group_done(g)
            self._launch(g)
        for g in self.groups:
            self._finish(g)
            g.master.grad = g.grad_shard.to(self.master_dtype)
            g.grad_shard = None
        self._reset()

    def zero_grad(self) -> None:
        _Zero.zero_grad(self)


class ZeroStage3(ZeroStage2):
    """P_os+g+p: weights sharded too, gathered block by block when needed (chapter 04).

    ``blocks`` (default: the module's children that hold parameters) each become one flat group; the
    parameters outside them form a ``root`` group, gathered for the whole forward and the whole backward.
    A block's weights are all-gathered before its forward and freed after it (unless
    ``reshard_after_forward=False``: kept until backward, 2Ψ per step instead of 3Ψ), all-gathered again
    before its backward (a hook on its outputs' gradients), and freed when all its gradients are in and
    reduce-scattered. ``prefetch=True``: on entering a block, the next block's all-gather (in forward, then
    in backward order) is issued asynchronously. ``timeline`` (a ``parlab.measure.Timeline``) receives
    each block's forward and backward (compute) and each wait for a gather (idle); ``memory_trace`` lists,
    for the last step, (time, "gather" | "free", group, bytes of gathered weights held).
    Rajbhandari et al. 2020, §5.3 and §7.2.2.
    """

    def __init__(self, module: nn.Module, optimizer_class=torch.optim.Adam, *, blocks=None, prefetch: bool = False,
                 reshard_after_forward: bool = True, process_group=None, param_dtype=None, reduce_dtype=None,
                 on_collective: OnCollective | None = None, timeline=None, **optimizer_kwargs):
        blocks = [m for m in module.children() if any(True for _ in m.parameters())] if blocks is None else list(blocks)
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise ValueError(f"blocks must be submodules of module (e.g. model.transformer.h); got {blocks!r}")
        self._blocks, self.prefetch, self.reshard_after_forward = blocks, prefetch, reshard_after_forward
        self.timeline, self.memory_trace = timeline, []
        super().__init__(module, optimizer_class, bucket_bytes=1, process_group=process_group,
                         param_dtype=param_dtype, reduce_dtype=reduce_dtype, on_collective=on_collective,
                         **optimizer_kwargs)
        self._root = self.groups[0] if self._has_root else None
        self._units = self.groups[1:] if self._has_root else list(self.groups)  # the blocks', in block order
        root = [self._root] if self._has_root else []
        self._forward_order, self._backward_order = root + self._units, root + self._units[::-1]
        self._reduce_order = self._units[::-1] + root  # the order in which backward finishes them
        for block, g in zip(self._unit_blocks, self._units):
            block.register_forward_pre_hook(lambda m, args, g=g: self._pre_forward(g))
            block.register_forward_hook(lambda m, args, out, g=g: self._post_forward(g, out))

    def _layout(self, params):
        names = {id(m): n for n, m in self.module.named_modules()}
        owner = {}
        for b in self._blocks:
            if id(b) not in names:
                raise ValueError(f"blocks: {type(b).__name__} is not a submodule of module")
            for p in b.parameters():
                if id(p) in owner:
                    raise ValueError(f"blocks {owner[id(p)]!r} and {names[id(b)]!r} share a parameter: pass blocks "
                                     f"that do not overlap (a tied weight belongs outside them, in the root)")
                owner[id(p)] = names[id(b)]
        trained = {id(p) for p in params}
        units = [(b, [p for p in b.parameters() if id(p) in trained]) for b in self._blocks]
        units = [(b, ps) for b, ps in units if ps]  # a block with nothing to train needs no gathering
        self._unit_blocks = [b for b, _ in units]
        root = [p for p in params if id(p) not in owner]
        self._has_root = bool(root)
        return ([("root", root)] if root else []) + [(names[id(b)], ps) for b, ps in units]

    def _init_group(self, g):
        master = g.shard(self._master_flat(g)).clone()  # (S,): the only copy of these weights this rank keeps
        for p in g.params:
            p.data = torch.empty(0, dtype=self.param_dtype, device=self.device)  # freed until gathered
        return master

    # -- gather and free ------------------------------------------------------------------------------------

    @torch.no_grad()  # forward hooks run with autograd on; gathering is not part of the model's graph
    def _gather(self, g: FlatParams, wait: bool) -> None:
        if g.full is None:  # not held: issue its all-gather, (S,) -> (N·S,)
            g.full = torch.empty(g.padded_numel, dtype=self.param_dtype, device=self.device)
            g.shard(g.full).copy_(g.master)  # mixed precision: cast the fp32 shard before sending it
            g.work = self._communicate("all_gather", g.shard(g.full), g.name, output=g.full, async_op=True)
            self._trace("gather", g)
        if wait and g.work is not None:
            start = time.perf_counter()
            g.work.wait()
            g.work = None
            self._span(f"wait {g.name}", "idle", start)
            for p, view in zip(g.params, g.views(g.full)):
                p.data = view

    def _free(self, g: FlatParams) -> None:
        if g.full is None:
            return
        if g.work is not None:
            g.work.wait()
            g.work = None
        for p in g.params:
            p.data = torch.empty(0, dtype=self.param_dtype, device=self.device)
        g.full = None
        self._trace("free", g)

    def _prefetch(self, order: list, g: FlatParams) -> None:
        if self.prefetch and order.index(g) + 1 < len(order):
            self._gather(order[order.index(g) + 1], wait=False)

    # -- the hooks ------------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        self._check_reduced()
        self.memory_trace = []
        root = self._root
        if root is not None:
            self._pre_forward(root)
        out = _Zero.forward(self, *args, **kwargs)
        return self._post_forward(root, out) if root is not None else out

    def _pre_forward(self, g):
        self._gather(g, wait=True)
        self._prefetch(self._forward_order, g)
        g.started, g.in_backward = time.perf_counter(), False

    def _post_forward(self, g, out):
        if g is not self._root:
            self._span(f"f {g.name}", "compute", g.started)
        if self.reshard_after_forward:
            self._free(g)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda grad, g=g: self._pre_backward(g))
        return out

    def _pre_backward(self, g):
        if g.in_backward:  # the first of its outputs' gradients starts the block's backward
            return
        g.in_backward = True
        self._gather(g, wait=True)
        self._prefetch(self._backward_order, g)
        g.started = time.perf_counter()

    def _group_done(self, g):
        if g is not self._root:
            self._span(f"b {g.name}", "compute", g.started)
        self._free(g)

    def _publish(self):
        for g in self.groups:  # weights gathered before the update are stale now
            self._free(g)

    # -- records --------------------------------------------------------------------------------------------

    def _span(self, name: str, kind: str, start: float) -> None:
        if self.timeline is not None:
            if self.device.type == "cuda":  # queued GPU work (and NCCL, whose wait() only orders streams) ends here
                torch.cuda.synchronize(self.device)
            self.timeline.add(name, kind, start, time.perf_counter())

    def _trace(self, what: str, g: FlatParams) -> None:
        held = sum(u.full.numel() * u.full.element_size() for u in self.groups if u.full is not None)
        self.memory_trace.append((time.perf_counter(), what, g.name, held))

    @property
    def peak_gathered_bytes(self) -> int:
        """The most bytes of gathered weights this rank held at once during the last step."""
        return max((held for *_, held in self.memory_trace), default=0)
