"""Counting a model on the meta device, once per config (chapter 07's planner): the parameters outside its stack of
layers, a layer's tensors, a mixture of experts' routed experts, and the bytes a layer keeps (chapter 01's
estimator); each cached by the config's JSON."""

from __future__ import annotations

import functools
import json

def root_params(config) -> int:
    """The parameters outside a transformers model's stack of layers (its largest ``nn.ModuleList``): the
    embeddings, the final norm and an untied output layer, which ZeRO-3 gathers as one root unit (chapter 04).
    Counted on the meta device, as :func:`parlab.lab.measure.count_params` counts Ψ."""
    from parlab.lab.measure.activations import config_json

    return _root_params(config_json(config))


@functools.lru_cache(maxsize=256)  # the planner asks again for the same config at every prediction
def _root_params(config_json: str) -> int:
    from torch import nn

    from parlab.lab.measure.activations import meta_model

    model = meta_model(config_json)
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not stacks:
        raise ValueError(f"config of {model.config.model_type!r} builds a model with no list of layers")
    layers = {id(p) for p in max(stacks, key=lambda m: sum(p.numel() for p in m.parameters())).parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in layers)


#: The config fields a mixture of experts names its routed experts by, and its top-k by.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


@functools.lru_cache(maxsize=64)
def experts_of(config_json: str) -> tuple[int, int, int] | None:
    from parlab.lab.measure.activations import meta_model

    model = meta_model(config_json)
    config = model.config
    num = next((getattr(config, f) for f in EXPERT_FIELDS if getattr(config, f, None)), None)
    if not num or num <= 1:
        return None
    routed = sum(p.numel() for name, p in model.named_parameters()
                 if ".experts." in name and "shared" not in name)
    return num, config.num_experts_per_tok, routed


@functools.cache
def layer_tensors_of(config_json: str) -> tuple[int, int]:
    from torch import nn

    from parlab.lab.measure.activations import meta_model

    stacks = [m for m in meta_model(config_json).modules() if isinstance(m, nn.ModuleList)]
    layer = max(stacks, key=lambda m: sum(p.numel() for p in m.parameters()))[0]
    sizes = [p.numel() for p in layer.parameters()]
    return len(sizes), max(sizes)


@functools.cache
def layer_bytes_of(config_json: str, attention, seq_len: int, micro_batch: int, value_bytes: int, tp: int,
                 sequence_parallel: bool = False) -> float:
    from transformers import AutoConfig

    from parlab.lab.measure.activations import layer_terms
    from parlab.lab.measure.memory import architecture

    config = AutoConfig.for_model(**json.loads(config_json))
    arch = architecture(config, attention=attention)
    return sum(t.per_rank(tp, sequence_parallel) for t in layer_terms(arch, seq_len, micro_batch, value_bytes, "cuda"))


#: Ops that move no bytes of their own (views, allocations) or whose cost is priced elsewhere (matrix products and
#: attention at their FLOP/s; the embedding and the loss lie outside the layers).
_UNCOUNTED = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute",
    "unsqueeze", "squeeze", "slice", "select", "alias", "detach", "as_strided", "split", "split_with_sizes",
    "unbind", "empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided", "lift_fresh"})


def _traffic_mode(tokens: int, hidden: int, fused_scores: int | None = None):
    """A dispatch mode that adds up the bytes each counted op reads and writes, split into the ops whose largest
    tensor is the (tokens, h) activation (norms, residual adds: on every tp rank unless sequence-parallel) and
    the others (the MLP's and attention's own: split over tp). ``fused_scores``: the length whose (…, s, s) scores
    a fused attention kernel never writes out, so the ops on them are not counted."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Traffic(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.replicated = self.split = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ in _UNCOUNTED:
                return out
            tensors = [t for t in tree_leaves((args, kwargs, out)) if torch.is_tensor(t)]
            if any(t.numel() == 0 for t in tensors):  # the key-value cache's first concatenation: not training's
                return out
            moved = sum(t.numel() * t.element_size() for t in tensors if t.numel() > 1)
            largest = max(tensors, key=torch.Tensor.numel, default=None)
            if fused_scores and largest is not None and largest.shape[-2:] == (fused_scores, fused_scores):
                return out
            if largest is not None and largest.shape[-1:] == (hidden,) and largest.numel() == tokens * hidden:
                self.replicated += moved
            else:
                self.split += moved
            return out

    return Traffic()


def _fused_attention(q, k, v, *args, **kwargs):
    """Stands in for ``scaled_dot_product_attention`` while counting: a fused kernel, priced at its FLOP/s."""
    import torch

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.inputs = (q, k, v)
            return q.new_empty(q.shape[:-1] + v.shape[-1:])

        @staticmethod
        def backward(ctx, grad):
            return tuple(t.new_empty(t.shape) for t in ctx.inputs)

    return Attention.apply(q, k, v)


#: The sequence length a fused attention's layer is counted at: its traffic per token is the same at any length
#: but for the norms' weights, read once per op (at 1,021 tokens under 0.1 % of Llama 3 8B's); and a prime is no
#: other dimension of a model, so a (…, s, s) tensor is the scores.
FUSED_COUNT_LENGTH = 1021


@functools.lru_cache(maxsize=64)
def elementwise_traffic(config_json: str, attention: str, seq_len: int, value_bytes: int) -> tuple[float, ...]:
    """Bytes per token that one layer's other ops than its matrix products read and write when each runs as its
    own eager kernel: (forward on (…, h) tensors, forward on the others, backward on (…, h), backward on the
    others). Counted on the meta device with a dispatch mode, as one layer's difference between the model with
    two layers and with one (so the embedding, the final norm and the loss cancel). ``attention="eager"``:
    transformers' own, its s × s scores counted at ``seq_len``; else a fused kernel, not counted (its FLOPs are
    priced), at :data:`FUSED_COUNT_LENGTH`: ``scaled_dot_product_attention`` stands in for it, and in a model
    transformers runs only eagerly (BLOOM, MPT) the ops on the scores are left out."""
    import unittest.mock

    import torch

    from parlab.lab.measure.activations import build_meta_model

    dtype = {2: torch.bfloat16, 4: torch.float32}[value_bytes]
    eager = {"_attn_implementation": "eager"} if attention == "eager" else {}
    counts = []
    for layers in (1, 2):
        model = build_meta_model(config_json, dtype, num_hidden_layers=layers, **eager).train()
        ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
        fused = None if eager else seq_len
        forward, backward = (_traffic_mode(seq_len, model.config.hidden_size, fused) for _ in range(2))
        with unittest.mock.patch("torch.nn.functional.scaled_dot_product_attention", _fused_attention), forward:
            logits = model(input_ids=ids).logits
        with backward:
            logits.backward(torch.ones_like(logits))
        counts.append((forward.replicated, forward.split, backward.replicated, backward.split))
    return tuple((two - one) / seq_len for one, two in zip(*counts))
