"""Where the memory of training goes: an estimator, and a measurement to hold it to (chapter 01; ZeRO in 04).

Per rank, training holds these kinds of bytes:

- **params**     the weights, in the dtype the model computes with;
- **grads**      one gradient per trainable weight;
- **optimizer**  the optimizer's state: SGD none, momentum one buffer, Adam/AdamW two (``exp_avg``,
                 ``exp_avg_sq``), kept in fp32; in mixed precision also the fp32 master weights;
- **buckets**    PyTorch DDP's gradient buckets: a second, persistent gradient-sized buffer unless
                 ``gradient_as_bucket_view=True`` (``torch/nn/parallel/distributed.py``);
- **activations** what the forward pass saves for the backward pass.

Which dtypes hold what is an *accounting*, and there are several (bytes per parameter, Adam):

==============================================  =====  =====  =================  =====
accounting                                      param  grad   optimizer          total
==============================================  =====  =====  =================  =====
fp32                                            4      4      8                  16
mixed precision, ZeRO paper §3.1 (fp16 grads)   2      2      K = 4 + 8 = 12     16
mixed precision, fp32 gradients (Megatron-LM's  2      4      12                 18
bf16 default, ``fp32_grads=True``)
``torch.autocast`` (fp32 weights and grads)     4      4      8                  16 (+ a 16-bit copy of
                                                                                 the weights per step)
==============================================  =====  =====  =================  =====

(Rajbhandari et al. 2020, §3.1; Megatron-LM ``docs/source/api-guide/dist_optimizer.md``, "float16 param,
fp32 grads: 18"; autocast casts weights on the fly and caches the casts for the step.) ZeRO stage 1
shards the optimizer state over the ``dp_size`` data-parallel ranks, stage 2 also the gradients, stage 3
also the weights (ibid. §5, Figure 1). Tensor and pipeline parallelism split the weights ``tp_size ×
pp_size`` ways. Activations are counted term by term from the model's architecture
(:mod:`parlab.lab.measure.activations`); for Korthikanti et al.'s GPT layer with dropout that is
``s·b·h·(34 + 5·a·s/h)`` bytes in 16-bit training (see :func:`activation_bytes_per_layer`).

:func:`estimate_memory` predicts; :func:`measure_memory` walks the tensors a rank really holds, counting
each storage once; :func:`measure_activations` counts the bytes autograd saves for backward;
:func:`parlab.lab.measure.peak.peak_memory` the most bytes PyTorch had allocated at once during a call.
Chapter 01 shows them side by side; tests hold them within 5%. The estimate's activations term lives in
:mod:`parlab.lab.measure.activation_estimate` (``architecture`` too), and :class:`ActivationTracker`, which
follows the activations kept over time, in :mod:`parlab.lab.measure.activation_tracker`; both are importable
from here as before.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from parlab.lab.measure.activation_estimate import architecture, estimate_activations
from parlab.lab.measure.activation_tracker import ActivationTracker
from parlab.lab.measure.activations import ATTENTIONS, DEVICES, config_json, meta_model
from parlab.lab.topology import Topology

#: Bytes of optimizer state per parameter, for a optimizer kept in fp32 (the master weights are extra).
OPTIMIZER_STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8, "adamw": 8}
#: ``fp32``: everything in fp32. ``bf16``/``fp16``: 16-bit weights and grads with fp32 master weights.
PRECISIONS = ("fp32", "bf16", "fp16")
GB = 1e9  # the ZeRO paper's GB, and nvidia-smi's, are 10^9 bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank. ``total`` is the sum; ``model_states`` leaves out activations and buckets (ZeRO's term)."""

    params: int
    grads: int
    optimizer: int
    activations: int = 0
    buckets: int = 0
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.buckets + self.activations

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "buckets": self.buckets, "activations": self.activations, "total": self.total}

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v / GB:.3g} GB" for k, v in self.as_dict().items())
        return f"MemoryEstimate({parts})"


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, allowed))}")


def _param_count(num_params) -> int:
    """Ψ as an int: ``7_500_000_000`` and ``7.5e9`` alike (a float must be a whole number)."""
    if isinstance(num_params, float) and num_params.is_integer():
        num_params = int(num_params)
    if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 1:
        raise ValueError(f"num_params={num_params!r} must be a positive whole number (Ψ, the parameter "
                         f"count), e.g. 7_500_000_000 or 7.5e9")
    return num_params


def count_params(model) -> int:
    """Ψ: the parameters of an ``nn.Module`` or a transformers config (all of them: the estimator
    assumes every weight is trained, as the ZeRO paper's analysis does).

    A config is built on the meta device, so no weights are allocated and nothing is downloaded; tied
    weights (GPT-2's embedding and output layer) count once, as ``Module.parameters()`` yields them once.
    It is rebuilt from its JSON (so building writes nothing into the caller's config) and the count is
    remembered per config.
    """
    if isinstance(model, nn.Module):
        return sum(p.numel() for p in model.parameters())
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):  # a transformers PretrainedConfig
        return _count_config(config_json(model))
    raise TypeError(f"model={type(model).__name__} must be an nn.Module or a transformers config "
                    f"(e.g. GPT2Config(...)); for a bare count pass num_params=")


