"""What ``parlab.lab.compose.parallelize`` must know of a model, for the two kinds the course trains (chapter 07).

``parallelize`` takes the same steps for every model; where a step depends on the model, it asks one of
these two classes. Nothing here is new strategy code: it points each step at what chapters 03–06 built.

- :class:`Stack`, an ``nn.Sequential`` of blocks (``parlab.lab.models.tiny_blocks``): a pipeline stage is a
  run of blocks (chapter 06's ``split_sequential``); tensor parallelism splits each block's ``up`` by
  columns and ``down`` by rows (chapter 05); the loss is the mean squared error.
- :class:`Decoder`, a transformers GPT-2 or Llama built from a config (``parlab.lab.models.tiny_gpt2``,
  ``tiny_llama``): a stage is chapter 06's ``GPT2Stage`` (GPT-2 only: the course has no Llama stage); the
  tensor-parallel plans are chapter 05's (``tensor_models.scratch_plan``, ``dtensor_plan``), written for the
  whole model and applied to the modules a stage holds; the loss is next-token cross-entropy, computed
  vocabulary-parallel when the course's TP leaves each rank a slice of the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from parlab.lab.parallel.pipeline import GPT2Stage, causal_lm_loss, split_gpt2, split_sequential

TENSOR_PARALLEL = ("dtensor", "course")


class Checkpointed(nn.Module):
    """Runs ``block`` without keeping its activations; backward recomputes them (Chen et al. 2016)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def blocks_tp_plan(model: nn.Module, how: str = "dtensor") -> dict:
    """Megatron's plan for ``parlab.lab.models.ResidualBlock`` stacks: ``up`` split by columns, ``down`` by
    rows, so each block needs one all-reduce in forward and one in backward (chapter 05). ``how``:
    ``"dtensor"`` (styles for ``parallelize_module``) or ``"course"`` (for ``tensor_plan.parallelize``)."""
    if how == "dtensor":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        col, row = ColwiseParallel(), RowwiseParallel()
    else:
        col, row = "colwise", "rowwise"
    plan = {}
    for name, module in model.named_modules():
        if hasattr(module, "up") and hasattr(module, "down"):
            prefix = f"{name}." if name else ""
            plan[f"{prefix}up"] = col  # (batch, 4 hidden / tp) on each rank
            plan[f"{prefix}down"] = row  # partial sums, all-reduced to (batch, hidden)
    if not plan:
        raise ValueError("no block with `up` and `down` linears to split: pass tp_plan={module name: "
                         "ColwiseParallel() | RowwiseParallel() ...} for this model")
    return plan


def _apply_plan(part: nn.Module, plan: dict, how: str, mesh) -> None:
    """A plan for ``part`` itself, by the implementation ``how``."""
    if how == "dtensor":
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(part, mesh, plan)
    else:
        from parlab.lab.parallel.tensor_plan import parallelize

        parallelize(part, plan, mesh.get_group())


def _wrap_blocks(blocks: nn.Module) -> None:
    for name, block in blocks.named_children():
        setattr(blocks, name, Checkpointed(block))


class Stack:
    """An ``nn.Sequential`` of blocks, as ``parallelize`` sees it."""

    def __init__(self, model: nn.Sequential):
        self.model = model

    def whole(self) -> nn.Module:
        return self.model

    def stage(self, num_stages: int, index: int) -> nn.Module:
        n = len(self.model)
        if n % num_stages:  # equal stages: a pipeline runs at the pace of its slowest
            raise ValueError(f"a pipeline of pp={num_stages} stages splits an nn.Sequential into equal runs of "
                             f"blocks; got {type(self.model).__name__} with {n} blocks")
        return split_sequential(self.model, num_stages)[index]

    def blocks(self, part: nn.Module) -> list[nn.Module]:
        return list(part.children())

    def checkpoint(self, part: nn.Module) -> None:
        _wrap_blocks(part)

    def tensor_parallel(self, part: nn.Module, how: str, mesh, plan=None) -> None:
        _apply_plan(part, plan if plan is not None else blocks_tp_plan(part, how), how, mesh)

    def loss_fn(self, tensor_parallel: str | None, tp_group=None):
        return F.mse_loss  # the blocks' output is whole on every tensor-parallel rank

    def boundary_shape(self, micro_batch: torch.Tensor) -> tuple:
        return tuple(micro_batch.shape)  # residual blocks keep (micro-batch, hidden)


class LogitsOf(nn.Module):
    """A transformers causal LM as a plain module: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.lm = model

    def forward(self, ids):
        return self.lm(input_ids=ids).logits  # (batch, seq, vocab), or this rank's vocab / tp of it


class Decoder:
    """A transformers GPT-2 or Llama, as ``parallelize`` sees it."""

    def __init__(self, model: nn.Module):
        from parlab.lab.parallel.tensor_models import arch

        self.model, self.arch = model, arch(model)

    def whole(self) -> nn.Module:
        return LogitsOf(self.model)

    def stage(self, num_stages: int, index: int) -> nn.Module:
        if self.arch.kind != "gpt2":
            raise ValueError(f"pipeline stages exist for GPT-2 (chapter 06's split_gpt2); got a {self.arch.kind} "
                             f"model: use pp=1, or a GPT-2 (parlab.lab.models.tiny_gpt2)")
        return split_gpt2(self.model, num_stages)[index]

    def blocks(self, part: nn.Module) -> list[nn.Module]:
        return list(self._block_list(part).children())

    def _block_list(self, part: nn.Module) -> nn.Module:
        return part.h if isinstance(part, GPT2Stage) else self.model.get_submodule(self.arch.blocks)

    def checkpoint(self, part: nn.Module) -> None:
        _wrap_blocks(self._block_list(part))

    def tensor_parallel(self, part: nn.Module, how: str, mesh, plan=None) -> None:
        from parlab.lab.parallel.tensor_models import parallelize_lm

        if plan is not None:
            _apply_plan(part, plan, how, mesh)
            return
        # chapter 05's plans, for the whole model or for the modules of this stage
        parallelize_lm(self.model, "scratch" if how == "course" else how, mesh,
                       part=None if isinstance(part, LogitsOf) else part, whole_logits=True)

    def loss_fn(self, tensor_parallel: str | None, tp_group=None):
        if tensor_parallel != "course":
            return causal_lm_loss  # whole logits on every rank (DTensor's plan gathers them here)
        from parlab.lab.parallel.tensor import vocab_parallel_cross_entropy

        def loss(logits, ids):  # logits: (batch, seq, vocab / tp), this rank's slice of the vocabulary
            return vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:], tp_group)

        return loss

    def boundary_shape(self, micro_batch: torch.Tensor) -> tuple:
        return (*micro_batch.shape, self.model.config.hidden_size)  # ids (mb, seq) -> (mb, seq, hidden)


def model_kind(model: nn.Module):
    """:class:`Stack` or :class:`Decoder` for ``model``; anything else is refused with what is supported."""
    if isinstance(model, nn.Sequential):
        return Stack(model)
    if getattr(getattr(model, "config", None), "model_type", None) in ("gpt2", "llama"):
        return Decoder(model)
    raise TypeError(f"parallelize takes an nn.Sequential of blocks (parlab.lab.models.tiny_blocks) or a transformers "
                    f"GPT-2 or Llama (parlab.lab.models.tiny_gpt2, tiny_llama); got {type(model).__name__}")


def single_process(model: nn.Module) -> tuple[nn.Module, object]:
    """(the module to call on a batch, the loss) of ``model`` in one process: the reference every
    layout is checked against."""
    kind = model_kind(model)
    return kind.whole(), kind.loss_fn(None)
