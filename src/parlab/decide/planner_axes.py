"""Pricing the cp and ep axes (chapter 10), beside the planner's dp, tp and pp (``parlab.decide.planner``, chapter 07).

Built only on the estimator's and the planner's public functions, so that it can later be folded into
``planner.predict``:

- **memory** (:func:`estimate_memory_axes`): context parallelism keeps the model states as data parallelism
  does (torchtitan's FSDP shards them over dp × cp: ``world_size`` counts the cp ranks), and each rank
  keeps the activations of seq_len/cp tokens: the estimator's activations ÷ cp (exact for the terms linear
  in the sequence; ring attention keeps no s × s scores). Expert parallelism splits the experts' weights
  ep ways; what each rank keeps of them is sharded (ZeRO) over the edp ranks that hold the same experts,
  dp·cp/ep of them, while the dense weights are sharded over all dp·cp.
- **bytes** (:func:`cp_bytes`, :func:`ep_bytes`): ring attention's K/V blocks per layer, and the MoE's
  two all-to-alls, per micro-batch and rank (``parlab.lab.parallel.context.ring_bytes`` and
  ``parlab.lab.parallel.expert.all_to_all_bytes`` at published sizes).
- **the worked example**: Llama 3 405B at 128k tokens, TP 8 × CP 16 × PP 16 × DP 8 on 16,384 H100s
  (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.2, Table 4), :func:`llama3_128k`.
"""

from __future__ import annotations

from dataclasses import replace

from parlab.lab.measure.memory import MemoryEstimate, estimate_memory
from parlab.decide.planner import H100 as _H100
from parlab.decide.planner import Link

#: The GPU Llama 3 trained on (§3.3.1: H100s with 80 GB HBM3): the planner's H100 (NVIDIA's datasheet).
H100 = _H100
#: Llama 3's fabric between nodes: 400 Gb/s per GPU (Dubey et al. 2024, §3.3.1: RoCE and InfiniBand
#: clusters "with 400 Gbps interconnects between GPUs"), 50 GB/s one way; α assumed as for InfiniBand.
LLAMA3_FABRIC = Link("RoCE 400 Gb/s per GPU (Llama 3)", 5e-6, 400e9 / 8,
                     "Dubey et al. 2024, The Llama 3 Herd of Models, §3.3.1: 400 Gbps interconnects between GPUs")
#: Llama 3's 4-D layout for its 131,072-token stage (Table 4), 16 sequences per DP rank per step.
LLAMA3_128K = {"tp": 8, "cp": 16, "pp": 16, "dp": 8, "seq_len": 131072, "batch_per_dp": 16}


