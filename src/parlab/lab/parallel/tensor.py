"""Tensor parallelism from scratch, Megatron-style: every layer's matrices split across ranks (chapter 05).

M. Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism",
2019 (arXiv:1909.08053), §3; sequence parallelism from V. Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", 2022 (arXiv:2205.05198), §4.2.2.

Each of the ``t`` ranks of a tensor-parallel group holds 1/t of every large weight matrix:

- :class:`ColumnParallelLinear` splits a linear layer's *output* features: rank r computes its slice
  Y_r = X·A_rᵀ. Its input must be whole on every rank, and in backward each rank holds only its slice's
  share of dL/dX, so the shares are summed: the operator **f** (:func:`copy_to_tp`: identity forward,
  all-reduce backward).
- :class:`RowParallelLinear` splits the *input* features: rank r takes X_r, the previous column-parallel
  layer's slice, and computes X_r·B_rᵀ, a partial sum of Y; **g** (:func:`reduce_from_tp`) all-reduces it
  forward, identity backward.
- Column then row makes an MLP or an attention block with one f and one g: GeLU (or SwiGLU's
  silu(gate)·up) is elementwise, so each rank applies it to its own columns; attention heads are
  independent, so each rank runs its own heads. Two all-reduces per transformer layer forward, two backward.
- :class:`VocabParallelEmbedding` splits the vocabulary; :func:`vocab_parallel_cross_entropy` takes the
  loss from vocabulary-sharded logits with all-reduces of a few numbers per token: logits are never whole.
- Sequence parallelism: between the column/row pairs (LayerNorm, dropout, residual) each rank keeps 1/t of
  the *sequence*; f becomes an all-gather along the sequence (:func:`sp_gather`), g a reduce-scatter
  (:func:`sp_reduce_scatter`). The same bytes (an all-reduce is a reduce-scatter then an all-gather), and
  the activations of those regions shrink t-fold.

``parlab.lab.parallel.tensor_plan.parallelize`` puts these layers into an ordinary model by a plan, as DTensor's
``parallelize_module`` does; ``parlab.lab.parallel.tensor_models`` holds the plans for GPT-2 and Llama. Each
piece takes the process group it works on (default: every rank). Every collective goes through
``parlab.lab.parallel.comm.communicate``, labelled ``"<module name> forward|backward"``, so any attached
``parlab.lab.measure.CommLog`` (``with CommLog() as log:``) records it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.lab.parallel.comm import communicate

SEQ_DIM = 1  # transformers' activations are (batch, seq, hidden); Megatron's are (seq, batch, hidden)


@dataclass(frozen=True)
class Comm:
    """Where a tensor-parallel piece talks: its group and its name (the records' label)."""

    group: object = None
    name: str = ""

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def run(self, op, tensor, direction, **kwargs):
        return communicate(op, tensor, self.group, label=f"{self.name} {direction}".strip(), **kwargs)


def _divide(what: str, n: int, t: int) -> int:
    if n % t:
        raise ValueError(f"{what} = {n} does not split evenly over {t} tensor-parallel ranks; choose sizes "
                         f"divisible by the tp size")
    return n // t


def _all_reduce(x, comm, direction, reduce_op=dist.ReduceOp.SUM):
    x = x.contiguous().clone()  # a fresh buffer: autograd may still need the one it came from
    comm.run("all_reduce", x, direction, reduce_op=reduce_op)
    return x


def _all_gather(x, dim, comm, direction):
    x = x.movedim(dim, 0).contiguous()  # all_gather_into_tensor concatenates along dim 0
    out = x.new_empty((comm.size * x.shape[0], *x.shape[1:]))
    comm.run("all_gather", x, direction, output=out)
    # (..., t · n, ...) in rank order; contiguous, or every linear layer reading it would save its own copy
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x, dim, comm, direction):
    x = x.movedim(dim, 0).contiguous()
    out = x.new_empty((_divide(f"dim {dim}", x.shape[0], comm.size), *x.shape[1:]))
    comm.run("reduce_scatter", x, direction, output=out)
    return out.movedim(0, dim).contiguous()  # (..., n / t, ...): this rank's chunk of the sum


def _chunk(x, dim, comm):
    n = _divide(f"dim {dim} of a tensor of shape {tuple(x.shape)}", x.shape[dim], comm.size)
    return x.narrow(dim, comm.rank * n, n)


