"""GPT-2 and Llama (transformers, built from configs) under tensor parallelism, two ways (chapter 05).

For each model, :func:`scratch_plan` is what the course's code (``parlab.lab.parallel.tensor_plan.parallelize``)
applies and :func:`dtensor_plan` what PyTorch's DTensor ``parallelize_module`` applies, entry for entry:
the same layers split the same way, with the same collectives. Around the plans:

- :func:`localize_heads`: transformers' attention reads the number of heads it runs from attributes set
  at construction; a rank runs 1/t of them.
- :func:`gpt2_for_dtensor`: DTensor's ``ColwiseParallel`` takes ``nn.Linear`` and splits its rows in t
  contiguous blocks. GPT-2 stores its projections as ``Conv1D`` (weight transposed) and Q, K, V stacked in
  one matrix; its rows are reordered so that block r holds rank r's heads of Q, K and V. (The course's
  ``Colwise(parts=3)`` takes each rank's slice of each part instead.)
- :func:`forward_backward`: the causal-LM loss of one batch, with vocabulary-parallel cross-entropy
  (the course's, or DTensor's ``loss_parallel``), and its backward; :func:`train` a few SGD steps.

Sequence parallelism spans the decoder blocks: the first block's input is cut into sequence chunks and
the last block's output gathered. transformers builds positions and the causal mask from the embedding's
output, so the embedding keeps the whole sequence (Megatron reduce-scatters there instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from parlab.lab.parallel.tensor import kv_heads_layout, vocab_parallel_cross_entropy
from parlab.lab.parallel.tensor_plan import (
    Colwise,
    PrepareInput,
    ReplicatedHeads,
    SequenceEnter,
    SequenceExit,
    parallelize,
    plan_for_part,
)

HOWS = ("single", "scratch", "dtensor")


@dataclass(frozen=True)
class Arch:
    """What the plans need to know of a decoder: its family, where its blocks are, its heads."""

    kind: str  # "gpt2" or "llama"
    blocks: str  # module name of the list of decoder blocks
    n_layer: int
    heads: int
    kv_heads: int
    head_dim: int


def arch(model: nn.Module) -> Arch:
    cfg = model.config
    kind = cfg.model_type
    if kind not in ("gpt2", "llama"):
        raise ValueError(f"plans exist for GPT-2 and Llama models; got model_type={kind!r}")
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    return Arch(kind, "transformer.h" if kind == "gpt2" else "model.layers", cfg.num_hidden_layers, heads, kv,
                cfg.hidden_size // heads)


def _check(a: Arch, tp_size: int, sequence_parallel: bool) -> str:
    layout = kv_heads_layout(a.heads, a.kv_heads, tp_size)
    if sequence_parallel and a.n_layer < 2:
        raise ValueError("the sequence-parallel plans enter at the first block and leave at the last: use n_layer >= 2")
    return layout


def scratch_plan(model: nn.Module, tp_size: int, sequence_parallel: bool = False) -> dict:
    """The plan for ``parlab.lab.parallel.tensor.parallelize``: Megatron's split of every block."""
    a = arch(model)
    layout = _check(a, tp_size, sequence_parallel)
    b = f"{a.blocks}.*"
    if a.kind == "gpt2":
        plan = {"transformer.wte": "rowwise",  # vocabulary-parallel embedding
                f"{b}.attn.c_attn": Colwise(parts=3),  # [Q|K|V]: rank r gets its heads of each
                f"{b}.attn.c_proj": "rowwise",
                f"{b}.mlp.c_fc": "colwise",
                f"{b}.mlp.c_proj": "rowwise",
                "lm_head": Colwise(whole_input=True)}  # tied to wte: the same rows of the same weight
        norms = ("ln_1", "ln_2")
    else:
        kv = (Colwise(shared_input=True) if layout == "split" else ReplicatedHeads(a.heads, a.kv_heads, a.head_dim))
        plan = {"model.embed_tokens": "rowwise",
                f"{b}.self_attn": PrepareInput(),  # one f for Q, K and V
                f"{b}.self_attn.q_proj": Colwise(shared_input=True),
                f"{b}.self_attn.k_proj": kv,
                f"{b}.self_attn.v_proj": kv,
                f"{b}.self_attn.o_proj": "rowwise",
                f"{b}.mlp": PrepareInput(),  # one f for gate and up
                f"{b}.mlp.gate_proj": Colwise(shared_input=True),
                f"{b}.mlp.up_proj": Colwise(shared_input=True),
                f"{b}.mlp.down_proj": "rowwise",
                "lm_head": Colwise(whole_input=True)}  # after the sequence-parallel region
        norms = ("input_layernorm", "post_attention_layernorm")
    if sequence_parallel:
        plan.update({f"{b}.{n}": "sequence_parallel" for n in norms})
        plan[f"{a.blocks}.0"] = SequenceEnter()
        plan[f"{a.blocks}.{a.n_layer - 1}"] = SequenceExit()
    return plan