# the planner counts the same configs again at every prediction; a count walks every module of the model
@functools.lru_cache(maxsize=256)
def _count_config(config_json: str) -> int:
    return count_params(meta_model(config_json))


def activation_bytes_per_layer(seq_len, micro_batch, hidden, heads, bytes_per_value=2, dropout=True,
                               tp_size=1, sequence_parallel=False, checkpointing=False) -> int:
    """Korthikanti et al. 2022's count for one GPT layer (§4.1, eq. 1–3, 5), written per value.

    The paper counts, per layer, 16 ``s·b·h``-sized values kept in the training dtype (inputs of the QKV
    and output projections, Q, K, V, the MLP's input, GeLU input and output (4h wide each), two
    LayerNorm inputs), ``a·s²·b`` softmax outputs and their dropout outputs in the training dtype, and
    1-byte dropout masks of size ``2·s·b·h + a·s²·b``. With 2-byte values that is ``sbh(34 + 5as/h)``.
    Tensor parallelism divides everything but the LayerNorm/dropout part by ``tp_size`` (eq. 2); sequence
    parallelism divides that too (eq. 3). Full activation checkpointing keeps only each layer's input
    (``s·b·h`` values, eq. 5 before the 1/t of sequence parallelism). :func:`estimate_memory` counts the
    same terms from a model's own architecture (:mod:`parlab.lab.measure.activations`), which for this layer
    adds only LayerNorm's per-token statistics.
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


def estimate_memory(model=None, *, num_params: int | float | None = None, precision: str = "fp32",
                    optimizer: str = "adam", world_size: int = 1, zero_stage: int = 0, tp_size: int = 1,
                    pp_size: int = 1, micro_batch: int = 0, seq_len: int | None = None,
                    hidden: int | None = None, layers: int | None = None, heads: int | None = None,
                    checkpointing: bool = False, dropout: bool | None = None,
                    sequence_parallel: bool = False, vocab: int | None = None, attention: str | None = None,
                    device: str | None = None, fp32_grads: bool = False,
                    gradient_buckets: bool = False) -> MemoryEstimate:
    """Predict training memory per rank.

    model: an ``nn.Module`` or a transformers config; or give ``num_params=`` (Ψ; an int, or a whole
    float such as ``7.5e9``) instead.
    precision: ``"fp32"``, or ``"bf16"``/``"fp16"`` for mixed precision with fp32 master weights (the ZeRO
    paper's accounting: 16-bit gradients). fp32_grads: mixed precision whose gradients are fp32
    (Megatron-LM's bf16 default): 18 bytes per parameter with Adam instead of 16.
    optimizer: ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"adamw"``.
    world_size: ranks in all; ``dp_size = world_size / (tp_size · pp_size)``.
    zero_stage: 0 (plain data parallel), 1 (shard optimizer), 2 (+ grads), 3 (+ weights).
    gradient_buckets: add PyTorch DDP's gradient buckets (a second copy of the gradients, its default
    ``gradient_as_bucket_view=False``); only with zero_stage 0 or 1, where DDP is what runs.
    micro_batch, seq_len: activations (0 micro-batch: model states only). The architecture comes from a
    transformers config (GPT-2, Llama/Mistral/Qwen2, BLOOM: :class:`~parlab.lab.measure.activations.
    Architecture`), whose sizes ``hidden``, ``layers``, ``heads``, ``vocab`` and ``seq_len`` are defaults;
    without one, ``hidden``, ``layers``, ``heads`` give Korthikanti et al.'s GPT layer.
    dropout: ``None`` follows the config (Korthikanti's layer: with dropout); ``False`` none.
    attention: ``"eager"`` (the ``s × s`` scores are kept) or ``"sdpa"`` (fused kernels recompute them);
    ``None``: what transformers picks for the config. device: ``"cuda"`` (1-byte dropout masks; the
    default for a config) or ``"cpu"`` (masks in the value dtype); a model's own device by default.
    checkpointing: full activation checkpointing: each layer's input is kept, and one layer's activations
    are recomputed during its backward (the peak).
    vocab: adds the model's ends (Korthikanti et al. 2022, §4.3): final norm, output layer and the fp32
    log-probabilities the loss keeps, ``4·s·b·vocab`` bytes.

    >>> estimate_memory(num_params=7.5e9, precision="bf16", world_size=64, zero_stage=1).total / 1e9
    31.40625
    """
    dp_size = _checked_dp_size(model, num_params, precision, optimizer, world_size, zero_stage, tp_size, pp_size,
                               attention, device, fp32_grads, gradient_buckets)
    num_params = count_params(model) if num_params is None else _param_count(num_params)

    psi = num_params / (tp_size * pp_size)  # weights one model-parallel rank holds (even split assumed)
    value = 4 if precision == "fp32" else 2
    grad_value = 4 if fp32_grads else value
    state = OPTIMIZER_STATE_BYTES[optimizer] + (0 if precision == "fp32" else 4)  # K; + fp32 master
    shard = {name: (dp_size if zero_stage >= stage else 1)
             for name, stage in (("optimizer", 1), ("grads", 2), ("params", 3))}
    params = math.ceil(value * psi / shard["params"])
    grads = math.ceil(grad_value * psi / shard["grads"])
    opt = math.ceil(state * psi / shard["optimizer"])
    buckets = math.ceil(grad_value * psi) if gradient_buckets else 0

    activations, notes = 0, []
    if micro_batch:
        activations, notes = estimate_activations(
            model, micro_batch, seq_len, value, tp_size=tp_size, sequence_parallel=sequence_parallel,
            checkpointing=checkpointing, device=device, hidden=hidden, layers=layers, heads=heads, vocab=vocab,
            attention=attention, dropout=dropout)
    return MemoryEstimate(params, grads, opt, activations, buckets, tuple(notes))


def _checked_dp_size(model, num_params, precision, optimizer, world_size, zero_stage, tp_size, pp_size,
                     attention, device, fp32_grads, gradient_buckets) -> int:
    """Check :func:`estimate_memory`'s arguments; return the data-parallel size they leave."""
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, tuple(OPTIMIZER_STATE_BYTES))
    _check_choice("zero_stage", zero_stage, (0, 1, 2, 3))
    if attention is not None:
        _check_choice("attention", attention, ATTENTIONS)
    if device is not None:
        _check_choice("device", device, DEVICES)
    dp_size = Topology.infer(world_size, tp=tp_size, pp=pp_size).dp
    if (model is None) == (num_params is None):
        raise ValueError("give exactly one of model= (an nn.Module or transformers config) and num_params=")
    if fp32_grads and precision == "fp32":
        raise ValueError("fp32_grads=True describes mixed precision (precision='bf16' or 'fp16'); in fp32 "
                         "the gradients are fp32 already")
    if gradient_buckets and zero_stage > 1:
        raise ValueError(f"gradient_buckets=True is DDP's; with zero_stage={zero_stage} the gradients are "
                         f"sharded (FSDP / ZeRO-2), not bucketed by DDP: use zero_stage 0 or 1")
    return dp_size


@dataclass(frozen=True)
class MemoryMeasurement:
    """Bytes a rank really holds, each storage counted once. ``peak_allocated``: CUDA only, else None.
    ``buckets``: a DDP model's gradient buckets when they are not the gradients themselves."""

    params: int
    grads: int
    optimizer: int
    peak_allocated: int | None = None
    buckets: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buckets

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "buckets": self.buckets, "total": self.total}


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


