"""The guide's decision rules, as a plain function: which strategy for this model on this hardware (chapter 01).

Hugging Face's "Efficient Training on Multiple GPUs" (https://huggingface.co/docs/transformers/perf_train_gpu_many)
closes with a short decision guide: estimate memory first; then

- **one node**, the model fits one GPU → DDP; ZeRO may be faster or slower, so measure;
- **one node**, it does not fit → PP, ZeRO or TP; with NVLink/NVSwitch the three perform alike, over
  PCIe PP is fastest; a TP degree above the GPUs in one node is never advised;
- the **largest layer** does not fit one GPU → TP (not PP, which cannot split a layer), or ZeRO-3 with
  the single-GPU techniques (offload, checkpointing);
- **several nodes**, fast inter-node links → ZeRO (almost no model changes) or PP+TP+DP (less
  communication, many model changes); slow links and little GPU memory → DP+PP+TP+ZeRO-1.

:func:`recommend` applies these rules to numbers from :func:`parlab.lab.measure.estimate_memory` (model states,
and activations when given a micro-batch and sequence length) and returns an :class:`Advice`: the situation
and the guide's rule for it, the recommendations with what sets each apart, and the memory per GPU of
every candidate layout (for :func:`parlab.lab.plots.memory_bars`). ``parlab.decide.widgets.strategy_tool`` is
the same function behind sliders.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from parlab.lab.checks import non_negative_int, positive_int
from parlab.lab.measure.memory import GB, MemoryEstimate, estimate_memory

INTRA_NODE = ("nvlink", "pcie")  # NVLink/NVSwitch between the GPUs of a node, or only PCIe
INTER_NODE = ("fast", "slow")    # e.g. InfiniBand / 400 Gb/s Ethernet, against ordinary Ethernet


def _presets():
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    return {
        "GPT-2 XL (1.5B)": GPT2Config(n_embd=1600, n_layer=48, n_head=25, n_positions=1024),
        "Llama 2 7B": LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                  num_attention_heads=32, vocab_size=32000, max_position_embeddings=4096),
        "Llama 2 13B": LlamaConfig(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                                   num_attention_heads=40, vocab_size=32000, max_position_embeddings=4096),
        "Llama 2 70B": LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                   num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                                   max_position_embeddings=4096),
        "BLOOM 176B": BloomConfig(hidden_size=14336, n_layer=70, n_head=112, vocab_size=250880),
    }


#: Well-known architectures with their published shapes, written as configs (nothing is downloaded).
PRESET_NAMES = ("GPT-2 XL (1.5B)", "Llama 2 7B", "Llama 2 13B", "Llama 2 70B", "BLOOM 176B")


@functools.cache
def preset(name: str):
    """The transformers config of a :data:`PRESET_NAMES` entry."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"name={name!r} is not a preset; choose one of {', '.join(PRESET_NAMES)}")
    return presets[name]


def _shape(model: nn.Module) -> tuple[int, int]:
    """(Ψ, parameters of the largest single layer)."""
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@dataclass(frozen=True)
class Recommendation:
    strategy: str
    reason: str                 # what sets this one apart from the others offered with it
    layout: str | None = None   # the key in Advice.memory of the layout it stands for (None: "measure")


@dataclass(frozen=True)
class Advice:
    recommendations: list[Recommendation]
    memory: dict[str, MemoryEstimate]   # per-GPU estimate of each candidate layout
    gpu_memory: float                   # bytes
    fits_one_gpu: bool                  # model states and (if asked for) activations, on one GPU
    largest_layer_fits: bool
    notes: list[str] = field(default_factory=list)
    summary: str = ""                   # the situation and the guide's rule for it, before the choices
    rule: "Rule | None" = None          # the leaf of RULES that applied
    path: tuple = ()                    # ((Question, answer), ...) from the root of RULES to that leaf

    def fits(self, rec: Recommendation) -> bool | None:
        return None if rec.layout is None else self.memory[rec.layout].total <= self.gpu_memory

    def verdict(self, rec: Recommendation) -> str:
        """``"13.5 GB per GPU: fits in 24 GB"``, or ``""`` for a recommendation without a layout."""
        if rec.layout is None:
            return ""
        need = self.memory[rec.layout].total / GB
        return f"{need:.1f} GB per GPU: {'fits' if self.fits(rec) else 'does NOT fit'} in {self.gpu_memory / GB:g} GB"

    def __str__(self) -> str:
        lines = [self.summary] if self.summary else []
        for i, r in enumerate(self.recommendations, 1):
            verdict = self.verdict(r)
            lines.append(f"{i}. {r.strategy}: {r.reason}" + (f" [{verdict}]" if verdict else ""))
        return "\n".join(lines + [f"   ({n})" for n in self.notes])