def dtensor_plan(model: nn.Module, tp_size: int, sequence_parallel: bool = False) -> dict:
    """The same split for DTensor's ``parallelize_module`` (after :func:`gpt2_for_dtensor` for GPT-2)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    a = arch(model)
    if _check(a, tp_size, sequence_parallel) != "split":
        raise ValueError(f"{a.kv_heads} KV heads do not split over tp_size={tp_size}: ColwiseParallel would cut a "
                         f"head in pieces and attention's reshape would fail (transformers' plans do the same: its "
                         f"issue #48307); the course's scratch plan replicates them instead")
    seq = Shard(1) if sequence_parallel else Replicate()  # the layout between the column/row pairs
    b = f"{a.blocks}.*"
    plan = {"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}  # for loss_parallel
    if a.kind == "gpt2":
        plan.update({"transformer.wte": RowwiseParallel(input_layouts=Replicate()),
                     f"{b}.attn.c_attn": ColwiseParallel(input_layouts=seq),
                     f"{b}.attn.c_proj": RowwiseParallel(output_layouts=seq),
                     f"{b}.mlp.c_fc": ColwiseParallel(input_layouts=seq),
                     f"{b}.mlp.c_proj": RowwiseParallel(output_layouts=seq)})
        norms, block_args = ("ln_1", "ln_2"), 4  # GPT2Block(hidden, cache, mask, encoder_hidden, **kw)
    else:
        # Leaving the prepared input a DTensor lets Q, K and V share one f, like PrepareInput.
        plan.update({"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                     f"{b}.self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                          desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                          use_local_output=False),
                     f"{b}.self_attn.q_proj": ColwiseParallel(),
                     f"{b}.self_attn.k_proj": ColwiseParallel(),
                     f"{b}.self_attn.v_proj": ColwiseParallel(),
                     f"{b}.self_attn.o_proj": RowwiseParallel(output_layouts=seq),
                     f"{b}.mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                                    use_local_output=False),
                     f"{b}.mlp.gate_proj": ColwiseParallel(),
                     f"{b}.mlp.up_proj": ColwiseParallel(),
                     f"{b}.mlp.down_proj": RowwiseParallel(output_layouts=seq)})
        norms, block_args = ("input_layernorm", "post_attention_layernorm"), 1
    if sequence_parallel:
        plan.update({f"{b}.{n}": SequenceParallel(use_local_output=True) for n in norms})
        rest = (None,) * (block_args - 1)
        plan[f"{a.blocks}.0"] = PrepareModuleInput(input_layouts=(Replicate(), *rest),
                                                   desired_input_layouts=(Shard(1), *rest), use_local_output=True)
        plan[f"{a.blocks}.{a.n_layer - 1}"] = PrepareModuleOutput(output_layouts=Shard(1),
                                                                  desired_output_layouts=Replicate(),
                                                                  use_local_output=True)
    return plan


def localize_heads(model: nn.Module, tp_size: int) -> None:
    """Tell every attention module how many heads this rank runs (1/t of them)."""
    a = arch(model)
    for block in model.get_submodule(a.blocks):
        if a.kind == "gpt2":
            block.attn.split_size //= tp_size  # c_attn's output is [Q_r|K_r|V_r], each hidden / t wide
            block.attn.num_heads //= tp_size
        elif kv_heads_layout(a.heads, a.kv_heads, tp_size) == "replicate":
            block.self_attn.num_key_value_groups = a.heads // tp_size  # one KV head for all of a rank's queries


def _linear(conv, rows=None) -> nn.Linear:
    weight = conv.weight.detach().t()  # Conv1D keeps (in, out); nn.Linear (out, in)
    rows = rows if rows is not None else torch.arange(weight.shape[0])
    lin = nn.Linear(weight.shape[1], len(rows), bias=conv.bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight[rows])
        if conv.bias is not None:
            lin.bias.copy_(conv.bias.detach()[rows])
    return lin


def gpt2_for_dtensor(model: nn.Module, tp_size: int) -> None:
    """GPT-2's Conv1D layers as ``nn.Linear``; [Q|K|V] rows reordered so that block r is [Q_r; K_r; V_r]."""
    hidden = model.config.hidden_size
    per = hidden // tp_size
    order = torch.tensor([p * hidden + r * per + i for r in range(tp_size) for p in range(3) for i in range(per)])
    for block in model.transformer.h:
        block.attn.c_attn = _linear(block.attn.c_attn, order)
        block.attn.c_proj = _linear(block.attn.c_proj)
        block.mlp.c_fc = _linear(block.mlp.c_fc)
        block.mlp.c_proj = _linear(block.mlp.c_proj)