def ddp_buckets(ddp_model) -> list[tuple[list[str], int]]:
    """(parameter names, bytes) of each gradient bucket of a ``DistributedDataParallel`` model, in the
    order its reducer launches them (chapter 03).

    Read from the reducer itself (``_get_zeros_like_grad_buckets``, which allocates zero-filled copies of
    the buckets for the moment of the call): the layout DDP uses now. PyTorch builds one layout at
    construction and rebuilds it once, at the second forward, in the order gradients became ready.
    """
    names = {id(p): n for n, p in ddp_model.module.named_parameters()}
    return [([names[id(p)] for p in bucket.parameters()], bucket.buffer().numel() * bucket.buffer().element_size())
            for bucket in ddp_model.reducer._get_zeros_like_grad_buckets()]


def measure_memory(model: nn.Module, optimizer=None) -> MemoryMeasurement:
    """Walk the weights, gradients and optimizer state this rank holds and add up their storages.

    Call it after a training step (before ``zero_grad``), when gradients and optimizer state exist.
    Scalar ``step`` counters of Adam are counted: they are real, if tiny. For a
    ``DistributedDataParallel`` model its gradient buckets are counted too: as ``buckets`` when they are a
    separate copy (DDP's default), within ``grads`` when ``gradient_as_bucket_view=True`` makes every
    ``.grad`` a view of its bucket.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={type(model).__name__} must be an nn.Module")
    seen: set = set()
    params = _storage_bytes(model.parameters(), seen)
    grads = _storage_bytes((p.grad for p in model.parameters() if p.grad is not None), seen)
    opt = _storage_bytes(_optimizer_tensors(optimizer), seen) if optimizer is not None else 0
    buckets = 0
    if isinstance(model, nn.parallel.DistributedDataParallel) and not model.gradient_as_bucket_view:
        buckets = sum(nbytes for _, nbytes in ddp_buckets(model))
    peak = None
    from parlab.lab.launch import simgpu  # a simulated GPU's tensors live on the CPU (CI without GPUs)

    cuda = next((p.device for p in model.parameters() if p.is_cuda or simgpu.on_gpu(p)), None)
    if cuda is not None:  # the peak since the last measurement on this device: each one starts afresh
        peak = torch.cuda.max_memory_allocated(cuda)
        torch.cuda.reset_peak_memory_stats(cuda)
    return MemoryMeasurement(params, grads, opt, peak, buckets)


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

__all__ = ["ZERO_PAPER_TABLE1", "ActivationTracker", "MemoryEstimate", "MemoryMeasurement",
           "activation_bytes_per_layer", "architecture", "count_params", "ddp_buckets", "estimate_memory",
           "measure_activations", "measure_memory"]
