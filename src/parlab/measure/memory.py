"""Where the memory of training goes: an estimator, and a measurement to hold it to (chapter 01; ZeRO in 04).

Per rank, training holds four kinds of bytes:

- **params**     the weights (plus, in mixed precision, nothing else here: the fp32 master copy is counted
                 with the optimizer, as the ZeRO paper does);
- **grads**      one gradient per trainable weight, in the training dtype;
- **optimizer**  the optimizer's state: SGD none, momentum one buffer, Adam/AdamW two (``exp_avg``,
                 ``exp_avg_sq``); in mixed precision also the fp32 master weights;
- **activations** what the forward pass saves for the backward pass.

Per parameter this gives the ZeRO paper's ``2Ψ + 2Ψ + KΨ`` with ``K = 12`` for mixed-precision Adam
(Rajbhandari et al. 2020, §3.1), and ``4 + 4 + 8 = 16`` bytes for fp32 Adam. ZeRO stage 1 shards the
optimizer state over the ``dp_size`` data-parallel ranks, stage 2 also the gradients, stage 3 also the
weights (ibid. §5, Figure 1). Tensor and pipeline parallelism split the weights ``tp_size × pp_size``
ways. Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", §4): per transformer layer ``s·b·h·(34 + 5·a·s/h)`` bytes in 16-bit training with dropout,
which we write per element so that it holds for any dtype (see :func:`activation_bytes_per_layer`).

:func:`estimate_memory` predicts; :func:`measure_memory` walks the tensors a rank really holds, counting
each storage once; :func:`measure_activations` counts the bytes autograd saves for backward. Chapter 01
shows the two side by side; tests hold them within 5%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from parlab.parallel.topology import Topology

#: Bytes of optimizer state per parameter, for a optimizer kept in fp32 (the master weights are extra).
OPTIMIZER_STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8, "adamw": 8}
#: ``fp32``: everything in fp32. ``bf16``/``fp16``: 16-bit weights and grads with fp32 master weights.
PRECISIONS = ("fp32", "bf16", "fp16")
GB = 1e9  # the ZeRO paper's GB, and nvidia-smi's, are 10^9 bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank. ``total`` is the sum; ``model_states`` leaves out activations (ZeRO's term)."""

    params: int
    grads: int
    optimizer: int
    activations: int = 0
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.activations

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "total": self.total}

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v / GB:.3g} GB" for k, v in self.as_dict().items())
        return f"MemoryEstimate({parts})"


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, allowed))}")


def count_params(model) -> int:
    """Ψ: the parameters of an ``nn.Module`` or a transformers config (all of them: the estimator
    assumes every weight is trained, as the ZeRO paper's analysis does).

    A config is built on the meta device, so no weights are allocated and nothing is downloaded; tied
    weights (GPT-2's embedding and output layer) count once, as ``Module.parameters()`` yields them once.
    """
    if isinstance(model, nn.Module):
        return sum(p.numel() for p in model.parameters())
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):  # a transformers PretrainedConfig
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(model)
        return count_params(built)
    raise TypeError(f"model={type(model).__name__} must be an nn.Module or a transformers config "
                    f"(e.g. GPT2Config(...)); for a bare count pass num_params=")


def activation_bytes_per_layer(seq_len, micro_batch, hidden, heads, bytes_per_value=2, dropout=True,
                               tp_size=1, sequence_parallel=False, checkpointing=False) -> int:
    """Bytes one transformer layer saves for backward (Korthikanti et al. 2022, §4.1, eq. 1–3).

    The paper counts, per layer, 16 ``s·b·h``-sized values kept in the training dtype (inputs of the QKV
    and output projections, Q, K, V, the MLP's input, GeLU input and output (4h wide each), two
    LayerNorm inputs), ``a·s²·b`` softmax outputs and their dropout outputs in the training dtype, and
    1-byte dropout masks of size ``2·s·b·h + a·s²·b``. With 2-byte values that is ``sbh(34 + 5as/h)``.
    Tensor parallelism divides everything but the LayerNorm/dropout part by ``tp_size`` (eq. 2); sequence
    parallelism divides that too (eq. 3). Full activation checkpointing keeps only each layer's input
    (``s·b·h`` values, eq. 5 before the 1/t of sequence parallelism).
    """
    s, b, h, a, d, t = seq_len, micro_batch, hidden, heads, bytes_per_value, tp_size
    if checkpointing:
        return s * b * h * d // (t if sequence_parallel else 1)
    mask = 1 if dropout else 0
    # Split by tensor parallelism: Q, K, V, the output projection's input, GeLU input and output (4h
    # each): 12 values of s·b·h, and the attention scores (softmax output, its dropout mask and output).
    split = 12 * s * b * h * d + a * s * s * b * ((2 * d + 1) if dropout else d)
    # Replicated across tp ranks (only sequence parallelism splits them): the inputs of the QKV and first
    # MLP projections, two LayerNorm inputs (4 values of s·b·h) and two 1-byte dropout masks.
    replicated = 4 * s * b * h * d + 2 * s * b * h * mask
    return split // t + replicated // (t if sequence_parallel else 1)