class _Pair(torch.autograd.Function):
    """An operator given by what it does forward and what its backward does to the gradient."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.backward_fn = backward
        return forward(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_fn(grad), None, None


def _same(x):
    return x.view_as(x)  # autograd wants a new tensor object, not its input


def copy_to_tp(x, comm: Comm):
    """Megatron's **f**: identity forward; backward, the sum over ranks of each rank's share of dL/dx."""
    return _Pair.apply(x, _same, lambda grad: _all_reduce(grad, comm, "backward"))


def reduce_from_tp(x, comm: Comm):
    """Megatron's **g**: forward, the sum over ranks of each rank's partial result; identity backward."""
    return _Pair.apply(x, lambda x: _all_reduce(x, comm, "forward"), _same)


def sp_gather(x, comm: Comm, dim: int = SEQ_DIM):
    """Sequence parallelism's f: all-gather the sequence forward, reduce-scatter the gradient backward."""
    return _Pair.apply(x, lambda x: _all_gather(x, dim, comm, "forward"),
                       lambda grad: _reduce_scatter(grad, dim, comm, "backward"))


def sp_reduce_scatter(x, comm: Comm, dim: int = SEQ_DIM):
    """Sequence parallelism's g: reduce-scatter partial sums forward (each rank keeps its sequence chunk),
    all-gather the gradient backward."""
    return _Pair.apply(x, lambda x: _reduce_scatter(x, dim, comm, "forward"),
                       lambda grad: _all_gather(grad, dim, comm, "backward"))


def split(x, comm: Comm, dim: int = SEQ_DIM):
    """Keep this rank's chunk of a tensor every rank holds whole; backward, gather the chunks' gradients."""
    return _Pair.apply(x, lambda x: _chunk(x, dim, comm).clone(), lambda grad: _all_gather(grad, dim, comm, "backward"))


def gather(x, comm: Comm, dim: int = SEQ_DIM):
    """The whole tensor from every rank's chunk; backward, keep this rank's chunk of the gradient (what
    follows runs alike on every rank, so every rank holds the same, whole gradient)."""
    return _Pair.apply(x, lambda x: _all_gather(x, dim, comm, "forward"),
                       lambda grad: _chunk(grad, dim, comm).contiguous())


def sum_grad_over_tp(param: nn.Parameter, comm: Comm) -> None:
    """For a parameter every rank holds whole but applies to only part of the work (a LayerNorm on a
    sequence chunk, a replicated KV head used by some query heads): each rank's gradient is a partial sum,
    so they are added up, by an all-reduce when backward produces it."""
    param.register_hook(lambda grad: _all_reduce(grad, comm, "backward"))


class Sharded(nn.Module):
    """A layer holding this rank's slice of a dense layer's parameters. ``shards[name] = (dim, index)``:
    the parameter is the dense one's ``index_select(dim, index)``; a name not in ``shards`` is whole."""

    def __init__(self, comm: Comm):
        super().__init__()
        self.comm = comm
        self.shards: dict = {}
        self.conv1d = False  # built from transformers' Conv1D, whose weight is stored (in, out)

    def _slice(self, name: str, dense, dim: int, index) -> None:
        self.shards[name] = (dim, index)
        self.register_parameter(name, nn.Parameter(dense.detach().index_select(dim, index.to(dense.device)).clone()))

    def unshard(self, name: str, local):
        """The dense tensor (in the dense layer's own layout) from every rank's ``local`` slice of ``name``."""
        if name in self.shards:
            dim, index = self.shards[name]
            unnamed = Comm(self.comm.group)  # unsharding for checks, not training: do it outside a step's CommLog
            values = _all_gather(local, dim, unnamed, "")
            where = _all_gather(index.to(local.device), 0, unnamed, "")
            local = torch.empty_like(values).index_copy_(dim, where, values)
        return local.t() if self.conv1d and name == "weight" else local


def _dense(layer) -> tuple:
    """(weight as (out, in), bias or None, is_conv1d) of an ``nn.Linear`` or transformers' ``Conv1D``."""
    if isinstance(layer, nn.Linear):
        return layer.weight, layer.bias, False
    if hasattr(layer, "nf") and getattr(layer, "weight", None) is not None and layer.weight.dim() == 2:
        return layer.weight.t(), layer.bias, True  # Conv1D computes x·W + b with W (in, out)
    raise TypeError(f"expected an nn.Linear (or transformers' Conv1D) to split; got {type(layer).__name__}")


