"""ZeRO stage 2 (P_os+g): the gradients sharded too, reduce-scattered bucket by bucket during backward
(chapter 04). See ``zero.py`` for the three stages side by side; Rajbhandari et al. 2020, §5.2.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parlab.lab.checks import positive_int
from parlab.lab.parallel.ddp import DEFAULT_BUCKET_BYTES
from parlab.lab.parallel.zero_flat import FlatParams, _Zero
from parlab.lab.parallel.zero_stage1 import ZeroStage1


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
                 **optimizer_kwargs):
        self.bucket_bytes = positive_int("bucket_bytes", bucket_bytes, "bytes of gradient per bucket")
        super().__init__(module, optimizer_class, process_group=process_group, param_dtype=param_dtype,
                         reduce_dtype=reduce_dtype, **optimizer_kwargs)
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