def estimate_memory(model=None, *, num_params: int | None = None, precision: str = "fp32",
                    optimizer: str = "adam", world_size: int = 1, zero_stage: int = 0, tp_size: int = 1,
                    pp_size: int = 1, micro_batch: int = 0, seq_len: int | None = None,
                    hidden: int | None = None, layers: int | None = None, heads: int | None = None,
                    checkpointing: bool = False, dropout: bool = True,
                    sequence_parallel: bool = False, vocab: int | None = None) -> MemoryEstimate:
    """Predict training memory per rank.

    model: an ``nn.Module`` or a transformers config; or give ``num_params=`` (Ψ) instead.
    precision: ``"fp32"``, or ``"bf16"``/``"fp16"`` for mixed precision with fp32 master weights.
    optimizer: ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"adamw"``.
    world_size: ranks in all; ``dp_size = world_size / (tp_size · pp_size)``.
    zero_stage: 0 (plain data parallel), 1 (shard optimizer), 2 (+ grads), 3 (+ weights).
    micro_batch, seq_len, hidden, layers, heads: activations (0 micro-batch: model states only). With a
    transformers config, ``hidden``, ``layers``, ``heads``, ``seq_len`` and ``vocab`` default to the config's.
    vocab: adds the model's ends (Korthikanti et al. 2022, §4.3): the final LayerNorm's and output layer's
    inputs, and the fp32 logits the loss keeps, ``4·s·b·vocab`` bytes.

    >>> estimate_memory(num_params=7_500_000_000, precision="bf16", world_size=64, zero_stage=1).total / 1e9
    31.40625
    """
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, tuple(OPTIMIZER_STATE_BYTES))
    _check_choice("zero_stage", zero_stage, (0, 1, 2, 3))
    dp_size = Topology.infer(world_size, tp=tp_size, pp=pp_size).dp
    if (model is None) == (num_params is None):
        raise ValueError("give exactly one of model= (an nn.Module or transformers config) and num_params=")
    # a transformers model carries its config: activations then need no extra arguments
    config = getattr(model, "config", None) if isinstance(model, nn.Module) else model
    if num_params is None:
        num_params = count_params(model)
    elif not isinstance(num_params, int) or num_params < 1:
        raise ValueError(f"num_params={num_params!r} must be a positive integer (Ψ, the parameter count)")

    psi = num_params / (tp_size * pp_size)  # weights one model-parallel rank holds (even split assumed)
    value = 4 if precision == "fp32" else 2
    state = OPTIMIZER_STATE_BYTES[optimizer] + (0 if precision == "fp32" else 4)  # K; + fp32 master
    shard = {name: (dp_size if zero_stage >= stage else 1)
             for name, stage in (("optimizer", 1), ("grads", 2), ("params", 3))}
    params = math.ceil(value * psi / shard["params"])
    grads = math.ceil(value * psi / shard["grads"])
    opt = math.ceil(state * psi / shard["optimizer"])

    notes = []
    activations = 0
    if micro_batch:
        hidden = hidden or getattr(config, "hidden_size", None)
        layers = layers or getattr(config, "num_hidden_layers", None)
        heads = heads or getattr(config, "num_attention_heads", None)
        seq_len = seq_len or getattr(config, "max_position_embeddings", None)
        missing = [n for n, v in (("hidden", hidden), ("layers", layers), ("heads", heads),
                                  ("seq_len", seq_len)) if not v]
        if missing:
            raise ValueError(f"micro_batch={micro_batch} asks for activations, which need "
                             f"{', '.join(missing)}= (or a transformers config that has them)")
        per_layer = activation_bytes_per_layer(seq_len, micro_batch, hidden, heads, value, dropout, tp_size,
                                               sequence_parallel, checkpointing)
        # With 1F1B the first pipeline stage keeps pp_size micro-batches of layers/pp_size layers:
        # the activations of all layers, whatever pp_size is (Korthikanti et al. 2022, §4.2.3).
        activations = per_layer * layers
        vocab = vocab or getattr(config, "vocab_size", None)
        if vocab:
            ends = 2 * seq_len * micro_batch * hidden * value + 4 * seq_len * micro_batch * vocab
            activations += ends // tp_size
            notes.append("activations: layers + final LayerNorm, output layer and fp32 logits (§4.3)")
        else:
            notes.append("activations: transformer layers only (no logits or loss)")
    return MemoryEstimate(params, grads, opt, activations, tuple(notes))


@dataclass(frozen=True)
class MemoryMeasurement:
    """Bytes a rank really holds, each storage counted once. ``peak_allocated``: CUDA only, else None."""

    params: int
    grads: int
    optimizer: int
    peak_allocated: int | None = None

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}


def _storage_bytes(tensors, seen: set) -> int:
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        # DTensor (FSDP2, TP) holds its local shard; count that, since it is what this rank stores.
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        key = (storage.device, storage.data_ptr())
        if key not in seen:  # views and tied weights share a storage
            seen.add(key)
            total += storage.nbytes()
    return total


