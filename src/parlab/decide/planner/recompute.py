"""Recomputing some layers (Megatron-Core's ``recompute_method="block"``, ``Workload(recompute_layers=)``): the
share of a stage's layers that recompute, and a prediction weighted between recomputing none and all of them
(:func:`~parlab.decide.planner.step.predict`)."""

from __future__ import annotations

from dataclasses import replace

from parlab.decide.planner.layout import Layout, stage_layers
from parlab.decide.planner.workload import Workload


def recomputed_layers(w: Workload, layers: int, chunks: int = 1) -> int:
    """Of ``layers`` layers in ``chunks`` model chunks, those full recomputation redoes: all, or
    ``recompute_layers`` of each chunk (:meth:`Workload.hardware_flops` counts the model's, :func:`recomputed_share`
    a stage's). More than a chunk holds recomputes the whole chunk, as Megatron-Core's block loop does: its
    ``TransformerConfig`` names the range 1 to the layers per pipeline rank but refuses only ``None``."""
    return layers if w.recompute_layers is None else min(layers, w.recompute_layers * chunks)


def recomputed_share(w: Workload, layout: Layout) -> float:
    """The share of the heaviest stage's layers that full recomputation redoes: all of them, or under
    ``recompute_layers`` (Megatron-Core's ``recompute_method="block"``) that many of each of its ``vp`` chunks."""
    layers = max(stage_layers(w, layout.pp))
    return recomputed_layers(w, layers, layout.vp) / layers


def blend(kept, full, share: float, capacity: float):
    """A stage of which ``share`` of the layers recompute and the rest keep their activations, weighted between
    the prediction without recomputation and the one with all of it. Exact for what is counted per layer (the
    forward redone, the bubble, TP's, CP's and EP's bytes, the FLOPs); where an overlap hides part of a cost
    (TP, the all-to-alls, data parallelism) and the two sides differ in what stays exposed, an upper bound on the
    step; the activations over by at most the one layer full recomputation holds whole. ``kept``, ``full``: two
    :class:`~parlab.decide.planner.step.Prediction` of one layout; ``capacity``: the GPU's memory, in bytes."""
    mix = lambda a, b: (1 - share) * a + share * b  # noqa: E731
    step = mix(kept.step_s, full.step_s)
    memory = replace(full.memory, activations=round(mix(kept.memory.activations, full.memory.activations)),
                     notes=full.memory.notes + (f"full recomputation of {share:.0%} of the stage's layers",))
    return replace(full, memory=memory, step_s=step, fits=memory.total <= capacity,
                   parts={k: mix(kept.parts[k], full.parts[k]) for k in full.parts},
                   bytes_by_axis={k: mix(kept.bytes_by_axis[k], full.bytes_by_axis[k]) for k in full.bytes_by_axis},
                   mfu=full.mfu * full.step_s / step, hfu=mix(kept.hfu * kept.step_s, full.hfu * full.step_s) / step)