def llama3_405b():
    """Llama 3 405B's published shape (Dubey et al. 2024, Table 3) as a transformers config; nothing downloaded."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072)


def estimate_memory_axes(model=None, *, num_params=None, cp: int = 1, ep: int = 1, expert_params: int = 0,
                         world_size: int, tp_size: int = 1, pp_size: int = 1, zero_stage: int = 0,
                         micro_batch: int = 0, seq_len: int | None = None, **kwargs) -> MemoryEstimate:
    """Bytes per rank with context and expert parallelism, from :func:`parlab.lab.measure.estimate_memory`.

    ``world_size`` counts every rank (pp × dp × cp × tp); ZeRO shards over dp × cp. ``expert_params``: how
    many of the parameters are the experts' (split ep ways, sharded over dp·cp/ep); the rest are dense.
    Activations: those of the whole sequence ÷ cp (MoE layers priced as the dense model's MLP)."""
    if world_size % (cp * tp_size * pp_size):
        raise ValueError(f"world_size={world_size} is not a multiple of cp × tp × pp = {cp * tp_size * pp_size}")
    dp_cp = world_size // (tp_size * pp_size)
    if dp_cp % ep:
        raise ValueError(f"ep={ep} must divide dp × cp = {dp_cp} (experts borrow the data-parallel ranks)")
    common = dict(tp_size=tp_size, pp_size=pp_size, zero_stage=zero_stage, **kwargs)
    whole = estimate_memory(model, num_params=num_params, world_size=world_size, micro_batch=micro_batch,
                            seq_len=seq_len, **common)
    if expert_params:
        dense = estimate_memory(num_params=_psi(model, num_params) - expert_params, world_size=world_size, **common)
        experts = estimate_memory(num_params=max(1, expert_params // ep), world_size=world_size // ep, **common)
        whole = replace(whole, params=dense.params + experts.params, grads=dense.grads + experts.grads,
                        optimizer=dense.optimizer + experts.optimizer)
    note = f"context parallel: activations of seq_len/{cp} tokens per rank" if cp > 1 else None
    return replace(whole, activations=-(-whole.activations // cp), notes=whole.notes + ((note,) if note else ()))


def by_layers(estimate, config, **kwargs) -> MemoryEstimate:
    """``estimate(config, **kwargs)`` for a deep transformers config, from the same config with 1 and 2 layers:
    every term is linear in the number of layers (weights, and with 1F1B the first stage keeps every layer's
    activations), so two shallow estimates give the deep one, without building 126 layers on the meta device."""
    one, two = (estimate(config.__class__(**{**config.to_dict(), "num_hidden_layers": n}), **kwargs) for n in (1, 2))
    layers = config.num_hidden_layers
    fields = {k: getattr(one, k) + (layers - 1) * (getattr(two, k) - getattr(one, k))
              for k in ("params", "grads", "optimizer", "activations", "buckets")}
    return replace(one, **fields)


def _psi(model, num_params) -> int:
    from parlab.lab.measure import count_params

    return int(num_params) if num_params is not None else count_params(model)


def cp_bytes(*, seq_len: int, cp: int, batch: int, kv_heads: int, head_dim: int, layers: float,
             value_bytes: int = 2) -> dict:
    """Bytes one rank sends per micro-batch for ring attention over its ``layers`` (K/V heads already
    divided by tp): forward (cp − 1) blocks of 2·b·g·(s/cp)·d values per layer, backward K/V again and
    their gradients, (cp − 1) + cp blocks' worth twice over (``parlab.lab.parallel.context.ring_bytes``)."""
    block = 2 * batch * kv_heads * (seq_len // cp) * head_dim * value_bytes
    return {"forward": layers * (cp - 1) * block, "backward": layers * (2 * cp - 1) * block, "block": block}


def ep_bytes(*, tokens: int, hidden: int, num_experts: int, top_k: int, capacity_factor: float, layers: int,
             value_bytes: int = 2) -> int:
    """Bytes one rank's MoE layers move per micro-batch: four all-to-alls (dispatch and combine, forward and
    backward) of its whole (E, C, h) buffer each, C = capacity_factor · tokens · k / E."""
    from parlab.lab.parallel.expert import capacity

    return 4 * layers * num_experts * capacity(tokens, num_experts, top_k, capacity_factor) * hidden * value_bytes


def llama3_128k(sequence_parallel: bool = True, zero_stage: int = 2, checkpointing: bool = False,
                fp32_grads: bool = True) -> dict:
    """Llama 3 405B at 128k tokens on its published layout, priced: memory per GPU (with CP, and what the
    same layout would need without it), and ring attention's bytes and one ring step by the α-β model.

    The defaults are the paper's FSDP (Dubey et al. 2024, §3.3.2): "shards optimizer states and gradients,
    but for model shards we do not reshard after forward computation" (ZeRO-2: the weights whole on each
    rank), with "FP32 gradient accumulation ... and also reduce-scatter gradients in FP32" (``fp32_grads``).
    Activations are the estimator's for transformers' Llama (chapter 01: its RMSNorm keeps an fp32 copy of
    its input, its SwiGLU four tensors of the MLP's width); Meta's kernels are not published, nor whether the
    128k stage recomputed activations (its 8K stage did not: "without activation checkpointing")."""
    from parlab.lab.parallel.context import cp_step, overlap_chunk
    from parlab.decide.planner import H100_UTILIZATION

    config, lay = llama3_405b(), LLAMA3_128K
    world = lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"]
    kw = dict(world_size=world, tp_size=lay["tp"], pp_size=lay["pp"], zero_stage=zero_stage, precision="bf16",
              micro_batch=1, seq_len=lay["seq_len"], sequence_parallel=sequence_parallel, attention="sdpa",
              checkpointing=checkpointing, fp32_grads=fp32_grads)
    with_cp = by_layers(estimate_memory_axes, config, cp=lay["cp"], **kw)
    without = by_layers(estimate_memory_axes, config, cp=1, **kw)
    heads, kv = config.num_attention_heads // lay["tp"], config.num_key_value_heads // lay["tp"]
    head_dim = config.hidden_size // config.num_attention_heads
    link = LLAMA3_FABRIC  # a cp group of 16 spans nodes of 8 GPUs (tp fills each node): one GPU's adapter
    flops = H100.flops * H100_UTILIZATION  # the H100's fitted share
    step = cp_step(lay["seq_len"], lay["cp"], heads=heads, kv_heads=kv, head_dim=head_dim, flops=flops,
                   alpha=link.alpha, bandwidth=link.bandwidth)
    return {"world_size": world, "memory": with_cp, "memory_without_cp": without, "gpu": H100, "link": link,
            "bytes": cp_bytes(seq_len=lay["seq_len"], cp=lay["cp"], batch=1, kv_heads=kv, head_dim=head_dim,
                              layers=config.num_hidden_layers / lay["pp"]),
            "step": step, "overlap_chunk": overlap_chunk(heads=heads, kv_heads=kv, head_dim=head_dim, flops=flops,
                                                         bandwidth=link.bandwidth)}
