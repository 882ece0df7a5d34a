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
