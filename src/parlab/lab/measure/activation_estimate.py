"""The activations term of :func:`parlab.lab.measure.memory.estimate_memory`: which architecture to count, and
its bytes per rank (chapter 01; the planner's memory in 07).

:func:`architecture` reads an :class:`~parlab.lab.measure.activations.Architecture` off a transformers config
or a built model (whose MLP activation is probed, whatever its config says), or builds Korthikanti et al.'s
GPT layer from ``hidden``, ``layers``, ``heads``. :func:`estimate_activations` sums its terms
(:mod:`parlab.lab.measure.activations`) per rank under tensor and sequence parallelism, with or without full
activation checkpointing, and adds the model's ends when it has a vocabulary.
"""

from __future__ import annotations

import math

from torch import nn

from parlab.lab.measure.activations import Architecture, end_terms, layer_terms, left_out


def architecture(model=None, *, hidden=None, layers=None, heads=None, vocab=None, attention=None,
                 dropout=None) -> Architecture:
    """The :class:`~parlab.lab.measure.activations.Architecture` :func:`estimate_memory` counts activations
    for: read from a transformers config (or a model's ``.config``); else Korthikanti et al.'s GPT layer
    of the given ``hidden``, ``layers``, ``heads`` (and dropout unless ``dropout=False``)."""
    config = getattr(model, "config", None) if isinstance(model, nn.Module) else model
    if config is not None and hasattr(config, "model_type"):
        arch = Architecture.from_config(config, attention=attention, dropout=dropout)
        if dropout is True and not (arch.attn_dropout or arch.resid_dropout):
            raise ValueError("dropout=True, but the config sets its dropout probabilities to 0: change the "
                             "config (dropout=None follows it, dropout=False turns it off)")
        overrides = {k: v for k, v in (("hidden", hidden), ("layers", layers), ("heads", heads),
                                        ("vocab", vocab)) if v}
        act = _activation_module(model, arch.family) if isinstance(model, nn.Module) else None
        if act is not None:  # the model's own activation is probed, whatever its config says
            overrides["activation_fn"] = act
            if type(act).__name__ != _activation_class(arch.activation):
                overrides["activation"] = type(act).__name__
        if overrides:
            from dataclasses import replace

            arch = replace(arch, **overrides)
        return arch
    missing = [n for n, v in (("hidden", hidden), ("layers", layers), ("heads", heads)) if not v]
    if missing:
        raise ValueError(f"activations need {', '.join(missing)}= (or a transformers config that has them)")
    return Architecture.gpt(hidden, layers, heads, vocab, dropout is not False, attention or "eager")


#: where each family keeps its MLP's activation module (transformers' modeling code)
_ACTIVATION_PATHS = {"gpt2": "transformer.h.0.mlp.act", "llama": "model.layers.0.mlp.act_fn",
                     "bloom": "transformer.h.0.mlp.gelu_impl"}


def _activation_class(name: str) -> str | None:
    """The class name transformers builds for an activation name (BLOOM's own GeLU for "bloom")."""
    if name == "bloom":
        return "BloomGelu"
    from transformers.activations import ACT2FN

    return type(ACT2FN[name]).__name__ if name in ACT2FN else None


def _activation_module(model: nn.Module, family: str):
    """The first layer's MLP activation of a built transformers model, or None where it is not found."""
    path = _ACTIVATION_PATHS.get(family)
    try:
        return model.get_submodule(path) if path else None
    except AttributeError:
        return None


def estimate_activations(model, micro_batch: int, seq_len: int | None, value: int, *, tp_size: int = 1,
                         sequence_parallel: bool = False, checkpointing: bool = False, device: str | None = None,
                         **shape) -> tuple[int, list[str]]:
    """(bytes of activations one rank keeps for ``micro_batch`` sequences of ``seq_len`` tokens in ``value``-byte
    values, notes saying what was counted). ``shape``: :func:`architecture`'s keywords (``hidden``, ``layers``,
    ``heads``, ``vocab``, ``attention``, ``dropout``); the rest as :func:`estimate_memory` documents them."""
    positive = isinstance(micro_batch, int) and not isinstance(micro_batch, bool) and micro_batch > 0
    if not positive:
        raise ValueError(f"micro_batch={micro_batch!r} must be a positive int (or 0: no activations)")
    arch = architecture(model, **shape)
    config = getattr(model, "config", None) if isinstance(model, nn.Module) else model
    seq_len = seq_len or getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not seq_len:
        raise ValueError(f"micro_batch={micro_batch} asks for activations, which need seq_len= (or a "
                         f"transformers config that has max_position_embeddings)")
    if device is None:
        device = "cpu" if isinstance(model, nn.Module) and next(model.parameters()).device.type == "cpu" \
            else "cuda"
    notes = []
    layer = layer_terms(arch, seq_len, micro_batch, value, device)
    per_layer = sum(term.per_rank(tp_size, sequence_parallel) for term in layer)
    if checkpointing:
        # kept: each layer's input (replicated over tp ranks unless sequence parallel); during one
        # layer's backward its activations are recomputed and live until its backward ends
        kept = seq_len * micro_batch * arch.hidden * value / (tp_size if sequence_parallel else 1)
        layers_bytes = kept * arch.layers + per_layer
        notes.append("checkpointing: every layer's input, plus one layer recomputed during its backward")
    else:
        # With 1F1B the first pipeline stage keeps pp_size micro-batches of layers/pp_size layers:
        # the activations of all layers, whatever pp_size is (Korthikanti et al. 2022, §4.2.3).
        layers_bytes = per_layer * arch.layers
    # the model's ends need its vocabulary (Korthikanti's layer alone has none unless vocab= is given)
    ends = end_terms(arch, seq_len, micro_batch, value, device) if arch.vocab else []
    activations = math.ceil(layers_bytes + sum(t.per_rank(tp_size, sequence_parallel) for t in ends))
    notes.append(f"activations: {arch.layers} {arch.family} layers ({arch.attention} attention, {device} "
                 f"dropout masks)" + (", embedding side, final norm, output layer and fp32 "
                                      "log-probabilities of the loss" if ends else " only (no vocab: no ends)"))
    return activations, notes + left_out(arch)
