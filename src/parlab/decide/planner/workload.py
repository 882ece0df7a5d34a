"""A model, its batch and a layout (chapter 07): the FLOPs and bytes of a layer, the layers and weights of each
pipeline stage."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from parlab.lab.checks import positive_int
from parlab.decide.planner.counting import experts_of, layer_tensors_of, root_params
from parlab.decide.planner.layer_bytes import LayerBytes

#: What a :class:`Workload`'s attention keeps for backward (the estimator's ``attention``, chapter 01).
ATTENTIONS = ("sdpa", "eager", "cudnn")
#: How a layer's other ops than its matrix products and attention run (:meth:`Workload.elementwise_bytes`).
ELEMENTWISES = ("eager", "fused")
#: How much of each layer's forward backward runs again.
RECOMPUTES = ("none", "selective", "op", "full")
#: The decoder layers whose matrix products run in Llama's order (q, k, v, o; gate, up, down), which
#: ``recompute="op"`` counts on.
OP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: The training precisions: fp32, mixed precision computing in bf16 or fp16 (chapter 01's estimator's), or
#: ``"fp8"``: bf16 mixed precision whose linear layers' matrix products run in FP8 (:attr:`Workload.fp8_recipe`).
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
#: How FP8 scales its tensors, and the bytes a rank moves per value it casts beyond what the kernel that produced
#: the value moves anyway (:func:`~parlab.decide.planner.terms.fp8_cast_bytes`): the cast is fused into that kernel (Transformer
#: Engine's norm and activation kernels emit FP8; torch.compile fuses torchao's casts), so it writes the FP8 copy,
#: one byte; ``"tensorwise"`` (current scaling: torchao's ``tensorwise``, Transformer Engine's
#: ``Float8CurrentScaling``) also reads the bf16 tensor once more for its amax before the cast can start, 2 + 1;
#: ``"delayed"`` (the scale from earlier steps' amax history: ``DelayedScaling``), ``"rowwise"``, ``"blockwise"``
#: (DeepSeek-V3's 1 × 128 and 128 × 128 tiles) and ``"mxfp8"`` (Blackwell's 32-value blocks) find their scales in
#: the same pass, 1. An assumption of the right order (the fusions are the stacks'), checked only through the FP8
#: rows' fit (``docs/planner.md``).
FP8_RECIPES = {"tensorwise": 3, "delayed": 1, "rowwise": 1, "blockwise": 1, "mxfp8": 1}
#: The dtypes a run may keep and reduce its gradients in (:meth:`Workload.grad_bytes`), bytes each.
GRAD_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Workload(LayerBytes):
    """A model and its batch: ``model`` a transformers config or a ``parlab.decide.advice`` preset name;
    ``global_batch`` sequences of ``seq_len`` tokens per step, ``micro_batch`` of them per forward pass.

    ``attention``: ``"sdpa"`` (a fused kernel: no s × s scores kept; what transformers and torchtitan run,
    FlashAttention-2 on an H100), ``"cudnn"`` (the same, Transformer Engine's cuDNN kernel under Megatron-Core,
    FlashAttention-3's class on an H100: :attr:`GPU.attention_flops`) or ``"eager"`` (the scores kept, as Megatron-LM's 2021-22 softmax kernel did); always named,
    never guessed from the config. ``recompute``: ``"none"``, ``"selective"`` (Korthikanti et al. 2022,
    §5: only the attention core, softmax(QKᵀ)·V, recomputed: its s × s activations never kept, its 4·s·h
    FLOPs per token run again in backward), ``"op"`` (torchtitan's op-level selective checkpointing of a
    Llama layer: its input, every other matrix product's output (q, v, gate, down) and attention's output
    kept; k, o and up recomputed with every elementwise op: :meth:`op_layer_bytes`) or ``"full"`` (every
    layer's forward redone in backward, only its input kept); ``checkpointing=True`` is ``recompute="full"``.
    ``recompute_layers``: with ``"full"``, only that many layers of each model chunk are recomputed, the others kept
    whole (Megatron-Core's ``recompute_method="block"`` with ``recompute_num_layers``). ``sequence_parallel``: the activations
    outside TP's matrix products split over the tp ranks too (Korthikanti et al. 2022, §4.2.2; chapter 05).

    ``precision="fp8"``: the linear layers' matrix products in FP8, scaled by ``fp8_recipe``
    (:data:`FP8_RECIPES`); attention's core, the output layer, the router and everything else stay bf16, as
    Transformer Engine and torchao leave them. ``fp8_gather``: ZeRO-3 gathers the weights already cast to
    FP8, one byte each (torchtitan's ``enable_fsdp_float8_all_gather``, Megatron's ``--fp8-param-gather``).

    ``fused``: the layer's elementwise work runs inside its matrix products' and attention's kernels
    (Transformer Engine under Megatron-Core, torch.compile under torchtitan), so a layer keeps only what those
    kernels need (:meth:`fused_layer_bytes`), not what transformers' eager modules keep (chapter 01).
    ``elementwise``: how the layer's other ops than its products and attention run, ``"eager"`` (each its own
    kernel, reading and writing its tensors: eager PyTorch, transformers) or ``"fused"`` (inside fused kernels:
    ``fused=True``, or the hand-written kernels of Megatron-LM 2021-22); ``None``: ``"fused"`` if ``fused`` else
    ``"eager"`` (:meth:`elementwise_bytes`; left as given, so that ``replace(w, fused=True)`` needs no second
    change).

    A mixture of experts is read from its config (Mixtral, Qwen-MoE, DeepSeek-V3: :attr:`experts`): FLOPs
    count the active experts (top-k, and the shared ones), memory every expert. ``capacity_factor``: each
    expert computes a buffer of ``capacity_factor`` × its even share of the tokens, padded or dropped to it;
    ``None``: dropless (each expert computes exactly its tokens, assumed balanced).

    ``offload_layers``: the activations of that many layers of a rank's stage leave for host memory during
    forward and come back for backward (Megatron-Core's ``cpu_offloading_num_layers``), one of them in flight
    at a time; their transfers are assumed hidden behind the computation.
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
    recompute_layers: int | None = None
    sequence_parallel: bool = False
    fp8_recipe: str = "tensorwise"
    fp8_gather: bool = False
    fused: bool = False
    elementwise: str | None = None
    capacity_factor: float | None = None
    offload_layers: int = 0
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
        kind = getattr(self.config, "model_type", None)
        if self.recompute == "op" and (self.experts or kind not in OP_MODEL_TYPES):
            raise ValueError(f"recompute='op' counts a dense Llama-style layer (model_type one of "
                             f"{', '.join(map(repr, OP_MODEL_TYPES))}); this config is {kind!r}"
                             f"{' with experts' if self.experts else ''}: use 'selective'")
        if not (isinstance(self.offload_layers, int) and 0 <= self.offload_layers < self.layers):
            raise ValueError(f"offload_layers={self.offload_layers!r}: the layers whose activations go to host memory, "
                             f"0 to {self.layers - 1} (fewer than the model's {self.layers}, as Megatron-Core requires)")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"fp8_recipe={self.fp8_recipe!r}; choose one of {', '.join(map(repr, FP8_RECIPES))}")
        if self.capacity_factor is not None and not (self.experts and self.capacity_factor >= 1):
            raise ValueError(f"capacity_factor={self.capacity_factor!r}: at least 1, and only for a mixture of experts "
                             f"(this config has {'experts' if self.experts else 'none'}); None: dropless")
        if self.elementwise not in (None, *ELEMENTWISES) or (self.fused and self.elementwise == "eager"):
            raise ValueError(f"elementwise={self.elementwise!r}; choose 'eager' (each op its own kernel) or 'fused' "
                             f"(inside fused kernels, as always with fused=True), or None (as fused= says)")
        recompute = "full" if self.checkpointing else (self.recompute or "none")
        object.__setattr__(self, "recompute", recompute)
        object.__setattr__(self, "checkpointing", recompute == "full")
        if self.recompute_layers is not None and not (recompute == "full" and type(self.recompute_layers) is int
                                                      and 0 < self.recompute_layers <= self.layers):
            raise ValueError(f"recompute_layers={self.recompute_layers!r}: 1 to {self.layers} layers of each model chunk, "
                             f"with recompute='full' (got {recompute!r}), as Megatron-Core's recompute_num_layers")

    @property
    def layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def value_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def experts(self) -> tuple[int, int, int] | None:
        """(routed experts per MoE layer, experts per token (top-k), parameters of every routed expert of the
        model), read from the config (``num_local_experts``, ``num_experts`` or ``n_routed_experts``;
        ``num_experts_per_tok``) and counted on the meta device; ``None`` for a dense model. Shared experts
        run for every token and count as dense weights."""
        from parlab.lab.measure.activations import config_json

        return experts_of(config_json(self.config))

    @property
    def expert_params(self) -> int:
        """Parameters of every routed expert of the model (0 for a dense model): what ep splits."""
        return self.experts[2] if self.experts else 0

    @property
    def active_fraction(self) -> float:
        """Share of the routed experts' weights each token runs through: k/E (× the capacity factor, whose padding
        is computed too), 1 for a dense model."""
        if not self.experts:
            return 1.0
        num, top_k, _ = self.experts
        return top_k / num * (self.capacity_factor or 1.0)

    @property
    def dense(self):
        """The config the activation estimator reads (chapter 01): the model's own for a dense model; for a
        mixture of experts, its dense twin, a Llama layer of the same shape whose MLP is as wide as the MLPs a
        token runs through (k experts and the shared ones), so that what a token keeps and what its
        memory-bound work moves are counted. An approximation: the router and the permutations are left to
        the ep term, and DeepSeek-V3's latent attention is priced as attention over full heads."""
        if not self.experts:
            return self.config
        if "_dense" not in self.__dict__:  # built once: the planner asks at every prediction
            object.__setattr__(self, "_dense", self._dense_twin())
        return self.__dict__["_dense"]

    def _dense_twin(self):
        from transformers import LlamaConfig

        c, h, heads, (head_dim, _) = self.config, self.hidden, self.heads, self.head_dims
        kv_heads = self.kv_heads if self.kv_heads <= heads else heads
        attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
        mlp = max(1, round((self.active_layer_params - attention) / (3 * h)))
        return LlamaConfig(hidden_size=h, intermediate_size=mlp, num_hidden_layers=self.layers, head_dim=head_dim,
                           num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=c.vocab_size,
                           max_position_embeddings=max(self.seq_len, 2048), tie_word_embeddings=False)

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
        if self.precision not in ("bf16", "fp8"):
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
    def active_layer_params(self) -> float:
        """One layer's weights a token runs through: all of a dense layer's; of a MoE layer its attention, router
        and shared experts, and k of its E routed experts (:attr:`active_fraction`)."""
        return self.layer_params - self.expert_params / self.layers * (1 - self.active_fraction)

    def rank_layer_params(self, layout) -> float:
        """One layer's weights on one rank of ``layout``: the dense ones over tp, the experts over ep × etp."""
        experts = self.expert_params / self.layers
        return (self.layer_params - experts) / layout.tp + experts / (layout.ep * layout.etp)

    @property
    def layer_flops(self) -> float:
        """Forward FLOPs of one layer per token: 2 per weight a token runs through (its matrix products) plus
        attention's scores and weighted sum, 4·s·h (Narayanan et al. 2021, eq. 3: 24·h² + 4·s·h for a GPT
        layer)."""
        return 2 * self.active_layer_params + self.attention_flops

    @property
    def output_flops(self) -> float:
        """Forward FLOPs of the output layer per token, 2·h·V (ibid.; the embedding is a lookup, no FLOPs)."""
        return 2 * self.output_params

    @property
    def layer_tensors(self) -> tuple[int, int]:
        """(parameter tensors of one layer, the largest one's values): what a ZeRO-3 that gathers tensor by
        tensor calls per layer, and what its prefetch buffer must hold."""
        from parlab.lab.measure.activations import config_json

        return layer_tensors_of(config_json(self.config))

    @property
    def heads(self) -> int:
        return getattr(self.config, "num_attention_heads", None) or self.config.n_head

    @property
    def head_dims(self) -> tuple[int, int]:
        """(the query/key head width, the value head width): the config's ``head_dim`` where it names one
        (Qwen3, GPT-OSS: heads × head_dim need not be h), DeepSeek-V3's latent attention's ``qk_head_dim`` and
        ``v_head_dim`` (192, 128), else h / heads."""
        c = self.config
        if getattr(c, "qk_head_dim", None):
            return c.qk_head_dim, c.v_head_dim
        width = getattr(c, "head_dim", None) or self.hidden // self.heads
        return width, width

    @property
    def attention_flops(self) -> float:
        """Forward FLOPs per token of one layer's attention core, QKᵀ and the weighted sum of V: 2·s·a·(d_qk + d_v),
        4·s·h when the a heads of width d span h."""
        return 2 * self.seq_len * self.heads * sum(self.head_dims)

    def model_flops(self) -> float:
        """Model FLOPs of one step: forward and backward (3 × forward) of every layer and the output layer, for
        every token of the global batch; no recomputation (what MFU counts)."""
        return 3 * self.global_batch * self.seq_len * (self.layers * self.layer_flops + self.output_flops)

    def hardware_flops(self, chunks: int = 1) -> float:
        """FLOPs the GPUs execute in one step: the model's, plus the layers' forward again when activations are
        recomputed (what HFU counts; Narayanan et al. 2021's eq. 3, 96·B·s·l·h²·(1 + s/6h + V/16lh)); under
        ``recompute_layers``, that many layers of each of a layout's ``chunks`` model chunks (pp × vp)."""
        from parlab.decide.planner.recompute import recomputed_layers

        redo = recomputed_layers(self, self.layers, chunks)
        return self.model_flops() + self.global_batch * self.seq_len * (redo * self.recompute_flops
                                                                        + self.layers * self.fused_backward_flops)

    @property
    def fused_backward_flops(self) -> float:
        """FLOPs per token and layer a fused attention kernel's backward adds to twice its forward: it keeps no
        scores, so it recomputes QKᵀ: five matrix products against the forward's two, 2.5 × the forward
        (Dao 2023, FlashAttention-2, §3.1.2; MosaicML's llm-foundry ``scripts/train/benchmarking/README.md``
        counts differently: recomputation would make "the attention multiplier 5 instead of 4", one more
        forward, left out of its HFU). 0 for eager."""
        return 0.5 * self.attention_flops if self.attention != "eager" else 0.0

    @property
    def recompute_flops(self) -> float:
        """FLOPs per token and layer that backward runs again: the whole forward (full), or the attention
        core's QKᵀ and weighted sum once more, 4·s·h (selective: Korthikanti et al. 2022, Appendix A, "an
        additional forward pass attention matrix computation (2Bs²h) and attention over values (2Bs²h)"), or
        none. Counted so, selective recomputation adds 0.9 % to GPT-3's model FLOPs. The paper's "only 2.7 %
        and 1.6 % FLOPs overhead" for GPT-3 and MT-NLG (§5) is its eq. 8 ÷ eq. 7 − 1, and eq. 8 adds
        72·B·L·s·h²·s/6h = 12·B·s²·h per layer: three times the 4·B·s²·h its text adds. What it costs in
        time is Table 4's: 7 % of a 22B layer's forward and backward, 4 % with SP (the softmax and dropout
        it reruns are memory-bound, not FLOPs). Per layer that recomputes (:meth:`hardware_flops` counts them)."""
        if self.recompute == "op":
            return self.op_recompute_flops
        return {"full": self.layer_flops, "selective": self.attention_flops, "none": 0.0}[self.recompute]

    @property
    def op_recompute_flops(self) -> float:
        """FLOPs per token and layer ``recompute="op"`` runs again: the three matrix products whose outputs it
        does not keep (every second one: k, o and up), 2·(h·g·d_qk + a·d_v·h + h·f)."""
        h, f, (qk, v) = self.hidden, self.dense.intermediate_size, self.head_dims
        return 2 * (h * self.kv_heads * qk + self.heads * v * h + h * f)