def _optimizer_tensors(optimizer):
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    for state in inner.state.values():
        yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def measure_memory(model: nn.Module, optimizer=None) -> MemoryMeasurement:
    """Walk the weights, gradients and optimizer state this rank holds and add up their storages.

    Call it after a training step (before ``zero_grad``), when gradients and optimizer state exist.
    Scalar ``step`` counters of Adam are counted: they are real, if tiny.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={type(model).__name__} must be an nn.Module")
    seen: set = set()
    params = _storage_bytes(model.parameters(), seen)
    grads = _storage_bytes((p.grad for p in model.parameters() if p.grad is not None), seen)
    opt = _storage_bytes(_optimizer_tensors(optimizer), seen) if optimizer is not None else 0
    peak = None
    if torch.cuda.is_available() and any(p.is_cuda for p in model.parameters()):
        peak = torch.cuda.max_memory_allocated()
    return MemoryMeasurement(params, grads, opt, peak)


def measure_activations(model: nn.Module, *inputs, **kwargs) -> int:
    """Bytes autograd saves for backward during ``model(*inputs, **kwargs)``, weights excluded.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: every tensor an op saves for its backward passes
    through the hook; each storage counts once (many ops save the same tensor).
    """
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set = set()
    total = 0

    def pack(t):
        nonlocal total
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in weights and key not in seen:
            seen.add(key)
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs, **kwargs)
    return total


#: The ZeRO paper's Table 1 (Rajbhandari et al. 2020): per-device memory of model states in GB for
#: mixed-precision Adam (K = 12), keyed by (Ψ, N_d); values: (baseline, P_os, P_os+g, P_os+g+p).
#: Kept as printed, so that chapter 01 and the tests compare the estimator against the paper itself.
ZERO_PAPER_TABLE1 = {
    (7.5e9, 1): (120, 120, 120, 120), (7.5e9, 4): (120, 52.5, 41.3, 30),
    (7.5e9, 16): (120, 35.6, 21.6, 7.5), (7.5e9, 64): (120, 31.4, 16.6, 1.88),
    (7.5e9, 256): (120, 30.4, 15.4, 0.47), (7.5e9, 1024): (120, 30.1, 15.1, 0.12),
    (128e9, 1): (2048, 2048, 2048, 2048), (128e9, 4): (2048, 896, 704, 512),
    (128e9, 16): (2048, 608, 368, 128), (128e9, 64): (2048, 536, 284, 32),
    (128e9, 256): (2048, 518, 263, 8), (128e9, 1024): (2048, 513, 257, 2),
    (1e12, 1): (16000, 16000, 16000, 16000), (1e12, 4): (16000, 7000, 5500, 4000),
    (1e12, 16): (16000, 4750, 2875, 1000), (1e12, 64): (16000, 4187, 2218, 250),
    (1e12, 256): (16000, 4046, 2054, 62.5), (1e12, 1024): (16000, 4011, 2013, 15.6),
}


class ActivationTracker:
    """Bytes autograd holds for backward *right now*, and the most it held: for schedules that keep several
    micro-batches' activations at once (pipelines, chapter 06).

    Inside ``with tracker:`` every tensor an op saves for backward is counted (each storage once, weights
    in ``exclude`` never) and wrapped in a small holder; when autograd lets go of it (after the backward
    that used it) the holder is freed and its bytes leave the count. So ``live`` and ``peak`` follow what
    is really kept, and ``samples`` holds ``(time.perf_counter(), live bytes)`` at every change, for a plot.
    The context may be entered and left many times (around each forward, say); what was saved stays
    counted until released.
    """

    def __init__(self, exclude=()):
        params = exclude.parameters() if isinstance(exclude, nn.Module) else exclude
        self._weights = {p.untyped_storage().data_ptr() for p in params}
        self._held: dict[int, list[int]] = {}  # storage address -> [holders, bytes]
        self.live = 0
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self._hooks = None

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack_held)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None

    def _pack(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._weights or storage.nbytes() == 0:
            return t
        entry = self._held.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self._change(entry[1])
        entry[0] += 1
        return _Held(self, key, t)

    def _release(self, key: int) -> None:
        entry = self._held[key]
        entry[0] -= 1
        if entry[0] == 0:  # the last holder of this storage is gone: autograd no longer keeps it
            del self._held[key]
            self._change(-entry[1])

    def _change(self, nbytes: int) -> None:
        import time

        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.samples.append((time.perf_counter(), self.live))


class _Held:
    """One saved tensor as autograd keeps it; tells its tracker when autograd drops it."""

    __slots__ = ("tracker", "key", "tensor")

    def __init__(self, tracker, key, tensor):
        self.tracker, self.key, self.tensor = tracker, key, tensor

    def __del__(self):
        self.tracker._release(self.key)


def _unpack_held(held):
    return held.tensor if isinstance(held, _Held) else held