class ColumnParallelLinear(Sharded):
    """``layer`` split by output features: rank r computes Y_r = X·A_rᵀ (+ b_r) (Shoeybi et al. §3).

    input: ``"copy"`` passes X through f; ``"gather"`` (sequence parallelism) all-gathers X's sequence
    chunks; ``"ready"``: a :class:`PrepareInput` on the parent already did one of those for all its
    column-parallel children (Q, K and V share one). parts: the output is ``parts`` matrices stacked
    (GPT-2's [Q|K|V]); each is split, so rank r holds Q_r, K_r, V_r. rows: keep the weight whole on every
    rank and compute only these output rows (replicated KV heads); its gradient is then summed over ranks.
    gather_output: all-gather Y's slices (whole output on every rank).
    """

    def __init__(self, layer, group=None, *, input: str = "copy", parts: int = 1, rows=None,
                 gather_output: bool = False, name: str = ""):
        super().__init__(Comm(group, name))
        if input not in ("copy", "gather", "ready"):
            raise ValueError(f"input={input!r}; choose 'copy' (f), 'gather' (sequence parallel) or 'ready'")
        weight, bias, self.conv1d = _dense(layer)
        self.input, self.gather_output = input, gather_output
        self.in_features = weight.shape[1]
        self.register_buffer("rows", None if rows is None else rows.to(weight.device), persistent=False)
        if rows is None:
            out, t, r = weight.shape[0], self.comm.size, self.comm.rank
            what = f"{name or 'layer'}: output features" + (f" / {parts} parts" if parts > 1 else "")
            per = _divide(what, _divide(what, out, parts) if parts > 1 else out, t)
            index = torch.cat([torch.arange(p * out // parts + r * per, p * out // parts + (r + 1) * per)
                               for p in range(parts)])
            self._slice("weight", weight, 0, index)
            self._slice("bias", bias, 0, index) if bias is not None else self.register_parameter("bias", None)
        else:
            self.weight = nn.Parameter(weight.detach().clone())
            self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
            for p in (self.weight, self.bias):
                if p is not None:
                    sum_grad_over_tp(p, self.comm)

    def forward(self, x):  # (..., in_features): whole on every rank (its sequence chunk if "gather")
        if self.input == "copy":
            x = copy_to_tp(x, self.comm)
        elif self.input == "gather":
            x = sp_gather(x, self.comm)
        weight, bias = self.weight, self.bias
        if self.rows is not None:
            weight, bias = weight[self.rows], (bias[self.rows] if bias is not None else None)
        y = F.linear(x, weight, bias)  # (..., out_features / t)
        return gather(y, self.comm, -1) if self.gather_output else y


class RowParallelLinear(Sharded):
    """``layer`` split by input features: rank r holds B_r and computes X_r·B_rᵀ from its slice X_r of the
    features; the partial sums are added by g (``output="reduce"``), or reduce-scattered along the sequence
    (``"reduce_scatter"``, sequence parallelism). The bias is whole on every rank, added once, after the
    sum (Shoeybi et al. §3). Its ``forward`` is chapter 05's first exercise.
    """

    def __init__(self, layer, group=None, *, output: str = "reduce", name: str = ""):
        super().__init__(Comm(group, name))
        if output not in ("reduce", "reduce_scatter"):
            raise ValueError(f"output={output!r}; choose 'reduce' (g) or 'reduce_scatter' (sequence parallel)")
        weight, bias, self.conv1d = _dense(layer)
        self.output, self.out_features = output, weight.shape[0]
        per = _divide(f"{name or 'layer'}: input features", weight.shape[1], self.comm.size)
        self._slice("weight", weight, 1, torch.arange(self.comm.rank * per, (self.comm.rank + 1) * per))
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        if self.bias is not None and output == "reduce_scatter":
            sum_grad_over_tp(self.bias, self.comm)  # added to a sequence chunk: a partial gradient

    def forward(self, x):  # (..., in_features / t): this rank's slice of the features
        y = F.linear(x, self.weight)  # (..., out_features): this rank's partial sum
        y = reduce_from_tp(y, self.comm) if self.output == "reduce" else sp_reduce_scatter(y, self.comm)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(Sharded):
    """``embedding`` split by vocabulary: rank r holds rows [r·V/t, (r+1)·V/t), looks up the ids it owns,
    writes zeros for the others, and g sums: each row comes from exactly one rank (Shoeybi et al. §3)."""

    def __init__(self, embedding: nn.Embedding, group=None, *, name: str = ""):
        super().__init__(Comm(group, name))
        if embedding.padding_idx is not None:
            raise ValueError(f"{name or 'embedding'} has padding_idx={embedding.padding_idx}, which this embedding "
                             f"does not carry over; build the model without one")
        per = _divide(f"{name or 'embedding'}: vocabulary", embedding.num_embeddings, self.comm.size)
        self.start, self.stop = self.comm.rank * per, (self.comm.rank + 1) * per
        self._slice("weight", embedding.weight, 0, torch.arange(self.start, self.stop))

    def forward(self, ids):  # (batch, seq) ids in the whole vocabulary
        outside = (ids < self.start) | (ids >= self.stop)
        rows = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)  # (batch, seq, hidden)
        return reduce_from_tp(rows.masked_fill(outside.unsqueeze(-1), 0.0), self.comm)


