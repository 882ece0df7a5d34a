"""What a transformer's forward pass saves for its backward pass, term by term, read from its config (chapter 01).

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.1) count the
activations of one GPT layer with dropout, in 16-bit training: ``s·b·h·(34 + 5·a·s/h)`` bytes. Real models
differ from that layer, and each difference changes the count:

- no dropout (Llama, BLOOM): no masks and no dropout outputs;
- a gated MLP (Llama's SwiGLU) of width ``intermediate_size`` instead of a 4h GeLU MLP;
- RMSNorm written in Python with an fp32 upcast (Llama) instead of a fused LayerNorm;
- the attention softmax computed in fp32 and cast back (Llama, BLOOM in their eager attention);
- fused attention (PyTorch's ``scaled_dot_product_attention``, FlashAttention) that keeps no ``s × s`` scores;
- an activation function written as several PyTorch ops (GPT-2's ``gelu_new``), each saving a tensor.

:class:`Architecture` reads these choices from a transformers config; :func:`layer_terms` and
:func:`end_terms` list every tensor one layer (and the model's two ends) keep, each as a :class:`Term`
with its size, its bytes per element and the source that says it is kept. Sizes are storages, as
:func:`parlab.lab.measure.measure_activations` counts them. What is left out is named in :func:`left_out`.

Symbols: ``s`` sequence length, ``b`` micro-batch, ``h`` hidden size, ``a`` attention heads, ``i`` MLP
width, ``t`` tensor-parallel degree; ``d`` bytes of a value in the training dtype, ``m`` bytes of a
dropout mask: 1 on GPUs, where ``dropout`` is the fused ``native_dropout`` with a bool mask, and ``d`` on
CPU, where it multiplies by a noise tensor of the input's dtype (PyTorch ``aten/src/ATen/native/
Dropout.cpp``: ``is_fused_kernel_acceptable`` is true for CUDA tensors only, else ``_dropout_impl``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch


KORTHIKANTI = "Korthikanti et al. 2022, §4.1"
HF = "transformers"  # the model's own source (models/<family>/modeling_<family>.py)
#: model_type -> family. A family fixes how norms, attention and the MLP are written in transformers.
FAMILIES = {"gpt2": "gpt2", "bloom": "bloom", "llama": "llama", "mistral": "llama", "qwen2": "llama"}
ATTENTIONS = ("eager", "sdpa")
DEVICES = ("cuda", "cpu")
DTYPES = {4: torch.float32, 2: torch.bfloat16}
#: Under ``torch.autocast`` (fp32 weights, bf16 compute), measured activations ÷ the bf16 estimate: the range
#: seen on chapter 01's tiny GPT-2 (with and without dropout), Llama and BLOOM at 16 to 512 tokens. It depends
#: on how much of the activations are the s × s scores (an fp32 softmax under autocast) and on the bf16
#: weight copies, a fixed cost that small sequences feel most; chapter 01 (under the hood, B) checks it.
AUTOCAST_VS_BF16 = (1.0, 2.3)


@dataclass(frozen=True)
class Term:
    """One tensor (or kind of tensor) kept for backward: ``numel`` elements of ``bytes_each`` bytes.

    ``tp``: how tensor parallelism divides it: ``"split"`` (every rank keeps 1/t: inside the attention and
    the MLP), ``"sp"`` (kept whole on every rank unless sequence parallelism splits the sequence),
    ``"none"`` (never divided). ``source`` says why it is kept.
    """

    name: str
    numel: int
    bytes_each: float
    source: str
    tp: str = "split"

    @property
    def bytes(self) -> float:
        return self.numel * self.bytes_each

    def per_rank(self, tp_size: int = 1, sequence_parallel: bool = False) -> float:
        if self.tp == "split" or (self.tp == "sp" and sequence_parallel):
            return self.bytes / tp_size
        return self.bytes


@dataclass(frozen=True)
class Architecture:
    """The choices of a decoder-only transformer that decide what its layers save.

    ``family``: ``"gpt"`` (Korthikanti's GPT layer, counted exactly as the paper does: without
    LayerNorm's per-token statistics; the default for a model without a known config),
    ``"gpt2"``, ``"llama"`` (also Mistral, Qwen2) or ``"bloom"``. Build it with :meth:`from_config`.
    """

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    gated_mlp: bool
    norm: str  # "layernorm" (fused, ATen's native_layer_norm) or "rmsnorm" (Llama's, in Python)
    activation: str  # a transformers ACT2FN name, or "bloom" (BLOOM's own GeLU)
    attention: str  # "eager" (scores kept) or "sdpa" (fused: scores recomputed in backward)
    softmax_fp32: bool  # eager attention takes the softmax in fp32, then casts back (Llama, BLOOM)
    attn_dropout: float
    resid_dropout: float
    embd_dropout: float
    embedding_norm: bool = False  # BLOOM's word_embeddings_layernorm
    rotary: bool = False  # Llama's rotary embedding: one cos and one sin table for all layers
    vocab: int | None = None
    #: the MLP's activation module itself, when the estimate is for a built model: probed instead of the
    #: config's name, in case the model's code and its config disagree (a swapped activation)
    activation_fn: object = field(default=None, compare=False, repr=False)

    @classmethod
    def gpt(cls, hidden: int, layers: int, heads: int, vocab: int | None = None, dropout: bool = True,
            attention: str = "eager") -> "Architecture":
        """Korthikanti et al.'s GPT layer: LayerNorm, a 4h GeLU MLP, dropout after attention scores and
        after both projections back to h (probability 0.1 as in GPT-2; the value only matters if 0)."""
        p = 0.1 if dropout else 0.0
        return cls("gpt", hidden, layers, heads, heads, 4 * hidden, False, "layernorm", "gelu", attention,
                   False, p, p, 0.0, vocab=vocab)

    @classmethod
    def from_config(cls, config, attention: str | None = None, dropout: bool | None = None) -> "Architecture":
        """Read the architecture of a transformers config (GPT-2, Llama/Mistral/Qwen2 or BLOOM).

        attention: ``"eager"`` or ``"sdpa"``; ``None`` takes the one transformers would use for this config
        (its ``_attn_implementation`` if set, else what building the model picks). dropout: ``None`` reads
        the probabilities from the config; ``False`` sets them all to 0 (as a model in ``eval()`` would
        have none, or a config with them at 0).
        """
        family = FAMILIES.get(getattr(config, "model_type", None))
        if family is None:
            raise ValueError(f"config of model_type={getattr(config, 'model_type', None)!r} is not one the "
                             f"estimator reads; known: {', '.join(sorted(FAMILIES))}. Give hidden=, layers=, "
                             f"heads= instead for Korthikanti et al.'s GPT layer")
        attention = attention or _attention_of(config)
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r} is not modelled; choose one of {', '.join(ATTENTIONS)} "
                             f"(flash_attention_2 keeps what sdpa keeps)")
        c = config
        if family == "gpt2":
            arch = cls("gpt2", c.n_embd, c.n_layer, c.n_head, c.n_head, c.n_inner or 4 * c.n_embd, False,
                       "layernorm", c.activation_function, attention, False, c.attn_pdrop, c.resid_pdrop,
                       c.embd_pdrop, vocab=c.vocab_size)
        elif family == "bloom":
            arch = cls("bloom", c.hidden_size, c.n_layer, c.n_head, c.n_head, 4 * c.hidden_size, False,
                       "layernorm", "bloom", "eager", True, c.attention_dropout, c.hidden_dropout, 0.0,
                       embedding_norm=True, vocab=c.vocab_size)
        else:
            arch = cls("llama", c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                       getattr(c, "num_key_value_heads", None) or c.num_attention_heads, c.intermediate_size,
                       True, "rmsnorm", c.hidden_act, attention, True, getattr(c, "attention_dropout", 0.0),
                       0.0, 0.0, rotary=True, vocab=c.vocab_size)
        if dropout is False:
            arch = replace(arch, attn_dropout=0.0, resid_dropout=0.0, embd_dropout=0.0)
        return arch


def _attention_of(config) -> str:
    chosen = getattr(config, "_attn_implementation", None)
    if chosen is None:
        chosen = _default_attention(config_json(config))
    return "sdpa" if chosen in ("sdpa", "flash_attention_2", "flash_attention_3") else chosen


_JSON_OF: dict[tuple, str] = {}  # (the config's class, repr of its attributes) -> its JSON


def config_json(config) -> str:
    """``config.to_json_string()``, the key of every cache here that is keyed by a config, made once per
    class and attributes. The planner asks for it thousands of times per search, and transformers builds a
    default config to diff against at each call (0.7 ms; the repr of the attributes takes 0.03 ms)."""
    key = (type(config), repr(vars(config)))  # a changed attribute, a nested one too, is another key
    text = _JSON_OF.get(key)
    if text is None:
        if len(_JSON_OF) >= 256:
            _JSON_OF.clear()
        text = _JSON_OF[key] = config.to_json_string()
    return text


# building a large model on the meta device takes seconds, and the strategy tool asks again at every move;
# configs are not hashable, their JSON is
@functools.lru_cache(maxsize=16)
def meta_model(config_json: str):
    """The model transformers builds for a config (given as its JSON), on the meta device: shapes, no
    storage, nothing downloaded. Built from the JSON, so nothing is written into the caller's config. Cached and
    shared: read it, do not run it (:func:`build_meta_model` builds one of your own)."""
    return build_meta_model(config_json)


def build_meta_model(config_json: str, dtype=None, **changes):
    """A new model, as :func:`meta_model` builds it, of ``dtype`` (transformers' default if ``None``), its config's
    attributes ``changes`` set first (``num_hidden_layers=1``)."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    for name, value in changes.items():
        setattr(config, name, value)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, **({"dtype": dtype} if dtype else {}))


def _default_attention(config_json: str) -> str:
    """The attention transformers picks for a config that names none (it prefers sdpa where supported)."""
    return meta_model(config_json).config._attn_implementation


@functools.cache
def activation_saves(name: str, bytes_per_value: int) -> tuple[float, bool]:
    """(bytes saved per element, whether the output is among them) for an activation function, measured.

    The function is run once on a small tensor under ``saved_tensors_hooks``: native ``gelu`` and ``silu``
    save their input (``d`` bytes per element), ``relu`` its output, GPT-2's ``gelu_new`` — written as
    ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` in Python — four tensors of the input's size (``x``,
    the ``tanh``, ``0.5·x`` and ``1 + tanh``: ``4d``).
    """
    if name == "bloom":
        from transformers.models.bloom.modeling_bloom import BloomGelu

        return probe_activation(BloomGelu(), bytes_per_value)
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError(f"activation {name!r} is not a transformers activation (ACT2FN)")
    return probe_activation(ACT2FN[name], bytes_per_value)


def probe_activation(fn, bytes_per_value: int) -> tuple[float, bool]:
    """:func:`activation_saves` for a callable: what ``fn`` keeps for backward, per element of its input."""
    x = torch.randn(256, dtype=DTYPES[bytes_per_value]).requires_grad_()
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    return sum(seen.values()) / x.numel(), y.untyped_storage().data_ptr() in seen


def _norm_terms(arch: Architecture, where: str, n: int, tokens: int, d: int, device: str) -> list[Term]:
    """What one norm keeps for an input of ``n`` elements over ``tokens`` tokens."""
    if arch.norm == "layernorm":
        kept = [Term(f"{where} LayerNorm input", n, d, KORTHIKANTI, "sp")]
        if arch.family == "gpt":  # the paper's layer, exactly as the paper counts it
            return kept
        stats = 4 if device == "cuda" else d  # ATen keeps mean and 1/std in the accumulation type on GPUs
        return kept + [Term(f"{where} LayerNorm mean and 1/std", 2 * tokens, stats,
                            "ATen native_layer_norm (left out by Korthikanti et al.)", "sp")]
    # LlamaRMSNorm: x.to(float32) is saved by pow and by the multiplication with rsqrt; rsqrt by that
    # multiplication; x̂.to(input dtype) by the multiplication with the weight
    return [Term(f"{where} RMSNorm input, upcast to fp32", n, 4, f"{HF} LlamaRMSNorm: hidden_states.to(float32)",
                 "sp"),
            Term(f"{where} RMSNorm 1/rms (fp32)", tokens, 4, f"{HF} LlamaRMSNorm: torch.rsqrt", "sp"),
            Term(f"{where} RMSNorm normalised input", n, d, f"{HF} LlamaRMSNorm: weight * hidden_states", "sp")]


def _dropout_terms(name: str, p: float, n: int, m: float, tp: str) -> list[Term]:
    if not p:
        return []
    return [Term(f"{name} dropout mask", n, m, f"{KORTHIKANTI}; mask bytes: ATen Dropout.cpp", tp)]


def layer_terms(arch: Architecture, seq_len: int, micro_batch: int, bytes_per_value: int,
                device: str = "cuda") -> list[Term]:
    """Every tensor one transformer layer keeps for backward (see the module docstring)."""
    s, b, h, a, i, d = seq_len, micro_batch, arch.hidden, arch.heads, arch.intermediate, bytes_per_value
    m = 1 if device == "cuda" else d
    u, w, scores, tokens = s * b * h, s * b * i, a * s * s * b, s * b
    kv = u * arch.kv_heads // arch.heads
    terms = _norm_terms(arch, "attention", u, tokens, d, device)
    terms.append(Term("QKV projection input", u, d, KORTHIKANTI, "sp"))
    fused = arch.attention == "sdpa" and not (arch.attn_dropout and device == "cpu")
    if fused:
        # scaled_dot_product_attention (flash/efficient kernels) keeps q, k, v (k and v with kv heads:
        # transformers passes enable_gqa), its output and the log-sum-exp per row; it recomputes scores.
        source = "torch scaled_dot_product_attention (flash kernels); Dao et al. 2022"
        terms += [Term("Q", u, d, source), Term("K, V (kv heads)", 2 * kv, d, source),
                  Term("attention output (= output projection input)", u, d, source),
                  Term("softmax log-sum-exp (fp32)", a * s * b, 4, source)]
    else:
        terms.append(Term("Q, K (inputs of QKᵀ)", 2 * u, d, KORTHIKANTI))
        if arch.softmax_fp32:
            terms.append(Term("softmax output (fp32)", scores, 4, f"{HF}: softmax(dtype=float32)"))
        else:
            terms.append(Term("softmax output", scores, d, KORTHIKANTI))
        if arch.attn_dropout:
            terms += [Term("attention-score dropout mask", scores, m, f"{KORTHIKANTI}; mask bytes: ATen Dropout.cpp"),
                      Term("attention-score dropout output", scores, d, KORTHIKANTI)]
        elif arch.softmax_fp32 and d != 4:
            terms.append(Term("softmax output cast back to the value dtype", scores, d,
                              f"{HF}: softmax(...).to(query.dtype), kept by the matmul with V"))
        terms += [Term("V", u, d, KORTHIKANTI),
                  Term("output projection input", u, d, KORTHIKANTI)]
    terms += _dropout_terms("attention output", arch.resid_dropout, u, m, "sp")
    terms += _norm_terms(arch, "MLP", u, tokens, d, device)
    terms.append(Term("MLP input", u, d, KORTHIKANTI, "sp"))
    if arch.activation_fn is not None:
        act_bytes, act_keeps_output = probe_activation(arch.activation_fn, d)
    else:
        act_bytes, act_keeps_output = activation_saves(arch.activation, d)
    act_source = f"{arch.activation}: measured on a probe (activation_saves)"
    if arch.gated_mlp:
        # down(act(gate(x)) * up(x)): act keeps gate(x); the product keeps act(gate(x)) and up(x); down
        # keeps the product (transformers LlamaMLP)
        terms.append(Term(f"{arch.activation} saves (gate projection output)", w, act_bytes, act_source))
        if not act_keeps_output:
            terms.append(Term(f"{arch.activation} output", w, d, f"{HF} LlamaMLP: act(gate(x)) * up(x)"))
        terms += [Term("up projection output", w, d, f"{HF} LlamaMLP: act(gate(x)) * up(x)"),
                  Term("down projection input", w, d, f"{HF} LlamaMLP: down_proj(...)")]
    else:
        terms.append(Term(f"{arch.activation} saves (first projection output)", w, act_bytes,
                          f"{KORTHIKANTI} (GeLU input); {act_source}"))
        if not act_keeps_output:
            terms.append(Term(f"{arch.activation} output (second projection input)", w, d, KORTHIKANTI))
    terms += _dropout_terms("MLP output", arch.resid_dropout, u, m, "sp")
    return terms


def end_terms(arch: Architecture, seq_len: int, micro_batch: int, bytes_per_value: int,
              device: str = "cuda") -> list[Term]:
    """What the model keeps outside its layers: embedding side, final norm, output layer and loss.

    Korthikanti et al. §4.3 count the final LayerNorm's and output layer's inputs and the fp32 logits of
    the cross-entropy (``4·s·b·v`` bytes; in transformers ``ForCausalLMLoss`` upcasts the logits and
    ``log_softmax`` keeps its fp32 output); the token ids are 8-byte integers.
    """
    s, b, h, d = seq_len, micro_batch, arch.hidden, bytes_per_value
    m = 1 if device == "cuda" else d
    u, tokens = s * b * h, s * b
    terms = [Term("token ids (embedding input, loss targets)", 2 * tokens, 8, "int64 ids", "none")]
    terms += _dropout_terms("embedding", arch.embd_dropout, u, m, "sp")
    if arch.embedding_norm:
        terms += _norm_terms(arch, "embedding", u, tokens, d, device)
    if arch.rotary:
        terms.append(Term("rotary cos and sin", 2 * s * (h // arch.heads), d,
                          f"{HF} apply_rotary_pos_emb: q·cos + rotate_half(q)·sin", "none"))
    terms += _norm_terms(arch, "final", u, tokens, d, device)
    terms.append(Term("output layer input", u, d, "Korthikanti et al. 2022, §4.3", "sp"))
    if arch.vocab:
        terms.append(Term("fp32 log-probabilities kept by the loss", tokens * arch.vocab, 4,
                          "Korthikanti et al. 2022, §4.3; transformers ForCausalLMLoss: logits.float()"))
    return terms


def left_out(arch: Architecture) -> list[str]:
    """What :func:`layer_terms` does not count, and how much it is."""
    notes = ["the loss's per-token scalars and each op's workspace are not counted (a few bytes per token)",
             "16-bit estimates assume 16-bit weights (model.to(bf16), as Megatron-LM trains); under torch.autocast "
             "with fp32 weights, norms, softmax and the residual stream stay fp32 and a 16-bit copy of every "
             "matmul weight is kept, so activations come out {:.1f}x to {:.1f}x the bf16 estimate on tiny GPT-2, Llama "
             "and BLOOM models at 16 to 512 tokens, by architecture and sequence length (no single factor: "
             "measure them with measure_activations)".format(*AUTOCAST_VS_BF16)]
    if arch.attention == "sdpa":
        notes.append("sdpa: fused kernels keep no scores; on CPU with attention dropout PyTorch falls back "
                     "to its math path, counted as eager attention (in bf16 the math path also upcasts)")
        if arch.family == "gpt2":
            notes.append("GPT-2 with sdpa on CPU keeps about 2·s·b·h values more per layer than counted "
                         "(K stays a view of the whole QKV output, Q and V are copied; measured)")
    return notes


def format_terms(terms, unit: float = 1e6, unit_name: str = "MB") -> str:
    """A text table of :class:`Term`\\ s: name, elements, bytes each, total, and the source (chapter 01)."""
    lines = [f"{'kept for backward':<50}{'elements':>14}{'B each':>7}{unit_name:>10}  source"]
    for t in terms:
        lines.append(f"{t.name:<50}{t.numel:>14,}{t.bytes_each:>7g}{t.bytes / unit:>10.2f}  {t.source}")
    lines.append(f"{'total':<50}{'':>14}{'':>7}{sum(t.bytes for t in terms) / unit:>10.2f}")
    return "\n".join(lines)
