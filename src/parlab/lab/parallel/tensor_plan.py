"""Tensor parallelism by plan: ``{module name pattern: style}`` applied to an ordinary model (chapter 05).

As DTensor's ``parallelize_module`` and transformers' ``base_model_tp_plan`` do, :func:`parallelize`
swaps each named layer for its tensor-parallel version from ``parlab.lab.parallel.tensor`` (Shoeybi et al.
2019; Korthikanti et al. 2022 for the sequence-parallel styles), or hooks the operators f and g onto a
module's input or output. The model's own ``forward`` is left as it is. A style is a string
(``"colwise"``, ``"rowwise"``, ``"sequence_parallel"``: transformers' names) or one of the classes below;
each has ``apply(module, comm, sequence_parallel)`` returning the replacement, or ``None`` when it only
adds hooks. :func:`dense_state` gathers the shards back into the parameters one process would hold.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parlab.lab.parallel.tensor import (
    ColumnParallelLinear,
    Comm,
    RowParallelLinear,
    Sharded,
    VocabParallelEmbedding,
    copy_to_tp,
    gather,
    sp_gather,
    split,
    sum_grad_over_tp,
)


@dataclass(frozen=True)
class Colwise:
    """A linear layer → :class:`ColumnParallelLinear`. shared_input: the parent's PrepareInput did f;
    whole_input: the input is whole even under sequence parallelism (a layer after the region, lm_head)."""

    parts: int = 1
    shared_input: bool = False
    gather_output: bool = False
    whole_input: bool = False

    def apply(self, module, comm, sp):
        inp = "ready" if self.shared_input else ("gather" if sp and not self.whole_input else "copy")
        return ColumnParallelLinear(module, comm.group, input=inp, parts=self.parts,
                                    gather_output=self.gather_output, name=comm.name)


@dataclass(frozen=True)
class Rowwise:
    """A linear layer → :class:`RowParallelLinear`; an ``nn.Embedding`` → :class:`VocabParallelEmbedding`."""

    def apply(self, module, comm, sp):
        if isinstance(module, nn.Embedding):
            return VocabParallelEmbedding(module, comm.group, name=comm.name)
        return RowParallelLinear(module, comm.group, output="reduce_scatter" if sp else "reduce", name=comm.name)


@dataclass(frozen=True)
class ReplicatedHeads:
    """A K or V projection whose heads are fewer than the ranks: its whole weight kept on every rank (its
    gradient summed over ranks); each rank computes only the one KV head its query heads read (see
    :func:`kv_heads_layout`)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def apply(self, module, comm, sp):
        per_rank, group = self.num_heads // comm.size, self.num_heads // self.num_kv_heads
        heads = torch.arange(comm.rank * per_rank, (comm.rank + 1) * per_rank).div(group, rounding_mode="floor")
        rows = torch.cat([torch.arange(h * self.head_dim, (h + 1) * self.head_dim) for h in heads.unique()])
        return ColumnParallelLinear(module, comm.group, input="ready", rows=rows, name=comm.name)


def _hidden_states(args, kwargs, fn):
    """Apply ``fn`` to a block's hidden states: the first positional argument or ``hidden_states=``."""
    if args:
        return (fn(args[0]), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}


@dataclass(frozen=True)
class PrepareInput:
    """f (all-gather under sequence parallelism) once on a module's input, shared by its column-parallel
    children (Llama's separate Q, K, V; gate and up): one all-reduce in backward instead of one each."""

    def apply(self, module, comm, sp):
        op = (lambda x: sp_gather(x, comm)) if sp else (lambda x: copy_to_tp(x, comm))
        module.register_forward_pre_hook(lambda m, args, kwargs: _hidden_states(args, kwargs, op), with_kwargs=True)


@dataclass(frozen=True)
class SequenceParallel:
    """A norm working on this rank's sequence chunk: its weights' gradients are summed over ranks."""

    def apply(self, module, comm, sp):
        for p in module.parameters(recurse=False):
            sum_grad_over_tp(p, comm)