def vocab_parallel_cross_entropy(logits, target, group=None, *, ignore_index: int = -100,
                                 name: str = "cross_entropy"):
    """Mean cross-entropy over the tokens of ``target`` from this rank's vocabulary slice of the logits.

    logits: (..., vocab / t), rank r's slice [r·V/t, (r+1)·V/t); target: (...) ids in the whole vocabulary.
    loss = log Σ_v exp(z_v) − z_target; each rank sums over its own slice, and three all-reduces of one
    number per token (the largest logit, the target's logit, the sum of exponentials) finish the job
    (Shoeybi et al. §3). g's identity backward is right here: every rank computes the same loss from the
    sums, so each rank's share of dL/dz is its own slice of softmax − one-hot.
    """
    comm = Comm(group, name)
    z = logits.float().flatten(0, -2)  # (tokens, vocab / t)
    target = target.flatten()
    if target.shape[0] != z.shape[0]:
        raise ValueError(f"target has {target.shape[0]} tokens but logits have {z.shape[0]}")
    v, start = z.shape[1], comm.rank * z.shape[1]
    # Any constant per token may be subtracted before exp(); the largest logit keeps exp() from overflowing.
    top = _all_reduce(z.detach().amax(-1), comm, "forward", reduce_op=dist.ReduceOp.MAX)  # (tokens,)
    z = z - top.unsqueeze(1)
    mine = (target >= start) & (target < start + v)
    # Indexing, not gather: gather's backward keeps all of z; indexing keeps only the indices.
    picked = z[torch.arange(z.shape[0], device=z.device), (target - start).clamp(0, v - 1)]
    picked = reduce_from_tp(torch.where(mine, picked, torch.zeros_like(picked)), comm)  # (tokens,) z_target
    sum_exp = reduce_from_tp(z.exp().sum(-1), comm)  # (tokens,) over the whole vocabulary
    loss = sum_exp.log() - picked
    return loss[target != ignore_index].mean()


def kv_heads_layout(num_heads: int, num_kv_heads: int, tp_size: int) -> str:
    """How grouped-query attention's K and V heads go to ``tp_size`` ranks: ``"split"`` or ``"replicate"``.

    Query heads are split evenly (``num_heads`` must divide). Query head j reads KV head j // (num_heads /
    num_kv_heads). If ``num_kv_heads`` divides by ``tp_size`` the KV heads split like the queries, and each
    rank's query heads read only its own KV heads: no extra communication. If there are fewer KV heads than
    ranks (``tp_size`` a multiple of ``num_kv_heads``), a head cannot be cut (its dot products need all its
    dimensions), so the K/V projections are replicated: every rank keeps their whole weights (they are
    small: that is the point of GQA), computes only the one KV head its queries read, and the weights'
    gradients are summed over the ranks (``tensor_plan.ReplicatedHeads``).
    Anything else would give ranks unequal work and is refused.
    """
    _divide("num_heads", num_heads, tp_size)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if num_kv_heads % tp_size == 0:
        return "split"
    if tp_size % num_kv_heads == 0:
        return "replicate"
    raise ValueError(f"num_kv_heads={num_kv_heads} neither divides by tp_size={tp_size} nor divides it: "
                     f"choose a tp size that is a divisor or a multiple of the number of KV heads")