def _mesh(tp: int, pp: int, dp: int, zero_stage: int = 0) -> str:
    """A layout's label, the axes of size > 1 only: ``"TP 8 × PP 2 × DP 2 + ZeRO-1"``, ``"PP 8"`` (as
    ``parlab.decide.planner.Layout`` prints it; ``parlab.decide.planner.layout_of`` reads it back)."""
    axes = [f"{name} {size}" for name, size in (("TP", tp), ("PP", pp), ("DP", dp)) if size > 1]
    return (" × ".join(axes) or "1 GPU") + (f" + ZeRO-{zero_stage}" if zero_stage and dp > 1 else "")


def _check(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")


def recommend(model=None, *, num_params: int | None = None, largest_layer_params: int | None = None,
              gpu_memory_gb: float = 80, gpus_per_node: int = 8, nodes: int = 1,
              intra_node: str = "nvlink", inter_node: str = "fast", precision: str = "bf16",
              optimizer: str = "adam", micro_batch: int = 0, seq_len: int | None = None,
              checkpointing: bool = False) -> Advice:
    """Apply the guide's rules. ``model``: a transformers config, a preset name, or an ``nn.Module``;
    or give ``num_params`` (and optionally ``largest_layer_params``). Sizes in decimal GB (10⁹ bytes),
    as GPU vendors state them.

    ``micro_batch > 0`` counts activations too (micro-batch × ``seq_len`` tokens per GPU, all layers
    saved, or only each layer's input with ``checkpointing``): then "fits one GPU" means model states
    *and* activations, as in training. Activations need an architecture (a config or preset); with
    ``num_params`` alone they are left out and a note says so."""
    _check("intra_node", intra_node, INTRA_NODE)
    _check("inter_node", inter_node, INTER_NODE)
    positive_int("gpus_per_node", gpus_per_node, "GPUs in each node")
    positive_int("nodes", nodes, "machines")
    non_negative_int("micro_batch", micro_batch, "sequences per GPU; 0 leaves activations out")
    if seq_len is not None:
        positive_int("seq_len", seq_len, "tokens per sequence")
    if not gpu_memory_gb or gpu_memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb={gpu_memory_gb!r} must be a positive number of GB")
    model, num_params, largest_layer_params = _model_shape(model, num_params, largest_layer_params)
    config = getattr(model, "config", None)  # a transformers model's: the estimator reads activations off it
    act = dict(model=model) if model is not None else dict(num_params=num_params)
    with_acts = bool(micro_batch) and config is not None
    act.update(precision=precision, optimizer=optimizer, micro_batch=micro_batch if with_acts else 0,
               seq_len=seq_len, checkpointing=checkpointing)
    c = _Layouts(act, gpu_memory_gb * GB, gpus_per_node, nodes)
    one = c.memory["1 GPU"]
    fits_one = one.total <= c.gpu
    layer_fits = largest_layer_params * one.model_states / num_params <= c.gpu
    situation = Situation(layer_fits, nodes, fits_one, intra_node, inter_node, with_acts)
    rule, path = walk(situation)
    guide, recs = rule.guide, rule.advise(c, situation)
    fit = ("Even the largest layer does not fit one GPU." if not layer_fits
           else "It fits one GPU." if fits_one else "It does not fit one GPU.")
    if with_acts:
        need = (f"{one.total / GB:.1f} GB ({one.model_states / GB:.1f} GB model states + "
                f"{one.activations / GB:.1f} GB activations)")
    else:
        need = f"{one.total / GB:.1f} GB of model states"
    summary = f"{fit} One GPU needs {need}; it has {gpu_memory_gb:g} GB. {guide}"
    notes = _notes(c, recs, num_params, config if with_acts else None, micro_batch, seq_len, checkpointing)
    return Advice(recs, c.memory, c.gpu, fits_one, layer_fits, notes, summary, rule, path)


def _model_shape(model, num_params, largest_layer_params) -> tuple:
    """(the model, built on the meta device when given as a config or preset name, or None; Ψ; the
    parameters of its largest layer, 0 when unknown)."""
    if isinstance(model, str):
        model = preset(model)
    if model is not None and not isinstance(model, nn.Module):
        # the estimator counts a config's parameters by building it; a cached meta model counts at once
        from parlab.lab.measure.activations import config_json, meta_model

        model = meta_model(config_json(model))
    if model is not None:
        num_params, largest_layer_params = _shape(model)
    if num_params is None:
        raise ValueError("give model= (a transformers config, preset name or nn.Module) or num_params=")
    return model, num_params, largest_layer_params or 0


class _Layouts:
    """The candidate layouts on ``nodes`` nodes of ``gpus_per_node`` GPUs of ``gpu`` bytes, and the per-GPU
    memory of each (``memory``, by label; the rules add the TP × PP layouts they consider)."""

    def __init__(self, act: dict, gpu: float, gpus_per_node: int, nodes: int):
        self.act, self.gpu, self.gpus_per_node, self.nodes = act, gpu, gpus_per_node, nodes
        n = self.n = gpus_per_node * nodes
        self.ddp, self.z3, self.zero = f"DDP ×{n}", f"ZeRO-3 ×{n}", f"ZeRO ×{n}"
        self.pp, self.tp = _mesh(1, gpus_per_node, nodes), _mesh(gpus_per_node, 1, nodes)
        self.memory = {"1 GPU": self.estimate(), self.ddp: self.estimate(world_size=n)}
        for stage in (1, 2, 3):
            self.memory[f"ZeRO-{stage} ×{n}"] = self.estimate(world_size=n, zero_stage=stage)
        self.memory[self.pp] = self.estimate(world_size=n, pp_size=gpus_per_node)
        self.memory[self.tp] = self.estimate(world_size=n, tp_size=gpus_per_node)
        self.three = self.tp_and_pp(2) if nodes > 1 else None

    def estimate(self, **kw) -> MemoryEstimate:
        return estimate_memory(**{**self.act, **kw})

    def fits(self, label: str) -> bool:
        return self.memory[label].total <= self.gpu

    def tp_and_pp(self, fewest: int) -> str:
        """TP inside a node, pipeline stages across nodes (at least ``fewest``), the fewest that make it fit,
        DP over the rest with ZeRO-1 (which shards nothing over one replica: then no ZeRO)."""
        nodes, tp = self.nodes, self.gpus_per_node
        for pp in (d for d in range(fewest, nodes + 1) if nodes % d == 0):
            stage = 1 if nodes // pp > 1 else 0
            estimate = self.estimate(world_size=self.n, tp_size=tp, pp_size=pp, zero_stage=stage)
            if estimate.total <= self.gpu:
                break
        label = _mesh(tp, pp, nodes // pp, stage)
        self.memory[label] = estimate
        return label


# -- the guide's rules, as a tree: questions about the situation, and at each leaf the guide's advice ----------


@dataclass(frozen=True)
class Situation:
    """What the guide's questions are asked of (:func:`recommend` works it out from the estimates)."""

    layer_fits: bool    # the largest layer's model states fit one GPU
    nodes: int
    fits_one: bool      # the whole model (and its activations, if counted) fits one GPU
    intra_node: str     # "nvlink" or "pcie"
    inter_node: str     # "fast" or "slow"
    with_acts: bool     # activations are counted


@dataclass(frozen=True)
class Rule:
    """A leaf of :data:`RULES`: the guide's advice for one situation. ``offers``: the strategies in a few
    words (what the tree's picture shows); ``guide``: the guide's sentence (in :attr:`Advice.summary`);
    ``advise``: the recommendations, with their layouts, for these GPUs."""

    name: str
    offers: str
    guide: str
    advise: Callable[[_Layouts, Situation], list[Recommendation]]


@dataclass(frozen=True)
class Question:
    """An inner node of :data:`RULES`: ``test(situation)`` answers ``text``; yes leads to ``yes``."""

    text: str
    test: Callable[[Situation], bool]
    yes: "Question | Rule"
    no: "Question | Rule"


def _layer_too_large(c: _Layouts, s: Situation) -> list[Recommendation]:
    recs = []
    if c.fits(c.tp) or c.nodes == 1:
        recs.append(Recommendation(c.tp, "the only way to split a layer: each GPU holds a slice of "
                                   "every weight matrix (pipeline parallelism moves whole layers)", c.tp))
    else:  # TP splits the layers; it alone does not hold the model: pipeline stages across nodes do the rest
        both = c.tp_and_pp(1)
        recs.append(Recommendation(both, f"TP splits every layer, the largest included; TP {c.gpus_per_node} "
                                   f"alone needs {c.memory[c.tp].total / GB:.0f} GB per GPU, so pipeline "
                                   "stages across nodes divide the layers until it fits", both))
    recs.append(Recommendation(c.z3 + " + offload/checkpointing", "gathers one layer at a time; CPU offload "
                               "and activation checkpointing make room for it; no change to the model, "
                               "but more traffic", c.z3))
    return recs


def _fits_one_gpu(c: _Layouts, s: Situation) -> list[Recommendation]:
    return [
        Recommendation(c.ddp, "every GPU holds a whole copy and all-reduces gradients after "
                       "backward: the simplest, usually the fastest", c.ddp),
        Recommendation(c.zero, "shards optimizer state (stage 1) and more over the GPUs, freeing "
                       "memory for a larger micro-batch; may be faster or slower than DDP: "
                       "measure both on your setup", None)]


def _one_node_pcie(c: _Layouts, s: Situation) -> list[Recommendation]:
    return [
        Recommendation(c.pp, "only activations cross PCIe, once per stage boundary; the "
                       "model must be split into stages", c.pp),
        Recommendation(c.z3, "no change to the model, but it gathers every layer's weights over "
                       "PCIe at every step: slower than PP there", c.z3)]


def _one_node_nvlink(c: _Layouts, s: Situation) -> list[Recommendation]:
    choices = [
        Recommendation(c.pp, f"cuts the layers into {c.gpus_per_node} stages, one per GPU; only "
                       "activations travel between GPUs, but GPUs idle while the pipeline fills (the "
                       "bubble) and the model must be split into stages"
                       # 1F1B: the first stage keeps p micro-batches of L/p layers (Korthikanti §4.2.3)
                       + ("; the first stage holds as many activations as one GPU would" if s.with_acts
                          else ""), c.pp),
        Recommendation(c.z3, f"shards weights, gradients and optimizer state over {c.n} GPUs with no change to "
                       "the model; gathers each layer's weights as it runs (1.5× DDP's traffic); "
                       "activations are not sharded", c.z3),
        Recommendation(c.tp, f"splits every weight matrix, and the activations, over {c.gpus_per_node} "
                       "GPUs; all-reduces activations in every layer, so it needs NVLink and layers "
                       "written for it", c.tp)]
    # alike in speed, so what fits comes first (stable: the guide's order otherwise)
    return sorted(choices, key=lambda r: not c.fits(r.layout))


def _first_ddp(c: _Layouts, s: Situation, recs: list[Recommendation]) -> list[Recommendation]:
    if s.fits_one:
        recs.insert(0, Recommendation(c.ddp, "plain data parallelism, the simplest start: a whole copy per "
                                      "GPU, gradients all-reduced across nodes once per step", c.ddp))
    return recs


def _nodes_fast(c: _Layouts, s: Situation) -> list[Recommendation]:
    return _first_ddp(c, s, [
        Recommendation(c.zero if s.fits_one else c.z3, "almost no changes to the model, but "
                       "the most traffic between nodes (weights gathered at every step)", c.z3),
        Recommendation(c.three, "less communication than ZeRO, but the model must be "
                       "rewritten for TP and PP (ZeRO-1 where DP has replicas)", c.three)])


def _nodes_slow(c: _Layouts, s: Situation) -> list[Recommendation]:
    return _first_ddp(c, s, [
        Recommendation(c.three, "TP inside nodes, PP across them (only activations cross "
                       "the slow links), DP over the rest, ZeRO-1 to shard optimizer "
                       "states over its replicas", c.three)])


#: The guide's decision rules as :func:`recommend` walks them (:func:`walk`); chapter 01 draws this tree.
RULES = Question(
    "Does the largest layer fit one GPU?", lambda s: s.layer_fits,
    no=Rule("layer too large", "TP, or ZeRO-3 + offload",
            "The guide: tensor parallelism, or ZeRO-3 with the single-GPU techniques.", _layer_too_large),
    yes=Question(
        "One node?", lambda s: s.nodes == 1,
        yes=Question(
            "Does the model fit one GPU?", lambda s: s.fits_one,
            yes=Rule("fits one GPU", "DDP (ZeRO: measure)",
                     "The guide: replicate it (DDP); ZeRO may be faster or slower, so measure.", _fits_one_gpu),
            no=Question(
                "NVLink or NVSwitch inside it?", lambda s: s.intra_node == "nvlink",
                yes=Rule("one node, NVLink", "PP, ZeRO-3 or TP, alike",
                         "With NVLink/NVSwitch inside the node the guide finds PP, ZeRO and TP about alike in "
                         "speed; they differ in memory and in how much the model must change.", _one_node_nvlink),
                no=Rule("one node, PCIe", "PP (ZeRO-3 slower)",
                        "Over PCIe the guide finds pipeline parallelism fastest.", _one_node_pcie))),
        no=Question(
            "Fast links between the nodes?", lambda s: s.inter_node == "fast",
            yes=Rule("nodes, fast links", "ZeRO, or TP × PP × DP",
                     "Fast links between nodes: the guide offers ZeRO, or PP + TP + DP.", _nodes_fast),
            no=Rule("nodes, slow links", "TP × PP × DP + ZeRO-1",
                    "Slow links between nodes: the guide offers DP + PP + TP + ZeRO-1.", _nodes_slow))))


def walk(situation: Situation, tree: "Question | Rule" = RULES) -> tuple[Rule, tuple]:
    """The leaf of ``tree`` the situation reaches, and the path to it: ``((question, answer), ...)``."""
    path = []
    while isinstance(tree, Question):
        answer = bool(tree.test(situation))
        path.append((tree, answer))
        tree = tree.yes if answer else tree.no
    return tree, tuple(path)


def _notes(c: _Layouts, recs: list, num_params: int, config, micro_batch: int, seq_len: int | None,
           checkpointing: bool) -> list[str]:
    """What the advice rests on and leaves out. ``config``: the model's, when activations were counted."""
    one = c.memory["1 GPU"]
    act = c.act
    notes = [f"Ψ = {num_params / 1e9:.3g} B parameters; {one.model_states / num_params:g} bytes/parameter of "
             f"model states ({act['precision']}, {act['optimizer']})"]
    if config is not None:
        tokens = seq_len or getattr(config, "max_position_embeddings", None)
        notes.append(f"activations: micro-batch {micro_batch} × {tokens} tokens per GPU"
                     + (", checkpointed (each layer's input kept, the rest recomputed)" if checkpointing else ""))
        positions = getattr(config, "max_position_embeddings", None)
        if seq_len and positions and seq_len > positions:
            notes.append(f"seq_len={seq_len} is longer than the model's {positions} positions")
        if one.total > c.gpu and one.model_states <= c.gpu:
            # the guide: exhaust the single-GPU techniques before reaching for more GPUs
            line = "model states alone fit one GPU; activations push it over"
            if not checkpointing:
                saved = c.estimate(checkpointing=True)
                line += (f": with activation checkpointing one GPU needs {saved.total / GB:.1f} GB"
                         + (" and it fits" if saved.total <= c.gpu else ""))
            notes.append(line + "; a smaller micro-batch also helps")
    elif micro_batch:
        notes.append("activations not counted: num_params= gives no architecture (give a preset or config)")
    else:
        notes.append("model states only (micro_batch=0): activations come on top")
    if not any(c.fits(r.layout) for r in recs if r.layout):
        notes.append("none of these layouts fits: add GPUs, or save memory (activation checkpointing, "
                     "CPU offload, a smaller micro-batch)")
    if c.gpus_per_node > 8:
        notes.append("TP degree is capped at the GPUs per node: TP's all-reduces need the fast intra-node link")
    return notes