@dataclass(frozen=True)
class SequenceEnter:
    """The first block: its input (whole on every rank) is cut to this rank's sequence chunk."""

    def apply(self, module, comm, sp):
        module.register_forward_pre_hook(
            lambda m, args, kwargs: _hidden_states(args, kwargs, lambda x: split(x, comm)),
            with_kwargs=True)


@dataclass(frozen=True)
class SequenceExit:
    """The last block: its output chunks are gathered, whole on every rank again."""

    def apply(self, module, comm, sp):
        module.register_forward_hook(lambda m, args, out: gather(out, comm))


STYLES = {"colwise": Colwise(), "rowwise": Rowwise(), "sequence_parallel": SequenceParallel()}
_SP_ONLY = (SequenceParallel, SequenceEnter, SequenceExit)


def _matches(pattern: str, name: str) -> bool:
    """Atom by atom, as DTensor matches plans: ``layers.*.mlp`` matches ``layers.0.mlp``, not deeper."""
    atoms, parts = pattern.split("."), name.split(".")
    return len(atoms) == len(parts) and all(fnmatch.fnmatchcase(p, a) for a, p in zip(atoms, parts))


def parallelize(model: nn.Module, plan: dict, group=None, *, sequence_parallel: bool = False) -> nn.Module:
    """Apply ``plan`` ``{module name pattern: style}`` to ``model`` in place, on every rank of ``group``.

    A style is a string (``"colwise"``, ``"rowwise"``, ``"sequence_parallel"``: transformers' plan names)
    or one of the style classes above. Weights tied before (GPT-2's embedding and output layer) stay tied.
    The layers' collectives are labelled with their module names, for any attached ``CommLog``.
    """
    if not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs an initialised process group: run inside parlab.launch")
    modules = dict(model.named_modules())
    tied = {}  # id(dense weight) -> its new (sliced) parameter
    for pattern, style in plan.items():
        if isinstance(style, str):
            if style not in STYLES:
                raise ValueError(f"plan[{pattern!r}] = {style!r}: unknown style; use one of {', '.join(STYLES)} "
                                 f"or a style object (Colwise(parts=3), PrepareInput(), ...)")
            style = STYLES[style]
        if isinstance(style, _SP_ONLY) and not sequence_parallel:
            raise ValueError(f"plan[{pattern!r}] = {type(style).__name__}() belongs to sequence parallelism: "
                             f"pass sequence_parallel=True or leave it out of the plan")
        names = [n for n in modules if _matches(pattern, n)]
        if not names:
            raise ValueError(f"plan entry {pattern!r} matches no module of {type(model).__name__}")
        for name in names:
            old = modules[name]
            new = style.apply(old, Comm(group, name), sequence_parallel)
            if new is None:
                continue
            key = id(old.weight)
            if key in tied and tied[key].shape == new.weight.shape:
                new.weight = tied[key]
            tied.setdefault(key, new.weight)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, new)
            modules[name] = new
    return model


def plan_for_part(plan: dict, model: nn.Module, part: nn.Module) -> dict:
    """The entries of ``plan``, written for ``model``, that fall inside ``part``, keyed by their names in
    ``part``: a pipeline stage holds some of a model's modules under names of its own (chapter 07). Works
    for DTensor's plans too, which match names the same way."""
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for name, module in part.named_modules():
        full = names.get(id(module))
        for pattern, style in plan.items():
            if full is not None and _matches(pattern, full):
                out[name] = style
    return out


def dense_state(model: nn.Module, grads: bool = False) -> dict:
    """Every parameter (or its gradient) whole, by name, in the original model's layout: what one process
    would hold. Run on every rank (it gathers the shards); for checks and checkpoints."""
    out = {}
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            t = p.grad if grads else p.detach()
            if t is not None:
                out[f"{mname}.{pname}" if mname else pname] = module.unshard(pname, t) if isinstance(module, Sharded) else t
    return out
