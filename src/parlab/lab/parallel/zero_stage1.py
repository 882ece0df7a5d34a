"""ZeRO stage 1 (P_os): the optimizer state sharded, weights and gradients whole on every rank (chapter 04).

See ``zero.py`` for the three stages side by side; Rajbhandari et al. 2020, §5.1 and §7.2.1.
"""

from __future__ import annotations

import torch
from torch import nn

from parlab.lab.parallel.zero_flat import FlatParams, _Zero

REDUCE = ("reduce_scatter", "all_reduce")


class ZeroStage1(_Zero):
    """P_os: optimizer state sharded; weights and gradients whole on every rank (chapter 04).

    One flat group holds the whole model. Backward accumulates gradients into one flat buffer (each
    ``.grad`` is a view of it); :meth:`step` reduces it (``reduce``: ``"reduce_scatter"`` delivers each rank
    only its Ψ/N, a volume of Ψ; ``"all_reduce"`` delivers everyone all Ψ, a volume of 2Ψ), updates this
    rank's shard with ``optimizer_class(**optimizer_kwargs)``, and all-gathers the weights (Ψ). Zero the
    gradients with :meth:`zero_grad` (it keeps the views). Rajbhandari et al. 2020, §5.1 and §7.2.1.
    """

    def __init__(self, module: nn.Module, optimizer_class=torch.optim.Adam, *, reduce: str = "reduce_scatter",
                 process_group=None, param_dtype=None, reduce_dtype=None, **optimizer_kwargs):
        if reduce not in REDUCE:
            raise ValueError(f"reduce={reduce!r}; choose one of {', '.join(map(repr, REDUCE))}")
        self.reduce = reduce
        super().__init__(module, optimizer_class, process_group, param_dtype, reduce_dtype, optimizer_kwargs)

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
