"""The model shapes and the keys of the published runs of :mod:`~parlab.decide.planner.field_data`, each shape a
``dict`` that builds a ``transformers`` config: ``getattr(transformers, model["class"])(**kwargs)``.

Four keys say how a run's kernels and collectives ran, each read in the row's source and explained in its notes:
``fused`` (fused kernels: Transformer Engine, or ``torch.compile``; ``False`` for an eager run), ``tp_overlap`` (TP's
collectives overlapped with the matrix products: Megatron's ``tp_comm_overlap``, torchtitan's async TP),
``ep_overlap`` (the MoE all-to-alls overlapped: Megatron's ``moe_a2a_overlap``, DeepSeek's DualPipe) and
``offload_layers`` (Megatron-Core's ``cpu_offloading_num_layers``)."""

from __future__ import annotations

KEYS = (
    "name", "source", "framework", "gpu", "gpus", "model", "precision", "fp8_recipe", "fp8_gather",
    "seq_len", "global_batch", "micro_batch", "tp", "pp", "cp", "vp", "ep", "etp", "dp", "zero", "cp_kind",
    "recompute", "recompute_layers", "capacity_factor", "fused", "tp_overlap", "ep_overlap", "offload_layers", "tokens_per_s_per_gpu", "tflops_per_gpu", "flops_counting", "derived", "notes",
)

# -- model shapes -------------------------------------------------------------------------------------------
# Megatron-Bridge's model providers at commit 97ad8cc6f (the commit that added the 25.11 table):
# src/megatron/bridge/models/{llama/llama_provider.py, qwen/qwen_provider.py, gpt_oss/gpt_oss_provider.py,
# deepseek/deepseek_provider.py}. Llama 3's vocabulary, 128,256, is the tokenizer's (its config.json
# "vocab_size": 128256); the paper's own Table 3 gives layers, width, FFN width, heads, K/V heads.

LLAMA3_8B = {"class": "LlamaConfig", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
LLAMA3_70B = {"class": "LlamaConfig", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}
LLAMA31_405B = {"class": "LlamaConfig", "hidden_size": 16384, "intermediate_size": 53248,
                "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
                "vocab_size": 128256}
# Qwen3MoEModelProvider: kv_channels 128, 128 experts, top-8, no shared expert, vocabulary 151,936.
QWEN3_30B_A3B = {"class": "Qwen3MoeConfig", "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                 "vocab_size": 151936}
QWEN3_235B_A22B = {"class": "Qwen3MoeConfig", "hidden_size": 4096, "intermediate_size": 12288,
                   "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64,
                   "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                   "vocab_size": 151936}
# GPTOSSProvider120B: 36 layers, width 2880, 64 heads of 64, 8 K/V groups, 128 experts of 2880, top-4,
# vocabulary 201,088; every other layer sliding-window attention (window_attn_skip_freq 2).
GPT_OSS_120B = {"class": "GptOssConfig", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
                "num_experts_per_tok": 4, "vocab_size": 201088}
# DeepSeekV3ModelProvider: 61 layers (the first 3 dense, FFN 18432), width 7168, 128 MLA heads
# (q_lora_rank 1536, kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim 128),
# 256 routed experts of 2048 + 1 shared of 2048, top-8, vocabulary 129,280. num_mtp_layers: the
# multi-token-prediction module, 1 in DeepSeek-V3; the 25.11 table says "w/o MTP" or "w/ MTP" per row.
DEEPSEEK_V3 = {"class": "DeepseekV3Config", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
               "num_mtp_layers": 0}