def parallelize_lm(model: nn.Module, how: str, mesh=None, *, sequence_parallel: bool = False,
                   part: nn.Module | None = None, whole_logits: bool = False):
    """``model`` split over the 1-D DeviceMesh ``mesh`` (its group for the scratch code), in place.

    how: ``"scratch"`` (the course's code) or ``"dtensor"`` (``parallelize_module``); ``"single"`` leaves
    the model whole (the scratch code's collectives go to any attached ``CommLog``). part: split only the
    modules of ``model`` that this module holds (a pipeline stage, chapter 07). whole_logits: DTensor
    gathers the logits into plain tensors, for a loss outside ``loss_parallel`` (a pipeline's).
    """
    if how not in HOWS:
        raise ValueError(f"how={how!r}; choose one of {', '.join(map(repr, HOWS))}")
    if how == "single":
        return model
    t = mesh.size()
    target = model if part is None else part
    if how == "scratch":
        plan = scratch_plan(model, t, sequence_parallel)
        parallelize(target, plan if part is None else plan_for_part(plan, model, part), mesh.get_group(),
                    sequence_parallel=sequence_parallel)
    else:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        plan = dtensor_plan(model, t, sequence_parallel)
        if whole_logits:
            plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
        if arch(model).kind == "gpt2":
            gpt2_for_dtensor(model, t)  # new modules: the plan is matched to them below
        parallelize_module(target, mesh, plan if part is None else plan_for_part(plan, model, part))
        if part is None and getattr(model.config, "tie_word_embeddings", False):
            model.lm_head.weight = model.get_input_embeddings().weight  # each module got its own copy: tie again
    localize_heads(model, t)
    return model


def forward_backward(model: nn.Module, ids, how: str = "single", group=None) -> float:
    """Next-token cross-entropy of ``ids`` (batch, seq), mean over tokens, and its backward; the loss."""
    if how not in HOWS:
        raise ValueError(f"how={how!r}; choose one of {', '.join(map(repr, HOWS))}")
    logits = model(input_ids=ids).logits  # (batch, seq, vocab), or this rank's vocab / t of it
    pred, target = logits[:, :-1], ids[:, 1:]  # token i predicts token i + 1
    if how == "dtensor":
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():  # DTensor's vocabulary-parallel cross-entropy, backward included
            loss = F.cross_entropy(pred.flatten(0, 1), target.flatten())
            loss.backward()
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    elif how == "scratch":
        loss = vocab_parallel_cross_entropy(pred, target, group)
        loss.backward()
    else:
        loss = F.cross_entropy(pred.flatten(0, 1), target.flatten())
        loss.backward()
    return loss.item()


def train(model: nn.Module, batches, how: str = "single", group=None, lr: float = 0.05) -> list[float]:
    """One SGD step per batch; the loss of each (the same on every rank)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    device = next(model.parameters()).device  # DTensor parameters live on their mesh's device
    losses = []
    for ids in batches:
        losses.append(forward_backward(model, ids.to(device), how, group))
        opt.step()
        opt.zero_grad()
    return losses


def as_counted(model: nn.Module) -> nn.Module:
    """GPT-2 as Korthikanti et al. (2022, §4) count its activations (chapter 01's convention): eager attention,
    so that the a·s² scores per head are stored, and exact GeLU."""
    from transformers.activations import ACT2FN

    model.config._attn_implementation = "eager"
    for block in model.transformer.h:
        block.mlp.act = ACT2FN["gelu"]
    return model


class WithLoss(nn.Module):
    """forward(ids) = the model's next-token loss (vocabulary-parallel when ``parallel``): what the loss keeps
    for backward is counted with the model's activations."""

    def __init__(self, model: nn.Module, parallel: bool):
        super().__init__()
        self.model, self.parallel = model, parallel

    def forward(self, ids):
        logits = self.model(input_ids=ids).logits[:, :-1]
        if self.parallel:
            return vocab_parallel_cross_entropy(logits, ids[:, 1:])
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def activation_bytes(model: nn.Module, ids, tp_size: int = 1, sequence_parallel: bool = False) -> int:
    """Bytes autograd saves for backward in one forward of ``model`` and its loss, on this rank: the model
    whole (``tp_size=1``) or split by :func:`scratch_plan` (run on every rank of the group)."""
    from parlab.lab.measure import measure_activations

    if tp_size > 1:
        parallelize(model, scratch_plan(model, tp_size, sequence_parallel), sequence_parallel=sequence_parallel)
        localize_heads(model, tp_size)
    return measure_activations(WithLoss(model, tp_size > 1), ids)


def recorded_step(model: nn.Module, ids, sequence_parallel: bool = False, plan: dict | None = None) -> dict:
    """One forward and backward of ``model`` split over every rank by ``plan`` (default :func:`scratch_plan`),
    with the vocabulary-parallel loss: ``loss``, the whole ``logits`` (gathered, for checks), every gradient
    whole (``grads``, by the dense model's names) and the ``records`` of every collective. Run on every rank."""
    import torch.distributed as dist

    from parlab.lab.measure import CommLog
    from parlab.lab.parallel.tensor_plan import dense_state

    n = dist.get_world_size()
    parallelize(model, plan or scratch_plan(model, n, sequence_parallel), sequence_parallel=sequence_parallel)
    localize_heads(model, n)
    with CommLog() as log:
        logits = model(input_ids=ids).logits  # (b, s, vocab / t): this rank's slice of the vocabulary
        loss = vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:])
        loss.backward()
    whole = [torch.empty_like(logits) for _ in range(n)]
    dist.all_gather(whole, logits.detach().contiguous())  # for the check only
    return {"loss": loss.item(), "logits": torch.cat(whole, -1), "grads": dense_state(model, grads=True),
            "records": list(log.records)}
