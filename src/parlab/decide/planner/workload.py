"""A model, its batch and a layout (chapter 07): the FLOPs and bytes of a layer, the layers and weights of each
pipeline stage."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field

from parlab.lab.checks import positive_int
from parlab.lab.topology import Topology

#: What a :class:`Workload`'s attention keeps for backward (the estimator's ``attention``, chapter 01).
ATTENTIONS = ("sdpa", "eager")
#: How much of each layer's forward backward runs again.
RECOMPUTES = ("none", "selective", "full")
#: The training precisions (chapter 01's estimator's): fp32, or mixed precision computing in bf16 or fp16.
PRECISIONS = ("bf16", "fp16", "fp32")
#: The dtypes a run may keep and reduce its gradients in (:meth:`Workload.grad_bytes`), bytes each.
GRAD_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}


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


@dataclass(frozen=True)
class Workload:
    """A model and its batch: ``model`` a transformers config or a ``parlab.decide.advice`` preset name;
    ``global_batch`` sequences of ``seq_len`` tokens per step, ``micro_batch`` of them per forward pass.

    ``attention``: ``"sdpa"`` (a fused kernel: no s × s scores kept; what transformers and every current
    stack runs) or ``"eager"`` (the scores kept, as Megatron-LM's 2021-22 softmax kernel did); always named,
    never guessed from the config. ``recompute``: ``"none"``, ``"selective"`` (Korthikanti et al. 2022,
    §5: only the attention core, softmax(QKᵀ)·V, recomputed: its s × s activations never kept, its 4·s·h
    FLOPs per token run again in backward) or ``"full"`` (every layer's forward redone in backward, only its
    input kept); ``checkpointing=True`` is ``recompute="full"``. ``sequence_parallel``: the activations
    outside TP's matrix products split over the tp ranks too (Korthikanti et al. 2022, §4.2.2; chapter 05).
    """

    model: object
    global_batch: int
    seq_len: int
    micro_batch: int = 1
    precision: str = "bf16"
    optimizer: str = "adam"
    checkpointing: bool = False
    attention: str = "sdpa"
    recompute: str | None = None
    sequence_parallel: bool = False
    num_params: int = field(init=False)
    root_params: int = field(init=False)
    config: object = field(init=False, repr=False)

    def __post_init__(self):
        from parlab.decide.advice import preset
        from parlab.lab.measure import count_params

        config = preset(self.model) if isinstance(self.model, str) else self.model
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "num_params", count_params(config))
        object.__setattr__(self, "root_params", root_params(config))
        positive_int("global_batch", self.global_batch, "sequences per step")
        positive_int("seq_len", self.seq_len, "tokens per sequence")
        positive_int("micro_batch", self.micro_batch, "sequences per forward pass")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r}; choose one of {', '.join(map(repr, PRECISIONS))} "
                             f"(fp32, or mixed precision with 16-bit bf16 or fp16 compute)")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention={self.attention!r}; choose one of {', '.join(map(repr, ATTENTIONS))} "
                             f"(sdpa: fused, no s × s scores kept; eager: the scores kept, as 2021-22 Megatron-LM)")
        if self.recompute is not None and self.recompute not in RECOMPUTES:
            raise ValueError(f"recompute={self.recompute!r}; choose one of {', '.join(map(repr, RECOMPUTES))}")
        if self.checkpointing and self.recompute not in (None, "full"):
            raise ValueError(f"checkpointing=True means recompute='full'; got recompute={self.recompute!r} too")
        recompute = "full" if self.checkpointing else (self.recompute or "none")
        object.__setattr__(self, "recompute", recompute)
        object.__setattr__(self, "checkpointing", recompute == "full")

    @property
    def layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def value_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    def grad_bytes(self, implementation: str, zero_stage: int = 0, grad_dtype: str | None = None) -> int:
        """Bytes of one gradient value as the run keeps and reduces it: ``grad_dtype`` (one of
        :data:`GRAD_DTYPES`) where the run names it, since frameworks differ and each has a switch
        (Megatron-Core's ``DistributedDataParallelConfig.grad_reduce_in_fp32``, default off; Megatron-LM's
        ``--grad-reduce-in-bf16``; FSDP2's ``MixedPrecisionPolicy.reduce_dtype``); fp32 training keeps fp32
        whatever is asked. ``None``: ``implementation``'s default under ZeRO ``zero_stage``:
        Megatron-LM in bf16 forces fp32 (its ``arguments.py``: "bfloat16 requires gradient accumulation and
        all-reduce to be done in fp32", setting ``accumulate_allreduce_grads_in_fp32``), and in fp16 keeps them
        in fp16 (the flag's default is off: Narayanan et al. 2021's ``--fp16`` runs). DeepSpeed in bf16 at
        stage 0 or 1 runs its ``BF16_Optimizer`` (``deepspeed/runtime/bf16_optimizer.py``, what BLOOM's tr11
        ran under Megatron-DeepSpeed): gradients accumulate into fp32 copies (``fp32_groups_gradients``),
        which are what it all-reduces (``get_grads_for_reduction``); at stages 2 and 3, and in fp16, DeepSpeed
        keeps and reduces them in the compute dtype, as the course does."""
        if grad_dtype is not None and grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"grad_dtype={grad_dtype!r}; choose one of {', '.join(map(repr, GRAD_DTYPES))}, or "
                             f"None for the implementation's default")
        if self.precision == "fp32":
            return 4
        if grad_dtype is not None:
            return GRAD_DTYPES[grad_dtype]
        if self.precision != "bf16":
            return self.value_bytes
        return 4 if implementation == "megatron" or implementation == "deepspeed" and zero_stage <= 1 else 2

    @property
    def kv_heads(self) -> int:
        """The K/V heads of a layer's attention: fewer than the query heads under grouped-query attention
        (Llama 2 70B: 8 for 64), read from the config (``num_key_value_heads``), else the query heads."""
        config = self.config
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        return getattr(config, "num_key_value_heads", None) or heads

    def tp_refusal(self, tp: int) -> str | None:
        """Why ``tp`` tensor-parallel ranks cannot split this model's attention, or ``None``: Megatron's
        column split gives each rank whole query heads and whole K/V heads, so tp must divide both
        (Megatron-Core asserts ``num_query_groups % tensor_model_parallel_size == 0``). With fewer K/V heads
        than ranks the K/V projections would be copied, not split, and neither their weights nor their
        activations would shrink 1/tp as the planner counts them."""
        heads = getattr(self.config, "num_attention_heads", None) or self.config.n_head
        if heads % tp or self.kv_heads % tp:
            return (f"tp={tp} does not divide the {heads} query heads and {self.kv_heads} K/V heads of this "
                    f"model (grouped-query attention: Megatron-Core needs num_query_groups % tp == 0); choose a tp "
                    f"that divides {math.gcd(heads, self.kv_heads)}")
        return None

    @property
    def output_params(self) -> int:
        """The output layer's weights, vocabulary × hidden (tied to the embedding or not)."""
        return self.config.vocab_size * self.hidden

    @property
    def layer_params(self) -> float:
        """One layer's weights: what the stack of layers holds, over its layers."""
        return (self.num_params - self.root_params) / self.layers

    @property
    def layer_flops(self) -> float:
        """Forward FLOPs of one layer per token: 2 per weight (its matrix products) plus attention's scores and
        weighted sum, 4·s·h (Narayanan et al. 2021, eq. 3: 24·h² + 4·s·h for a GPT layer)."""
        return 2 * self.layer_params + self.attention_flops

    @property
    def output_flops(self) -> float:
        """Forward FLOPs of the output layer per token, 2·h·V (ibid.; the embedding is a lookup, no FLOPs)."""
        return 2 * self.output_params

    def layer_bytes(self, tp: int = 1) -> float:
        """Bytes one layer's forward saves for backward on one of ``tp`` ranks (chapter 01's estimator, for this
        architecture and ``attention``: eager keeps the s × s scores, sdpa does not). The layer's other work
        than its matrix products (norms, softmax, dropout, activation function, residual adds) reads and
        writes about these bytes, and is bound by memory bandwidth, not FLOPs: :func:`predict` prices it so.
        Under ``sequence_parallel`` that work is split over the tp ranks too, as its activations are."""
        from parlab.lab.measure.activations import config_json

        return _layer_bytes(config_json(self.config), self.kept_attention, self.seq_len, self.micro_batch,
                            self.value_bytes, tp, self.sequence_parallel and tp > 1)

    @property
    def layer_tensors(self) -> tuple[int, int]:
        """(parameter tensors of one layer, the largest one's values): what a ZeRO-3 that gathers tensor by
        tensor calls per layer, and what its prefetch buffer must hold."""
        from parlab.lab.measure.activations import config_json

        return _layer_tensors(config_json(self.config))

    @property
    def kept_attention(self) -> str:
        """What the attention keeps for backward: selective recomputation keeps what a fused kernel keeps."""
        return "sdpa" if self.recompute == "selective" else self.attention

    @property
    def attention_flops(self) -> float:
        """Forward FLOPs per token of one layer's attention core, QKᵀ and the weighted sum of V: 4·s·h."""
        return 4 * self.seq_len * self.hidden

    def model_flops(self) -> float:
        """Model FLOPs of one step: forward and backward (3 × forward) of every layer and the output layer, for
        every token of the global batch; no recomputation (what MFU counts)."""
        return 3 * self.global_batch * self.seq_len * (self.layers * self.layer_flops + self.output_flops)

    def hardware_flops(self) -> float:
        """FLOPs the GPUs execute in one step: the model's, plus the layers' forward again when activations are
        recomputed (what HFU counts; Narayanan et al. 2021's eq. 3, 96·B·s·l·h²·(1 + s/6h + V/16lh))."""
        return self.model_flops() + self.global_batch * self.seq_len * self.layers * (self.recompute_flops
                                                                                        + self.fused_backward_flops)

    @property
    def fused_backward_flops(self) -> float:
        """FLOPs per token and layer a fused attention kernel's backward adds to twice its forward: it keeps no
        scores, so it recomputes QKᵀ: five matrix products against the forward's two, 2.5 × the forward
        (Dao 2023, FlashAttention-2, §3.1.2; MosaicML's llm-foundry ``scripts/train/benchmarking/README.md``
        counts differently: recomputation would make "the attention multiplier 5 instead of 4", one more
        forward, left out of its HFU). 0 for eager."""
        return 0.5 * self.attention_flops if self.attention == "sdpa" else 0.0

    @property
    def recompute_flops(self) -> float:
        """FLOPs per token and layer that backward runs again: the whole forward (full), or the attention
        core's QKᵀ and weighted sum once more, 4·s·h (selective: Korthikanti et al. 2022, Appendix A, "an
        additional forward pass attention matrix computation (2Bs²h) and attention over values (2Bs²h)"), or
        none. Counted so, selective recomputation adds 0.9 % to GPT-3's model FLOPs. The paper's "only 2.7 %
        and 1.6 % FLOPs overhead" for GPT-3 and MT-NLG (§5) is its eq. 8 ÷ eq. 7 − 1, and eq. 8 adds
        72·B·L·s·h²·s/6h = 12·B·s²·h per layer: three times the 4·B·s²·h its text adds. What it costs in
        time is Table 4's: 7 % of a 22B layer's forward and backward, 4 % with SP (the softmax and dropout
        it reruns are memory-bound, not FLOPs)."""
        return {"full": self.layer_flops, "selective": self.attention_flops, "none": 0.0}[self.recompute]


@functools.cache
def _layer_tensors(config_json: str) -> tuple[int, int]:
    from torch import nn

    from parlab.lab.measure.activations import meta_model

    stacks = [m for m in meta_model(config_json).modules() if isinstance(m, nn.ModuleList)]
    layer = max(stacks, key=lambda m: sum(p.numel() for p in m.parameters()))[0]
    sizes = [p.numel() for p in layer.parameters()]
    return len(sizes), max(sizes)


@functools.cache
def _layer_bytes(config_json: str, attention, seq_len: int, micro_batch: int, value_bytes: int, tp: int,
                 sequence_parallel: bool = False) -> float:
    from transformers import AutoConfig

    from parlab.lab.measure.activations import layer_terms
    from parlab.lab.measure.memory import architecture

    config = AutoConfig.for_model(**json.loads(config_json))
    arch = architecture(config, attention=attention)
    return sum(t.per_rank(tp, sequence_parallel) for t in layer_terms(arch, seq_len, micro_batch, value_bytes, "cuda"))


def stage_layers(workload: Workload, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage, first to last, as evenly as the slowest stage allows: the last stage also
    runs the output layer (:attr:`Workload.output_flops`, as many layers' worth of FLOPs as it costs), so it
    may take fewer layers; every stage at least one. Real pipelines split unevenly too (BLOOM: 70 layers on
    12 stages, Megatron-DeepSpeed's ``--pp-partition-method``; Megatron-LM's
    ``--decoder-last-pipeline-num-layers``)."""
    layers = workload.layers
    pp = positive_int("pp", pp, "pipeline stages")
    if pp > layers:
        raise ValueError(f"pp={pp} stages for {layers} layers: every stage needs at least one layer")
    if pp == 1:
        return (layers,)
    out = workload.output_flops / workload.layer_flops  # the output layer, in layers

    def slowest(last):
        rest = layers - last
        return max(-(-rest // (pp - 1)), last + out)

    last = min((n for n in range(1, layers - pp + 2)), key=lambda n: (slowest(n), -n))
    q, r = divmod(layers - last, pp - 1)
    return tuple([q] * (pp - 1 - r) + [q + 1] * r + [last])


def stage_params(workload: Workload, pp: int) -> tuple[float, ...]:
    """Weights per stage: its layers; the first also the embedding (and whatever else of the root is not the
    output layer), the last the output layer and final norm (a copy of the embedding when the two are tied,
    as Megatron-LM keeps one on each end)."""
    w, per_stage = workload, stage_layers(workload, pp)
    tied = getattr(w.config, "tie_word_embeddings", False)
    first_end = w.root_params - (0 if tied else w.output_params)
    if pp == 1:
        return (w.num_params,)
    params = [n * w.layer_params for n in per_stage]
    params[0] += first_end
    params[-1] += w.output_params
    return tuple(params)


@dataclass(frozen=True)
class Layout:
    """Sizes of the mesh's axes and the ZeRO stage of its data-parallel axis (0: plain DDP)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0

    @property
    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, pp=self.pp)

    def __str__(self) -> str:
        axes = [f"{name} {size}" for name, size in (("TP", self.tp), ("PP", self.pp), ("DP", self.dp)) if size > 1]
        zero = f" + ZeRO-{self.zero_stage}" if self.zero_stage and self.dp > 1 else ""
        return (" × ".join(axes) or "1 GPU") + zero
