"""Chapter 10's published shapes and layouts, for the planner to price (``parlab.decide.planner.predict``, chapter 07).

The planner prices context and expert parallelism itself (``Layout(cp=, cp_kind=, ep=, etp=)``: memory in
:func:`parlab.decide.planner.stage_memory`, bytes in :class:`parlab.decide.planner.Prediction`'s
``bytes_by_axis``, time in ``parts["cp"]`` and ``parts["ep"]``). What is left here are the inputs chapter 10
gives it:

- **Llama 3 405B at 128k tokens** (Dubey et al. 2024, "The Llama 3 Herd of Models"): its shape
  (:func:`llama3_405b`, Table 3), its 131,072-token stage as a workload (:func:`llama3_128k`), its layout
  (:data:`LLAMA3_128K`: TP 8 × CP 16 × PP 16 × DP 8, Table 4, K/V all-gathered, §3.3.2) and its cluster of
  16,384 H100s (:func:`llama3_cluster`, with :data:`LLAMA3_FABRIC` between nodes, §3.3.1);
- **Mixtral 8x7B** (Jiang et al. 2024, "Mixtral of Experts", Table 1): its shape (:func:`mixtral_8x7b`).
"""

from __future__ import annotations

from parlab.decide.planner import Cluster, Layout, Link, Workload, cluster_of

#: Llama 3's fabric between nodes: 400 Gb/s per GPU (Dubey et al. 2024, §3.3.1: RoCE and InfiniBand
#: clusters "with 400 Gbps interconnects between GPUs"), 50 GB/s one way; α assumed as for InfiniBand.
LLAMA3_FABRIC = Link("RoCE 400 Gb/s per GPU (Llama 3)", 5e-6, 400e9 / 8,
                     "Dubey et al. 2024, The Llama 3 Herd of Models, §3.3.1: 400 Gbps interconnects between GPUs")
#: Llama 3's 4-D layout for its 131,072-token stage (Table 4: TP 8 × CP 16 × PP 16 on 16,384 GPUs, so DP 8,
#: where the table prints 4), K and V all-gathered (§3.3.2). ZeRO-1: the paper's FSDP shards optimizer states
#: and gradients and keeps the weights whole (ZeRO-2), which no implementation the planner prices runs beside
#: a pipeline (:func:`parlab.decide.planner.unsupported`); ZeRO-1 keeps the fp32 gradients whole too.
LLAMA3_128K = Layout(tp=8, cp=16, pp=16, dp=8, zero_stage=1, cp_kind="all_gather")
#: Sequences per DP rank per step at 128k (16: 2 M tokens per step over DP 8's 8 × 16 sequences).
LLAMA3_BATCH_PER_DP = 16


def llama3_405b():
    """Llama 3 405B's published shape (Dubey et al. 2024, Table 3) as a transformers config; nothing downloaded."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072)


def mixtral_8x7b():
    """Mixtral 8x7B's published shape (Jiang et al. 2024, "Mixtral of Experts", Table 1: dim 4096, 32 layers,
    32 heads and 8 K/V heads, MLP width 14336, 8 experts, 2 per token, vocabulary 32000); nothing downloaded."""
    from transformers import MixtralConfig

    return MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                         max_position_embeddings=32768)


def llama3_128k(checkpointing: bool = False) -> Workload:
    """Llama 3 405B's 131,072-token stage as the planner's workload: one sequence per micro-batch, 16 per DP
    rank of :data:`LLAMA3_128K` per step, bf16 with fp32 gradients (§3.3.2: "FP32 gradient accumulation"),
    sequence parallelism, a fused attention kernel. ``checkpointing``: full recomputation (the paper does not
    list what its 128k stage recomputed; its 8K stage ran "without activation checkpointing")."""
    return Workload(llama3_405b(), global_batch=LLAMA3_BATCH_PER_DP * LLAMA3_128K.dp, seq_len=131072, micro_batch=1,
                    sequence_parallel=True, checkpointing=checkpointing)


def llama3_cluster() -> Cluster:
    """The 16,384 H100s of :data:`LLAMA3_128K`: DGX H100-like nodes of 8 (NVLink 4), :data:`LLAMA3_FABRIC`
    between them (a cp group of 16 spans 16 nodes, tp filling each)."""
    return cluster_of("h100", nodes=LLAMA3_128K.world_size // 8, inter=LLAMA3_FABRIC)
