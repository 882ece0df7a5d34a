"""ZeRO stage 3 (P_os+g+p): the weights sharded too, gathered block by block when needed (chapter 04).

See ``zero.py`` for the three stages side by side; Rajbhandari et al. 2020, §5.3 and §7.2.2. A change to
how weights travel (a quantised gather, ZeRO++) is made in :meth:`ZeroStage3._gather`.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from parlab.lab.measure.attach import mark, span_since
from parlab.lab.parallel.zero_flat import FlatParams, _Zero
from parlab.lab.parallel.zero_stage2 import ZeroStage2


class ZeroStage3(ZeroStage2):
    """P_os+g+p: weights sharded too, gathered block by block when needed (chapter 04).

    ``blocks`` (default: the module's children that hold parameters) each become one flat group; the
    parameters outside them form a ``root`` group, gathered for the whole forward and the whole backward.
    A block's weights are all-gathered before its forward and freed after it (unless
    ``reshard_after_forward=False``: kept until backward, 2Ψ per step instead of 3Ψ), all-gathered again
    before its backward (a hook on its outputs' gradients), and freed when all its gradients are in and
    reduce-scattered. ``prefetch=True``: on entering a block, the next block's all-gather (in forward, then
    in backward order) is issued asynchronously. Any attached ``parlab.lab.measure.Timeline`` receives each
    block's forward and backward (compute) and each wait for a gather (idle), on its clock (on a GPU, the
    compute stream's: a wait is how long that stream stalls for the gather, 0 when prefetch hid it);
    ``memory_trace`` lists, for the last step, (time, "gather" | "free", group, bytes of gathered weights held).
    Rajbhandari et al. 2020, §5.3 and §7.2.2.
    """

    def __init__(self, module: nn.Module, optimizer_class=torch.optim.Adam, *, blocks=None, prefetch: bool = False,
                 reshard_after_forward: bool = True, process_group=None, param_dtype=None, reduce_dtype=None,
                 **optimizer_kwargs):
        blocks = [m for m in module.children() if any(True for _ in m.parameters())] if blocks is None else list(blocks)
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise ValueError(f"blocks must be submodules of module (e.g. model.transformer.h); got {blocks!r}")
        self._blocks, self.prefetch, self.reshard_after_forward = blocks, prefetch, reshard_after_forward
        self.memory_trace = []
        super().__init__(module, optimizer_class, bucket_bytes=1, process_group=process_group,
                         param_dtype=param_dtype, reduce_dtype=reduce_dtype, **optimizer_kwargs)
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
            started = mark()  # on a GPU: when the compute stream gets here; the wait is its stall
            g.work.wait()
            g.work = None
            span_since(f"wait {g.name}", started, "idle")
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
        g.started, g.in_backward = mark(), False

    def _post_forward(self, g, out):
        if g is not self._root:
            span_since(f"f {g.name}", g.started)
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
        g.started = mark()

    def _group_done(self, g):
        if g is not self._root:
            span_since(f"b {g.name}", g.started)
        self._free(g)

    def _publish(self):
        for g in self.groups:  # weights gathered before the update are stale now
            self._free(g)

    # -- records --------------------------------------------------------------------------------------------

    def _trace(self, what: str, g: FlatParams) -> None:
        held = sum(u.full.numel() * u.full.element_size() for u in self.groups if u.full is not None)
        self.memory_trace.append((time.perf_counter(), what, g.name, held))

    @property
    def peak_gathered_bytes(self) -> int:
        """The most bytes of gathered weights this rank held at once during the last step."""
        return max((held for *_, held in self.memory_trace), default=0)
