"""The guide's decision rules, as a plain function: which strategy for this model on this hardware (chapter 01).

Hugging Face's "Efficient Training on Multiple GPUs" closes with a short decision guide (summarised in
the course's ``shared/source/README.md``): estimate memory first; then

- **one node**, the model fits one GPU → DDP; ZeRO may be faster or slower, so measure;
- **one node**, it does not fit → PP, ZeRO or TP; with NVLink/NVSwitch the three perform alike, over
  PCIe PP is fastest; a TP degree above the GPUs in one node is never advised;
- the **largest layer** does not fit one GPU → TP (not PP, which cannot split a layer), or ZeRO-3 with
  the single-GPU techniques (offload, checkpointing);
- **several nodes**, fast inter-node links → ZeRO (almost no model changes) or PP+TP+DP (less
  communication, many model changes); slow links and little GPU memory → DP+PP+TP+ZeRO-1.

:func:`recommend` applies these rules to numbers from :func:`parlab.measure.estimate_memory` and returns
an :class:`Advice`: the ordered recommendations with the guide's reason for each, and the memory per GPU
of every candidate layout (for :func:`parlab.plots.memory_bars`). ``parlab.widgets.strategy_tool`` is
the same function behind sliders.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from torch import nn

from parlab.checks import positive_int
from parlab.measure.memory import GB, MemoryEstimate, estimate_memory

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


def _shape(config) -> tuple[int, int]:
    """(Ψ, parameters of the largest single layer), counted on the meta device."""
    return _shape_of_json(config.to_json_string())


@functools.cache  # a widget asks again at every slider move; configs are not hashable
def _shape_of_json(config_json: str) -> tuple[int, int]:
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@dataclass(frozen=True)
class Recommendation:
    strategy: str
    reason: str
    layout: str | None = None  # the key in Advice.memory of the layout it stands for (None: "measure")


@dataclass(frozen=True)
class Advice:
    recommendations: list[Recommendation]
    memory: dict[str, MemoryEstimate]   # per-GPU estimate of each candidate layout
    gpu_memory: float                   # bytes
    fits_one_gpu: bool
    largest_layer_fits: bool
    notes: list[str] = field(default_factory=list)

    def fits(self, rec: Recommendation) -> bool | None:
        return None if rec.layout is None else self.memory[rec.layout].total <= self.gpu_memory

    def __str__(self) -> str:
        lines = []
        for i, r in enumerate(self.recommendations, 1):
            line = f"{i}. {r.strategy}: {r.reason}"
            if r.layout is not None:
                need = self.memory[r.layout].total / GB
                verdict = "fits" if self.fits(r) else "does NOT fit"
                line += f" [{need:.1f} GB per GPU: {verdict} in {self.gpu_memory / GB:g} GB]"
            lines.append(line)
        return "\n".join(lines + [f"   ({n})" for n in self.notes])


def _check(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")


def recommend(model=None, *, num_params: int | None = None, largest_layer_params: int | None = None,
              gpu_memory_gb: float = 80, gpus_per_node: int = 8, nodes: int = 1,
              intra_node: str = "nvlink", inter_node: str = "fast", precision: str = "bf16",
              optimizer: str = "adam", micro_batch: int = 0, seq_len: int | None = None) -> Advice:
    """Apply the guide's rules. ``model``: a transformers config, a preset name, or an ``nn.Module``;
    or give ``num_params`` (and optionally ``largest_layer_params``). ``micro_batch > 0`` adds
    activations (needs a config). Sizes in decimal GB (10⁹ bytes), as GPU vendors state them."""
    _check("intra_node", intra_node, INTRA_NODE)
    _check("inter_node", inter_node, INTER_NODE)
    positive_int("gpus_per_node", gpus_per_node, "GPUs in each node")
    positive_int("nodes", nodes, "machines")
    if not gpu_memory_gb or gpu_memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb={gpu_memory_gb!r} must be a positive number of GB")
    if isinstance(model, str):
        model = preset(model)
    if model is not None and not isinstance(model, nn.Module):
        num_params, largest_layer_params = _shape(model)
    elif isinstance(model, nn.Module):
        num_params = sum(p.numel() for p in model.parameters())
        largest_layer_params = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    if num_params is None:
        raise ValueError("give model= (a transformers config, preset name or nn.Module) or num_params=")
    largest_layer_params = largest_layer_params or 0
    config = model if model is not None and not isinstance(model, nn.Module) else None
    act = dict(model=config) if config is not None else dict(num_params=num_params)
    act.update(precision=precision, optimizer=optimizer, micro_batch=micro_batch if config else 0,
               seq_len=seq_len)
    gpu = gpu_memory_gb * GB
    total = gpus_per_node * nodes

    def est(**kw):
        return estimate_memory(**act, **kw)

    one = est()
    fits_one = one.total <= gpu
    per_param = (one.params + one.grads + one.optimizer) / num_params
    layer_fits = largest_layer_params * per_param <= gpu
    memory = {"1 GPU": one, f"DDP ×{total}": est(world_size=total)}
    for stage in (1, 2, 3):
        memory[f"ZeRO-{stage} ×{total}"] = est(world_size=total, zero_stage=stage)
    memory[f"PP {gpus_per_node} × DP {nodes}"] = est(world_size=total, pp_size=gpus_per_node)
    memory[f"TP {gpus_per_node} × DP {nodes}"] = est(world_size=total, tp_size=gpus_per_node)
    three_d = None
    if nodes > 1:
        # 3D: TP inside a node, pipeline stages across nodes (at least 2, so that only activations cross the
        # inter-node links), the fewest that make it fit, DP for the rest
        for pp in (d for d in range(2, nodes + 1) if nodes % d == 0):
            three_d = (pp, est(world_size=total, tp_size=gpus_per_node, pp_size=pp, zero_stage=1))
            if three_d[1].total <= gpu:
                break
        memory[f"TP {gpus_per_node} × PP {three_d[0]} × DP {nodes // three_d[0]} + ZeRO-1"] = three_d[1]

    recs: list[Recommendation] = []
    ddp, z3 = f"DDP ×{total}", f"ZeRO-3 ×{total}"
    pp_label, tp_label = f"PP {gpus_per_node} × DP {nodes}", f"TP {gpus_per_node} × DP {nodes}"
    if not layer_fits:
        recs.append(Recommendation(tp_label, "the largest layer does not fit one GPU: only tensor parallelism "
                                   "splits a layer (pipeline parallelism moves whole layers)", tp_label))
        recs.append(Recommendation(z3 + " + offload/checkpointing", "with ZeRO, add the single-GPU "
                                   "techniques (CPU offload, activation checkpointing)", z3))
    elif nodes == 1:
        if fits_one:
            recs.append(Recommendation(ddp, "the model fits one GPU: replicate it and all-reduce gradients",
                                       ddp))
            recs.append(Recommendation(f"ZeRO ×{total}", "may be faster or slower than DDP: measure both on "
                                       "your setup", None))
        elif intra_node == "nvlink":
            for label in (pp_label, z3, tp_label):
                recs.append(Recommendation(label, "does not fit one GPU; with NVLink/NVSwitch inside the node "
                                           "PP, ZeRO and TP perform about alike", label))
        else:
            recs.append(Recommendation(pp_label, "does not fit one GPU and the GPUs talk over PCIe: pipeline "
                                       "parallelism, which sends only activations between stages, is fastest",
                                       pp_label))
            recs.append(Recommendation(z3, "also possible over PCIe, but its all-gathers of weights at every "
                                       "step make it slower than PP there", z3))
    else:
        three_label = next(k for k in memory if k.startswith(f"TP {gpus_per_node} × PP"))
        if inter_node == "fast":
            recs.append(Recommendation(z3 if not fits_one else f"ZeRO ×{total}", "fast links between nodes: "
                                       "ZeRO needs almost no changes to the model", z3))
            recs.append(Recommendation(three_label, "less communication than ZeRO, but the model must be "
                                       "rewritten for TP and PP (ZeRO-1 optional)", three_label))
        else:
            recs.append(Recommendation(three_label, "slow links between nodes: TP inside nodes, PP across them "
                                       "(only activations cross the slow links), DP over the rest, ZeRO-1 to "
                                       "shard optimizer states", three_label))
        if fits_one:
            recs.insert(0, Recommendation(ddp, "the model fits one GPU: plain data parallelism is the simplest "
                                          "start", ddp))
    notes = [f"Ψ = {num_params / 1e9:.3g} B parameters; {per_param:g} bytes/parameter of model states "
             f"({precision}, {optimizer}); one GPU needs {one.total / GB:.1f} GB of {gpu_memory_gb:g} GB"]
    if not any(Advice(recs, memory, gpu, fits_one, layer_fits).fits(r) for r in recs if r.layout):
        notes.append("none of these layouts fits: add GPUs, or save memory (activation checkpointing, "
                     "CPU offload, a smaller micro-batch)")
    if gpus_per_node > 8:
        notes.append("TP degree is capped at the GPUs per node: TP's all-reduces need the fast intra-node link")
    return Advice(recs, memory, gpu, fits_one, layer_fits, notes)
