"""Published training runs of today's layouts (FP8, context parallelism, mixtures of experts, interleaved
pipelines; H100, H800, B200 and GB200: no A100 row, the A100 runs being in ``published.py``), as plain data
for checking the planner on runs it did not fit.

Each row of :data:`FIELD_RUNS` is a plain ``dict`` with the same keys (:data:`KEYS`); nothing here imports the
planner. ``model`` builds a ``transformers`` config: ``getattr(transformers, model["class"])(**kwargs)`` with the
other keys. Every value was read in the row's ``source``; a value worked out from others says how in
``derived``. :data:`HARDWARE_FACTS` holds figures for the GPUs these rows ran on: peaks, memory and links as
NVIDIA states them (some through a secondary page, which its ``source`` names) and collectives as measured.

Sources, in the order the rows come:

- NVIDIA Megatron-Bridge performance summary, **NeMo 25.11 container** (one release throughout), as kept in
  ``docs/performance-summary-archive.md`` of github.com/NVIDIA-NeMo/Megatron-Bridge (commit 067f987, section
  "25.11 NeMo Container", tables "System: DGX-GB200", "DGX-B200", "DGX-H100"). Its columns: Model, #-GPUs,
  Precision, GBS, MBS, Sequence Length, FSDP, TP, PP, CP, VP, EP, GA, Tokens / sec / GPU, Model TFLOP / sec / GPU.
  Its FLOPs: ``src/megatron/bridge/training/utils/flop_utils.py`` (:data:`MEGATRON_BRIDGE_FLOPS`).
- torchtitan's ``benchmarks/llama3_h100_202412_torchtitan.md`` (github.com/pytorch/torchtitan, the torchtitan
  team's runs with the torch/torchao/torchtitan of 2024-12-26; the paper, Liang et al. 2024, arXiv:2410.06511,
  was not in the stored sources, so its own tables are not used).
- Llama 3 (Dubey et al. 2024, arXiv:2407.21783v3), §3.3.2, Table 4.
- DeepSeek-V3 technical report (arXiv:2412.19437), §1 Table 1 and §3.
"""

from __future__ import annotations

KEYS = (
    "name", "source", "framework", "gpu", "gpus", "model", "precision", "fp8_recipe", "fp8_gather",
    "seq_len", "global_batch", "micro_batch", "tp", "pp", "cp", "vp", "ep", "etp", "dp", "zero", "cp_kind",
    "recompute", "capacity_factor", "tokens_per_s_per_gpu", "tflops_per_gpu", "flops_counting", "derived", "notes",
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

# -- NVIDIA Megatron-Bridge, NeMo 25.11 container ----------------------------------------------------------

MB_URL = ("https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html (archive: "
          "github.com/NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, commit 067f987)")
MEGATRON_BRIDGE_FLOPS = (
    "Megatron-Bridge src/megatron/bridge/training/utils/flop_utils.py num_floating_point_operations (commit "
    "97ad8cc6f): model FLOPs, recomputation not counted; per token 3 (fwd + 2 bwd) x 2 (FMA) x every GEMM: "
    "12*l*h*(ffn*3/2 if SwiGLU [routed top-k x moe_ffn + shared expert on MoE layers, dense ffn on dense "
    "layers]) + 12*l*h^2*(1 + kv_groups/heads + s/(2h))*(heads*kv_channels/h) [causal attention halved] "
    "(MLA: its own projection terms, attention s/2) + 6*h*V_padded (logits; times (1 + MTP layers)); "
    "SwiGLU's 3/2 only when the activation is F.silu (GPT-OSS's clamped GLU is counted at 1)")
MB_NOTE = (
    "Megatron-Core distributed optimizer unless FSDP > 0 (then Megatron-FSDP, sharding group "
    "#GPUs/(TP*PP)); the Llama 3 pretrain recipe's DDP: use_distributed_optimizer, grad_reduce_in_fp32, "
    "overlap_grad_reduce and overlap_param_gather all True (src/megatron/bridge/recipes/llama/llama3.py); "
    "sequence parallelism with TP > 1; MoE rows force-balance tokens over experts and are "
    "token-dropless (table footnote); the recipe preset behind a row (scripts/performance/configs, commit "
    "97ad8cc6f) may not match the printed layout exactly.")
SYSTEMS = {
    "gb200": "DGX-GB200 (GB200 NVL72: one NVLink domain of 72 GPUs; the table does not say how the GPUs "
             "map onto racks)",
    "b200": "DGX-B200 (8 GPUs per node on NVLink 5)",
    "h100": "DGX-H100 (8 GPUs per node on NVLink 4)",
}
TABLE = {"gb200": "System: DGX-GB200", "b200": "System: DGX-B200", "h100": "System: DGX-H100"}
RECIPES = {  # the table's precision word -> (precision, fp8 recipe); Megatron-Bridge mixed_precision.py
    "BF16": ("bf16", None),
    "FP8-CS": ("fp8", "tensorwise"),  # bf16_with_fp8_current_scaling_mixed: fp8_recipe "tensorwise"
    "FP8-MX": ("fp8", "mxfp8"),  # bf16_with_mxfp8_mixed: fp8_recipe "mxfp8"
}


def _mb(name, gpu, model, gpus, prec, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, ga, tok, tfl, printed,
        notes="", recompute="not stated"):
    """One row of the 25.11 tables; ``printed`` is the row as the table prints it."""
    precision, recipe = RECIPES[prec]
    dp = gpus // (tp * pp * cp)
    assert dp * tp * pp * cp == gpus, name
    derived = f"dp = {gpus}/({tp}*{pp}*{cp}) = {dp}."
    if gbs != dp * mbs * ga:
        derived += (f" The printed GA ({ga}) is not GBS/(dp*MBS) = {gbs}/({dp}*{mbs}) = {gbs / (dp * mbs):g}:"
                    " the table's own inconsistency, recorded as printed.")
    return {
        "name": name,
        "source": f"{MB_URL}, '25.11 NeMo Container', Pre-Training Performance, {TABLE[gpu]}: \"{printed}\"",
        "framework": "megatron",
        "gpu": gpu, "gpus": gpus, "model": model,
        "precision": precision, "fp8_recipe": recipe,
        "fp8_gather": True if recipe else None,
        "seq_len": seq, "global_batch": gbs, "micro_batch": mbs,
        "tp": tp, "pp": pp, "cp": cp, "vp": vp or 1, "ep": ep,
        "etp": 1 if ep > 1 else None,
        "dp": dp,
        "zero": "fsdp" if fsdp else "distributed optimizer",
        "cp_kind": "p2p" if cp > 1 else None,
        "recompute": recompute,
        "capacity_factor": None,
        "tokens_per_s_per_gpu": tok, "tflops_per_gpu": tfl,
        "flops_counting": MEGATRON_BRIDGE_FLOPS,
        "derived": derived,
        "notes": " ".join(x for x in (SYSTEMS[gpu] + ".", MB_NOTE, notes,
                                      "fp8_gather: the recipe's fp8_param_gather=True (mixed_precision.py)."
                                      if recipe else "",
                                      "etp 1: the MoE recipes' expert_tensor_parallel_size=1." if ep > 1 else "",
                                      "cp_kind: the recipes set no cp_comm_type; Megatron-LM's --cp-comm-type "
                                      "defaults to ['p2p'] (ring)." if cp > 1 else "")
                         if x),
    }


DSV3_NOMTP = {**DEEPSEEK_V3, "num_mtp_layers": 0}
DSV3_MTP = {**DEEPSEEK_V3, "num_mtp_layers": 1}
MX_NOTE = ("FP8-MX: the figure in parentheses; the footnote: 'The numbers in normal parentheses indicate the use "
           "of different quantization granularities: In case of GB200 and B200 systems, 32x32 for both weights "
           "and activations.'")

_MB_ROWS = (
    # DGX-GB200
    _mb("Llama 3 8B, 8 GB200, FP8 current scaling", "gb200", LLAMA3_8B, 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1,
        None, 1, 8, 31508, 1622,
        "LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 31508 (29789) | 1622 (1533)",
        "Recipe preset: CUDA graphs (cuda_graph_impl 'local', scope 'full_iteration')."),
    _mb("Llama 3 8B, 8 GB200, MXFP8", "gb200", LLAMA3_8B, 8, "FP8-MX", 128, 2, 8192, 0, 1, 1, 1,
        None, 1, 8, 29789, 1533,
        "LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 31508 (29789) | 1622 (1533)",
        MX_NOTE),
    _mb("Llama 3 70B, 64 GB200, FP8 current scaling, FSDP", "gb200", LLAMA3_70B, 64, "FP8-CS", 256, 2, 8192, 64,
        1, 1, 1, 1, 1, 2, 4312, 1937,
        "LLAMA3_70B | 64 | FP8-CS | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | 1 | 1 | 2 | 4312 | 1937",
        "Megatron-FSDP over all 64 GPUs; the recipe preset (GBS 128 there) offloads 40 layers' activations to "
        "the Grace CPU (cpu_offloading_num_layers=40) with fsdp_double_buffer."),
    _mb("Llama 3.1 405B, 256 GB200, FP8 current scaling", "gb200", LLAMA31_405B, 256, "FP8-CS", 1536, 1, 8192, 0,
        4, 16, 1, 4, 1, 384, 813, 2053,
        "LLAMA3.1_405B | 256 | FP8-CS | 1536 | 1 | 8192 | 0 | 4 | 16 | 1 | 4 | 1 | 384 | 813 | 2053",
        "126 layers over PP 16 x VP 4 = 64 chunks: uneven."),
    _mb("DeepSeek-V3 (no MTP), 256 GB200, BF16", "gb200", DSV3_NOMTP, 256, "BF16", 4096, 1, 4096, 0, 1, 4, 1, 4,
        64, 64, 3139, 782,
        "DeepSeekV3 (w/o MTP) | 256 | BF16 | 4096 | 1 | 4096 | 0 | 1 | 4 | 1 | 4 | 64 | 64 | 3139 | 782",
        "EP 64 inside the NVL72 NVLink domain; recipe preset: HybridEP dispatcher (moe_flex_dispatcher_backend "
        "'hybridep'), recompute_modules ['mla_up_proj'], CUDA graphs on router and preprocess.",
        recompute="selective (recipe preset: mla_up_proj)"),
    _mb("DeepSeek-V3 (no MTP), 256 GB200, MXFP8", "gb200", DSV3_NOMTP, 256, "FP8-MX", 4096, 1, 4096, 0, 1, 8, 1, 4,
        32, 128, 4018, 1003,
        "DeepSeekV3 (w/o MTP) | 256 | FP8-MX | 4096 | 1 | 4096 | 0 | 1 | 8 | 1 | 4 | 32 | 128 | 4018 | 1003",
        "61 layers over PP 8 x VP 4 = 32 chunks: uneven.",
        recompute="selective (recipe preset: mla_up_proj)"),
    _mb("GPT-OSS 120B, 64 GB200, BF16", "gb200", GPT_OSS_120B, 64, "BF16", 1280, 1, 8192, 0, 1, 1, 1, 1, 64, 20,
        15876, 488,
        "GPT OSS 120B | 64 | BF16 | 1280 | 1 | 8192 | 0 | 1 | 1 | 1 | 1 | 64 | 20 | 15876 | 488",
        "Every other layer uses 128-token sliding-window attention (the FLOPs formula counts full causal "
        "attention on every layer).", recompute="selective (recipe preset: layernorm, moe_act)"),
    _mb("Qwen3 30B-A3B, 8 GB200, MXFP8", "gb200", QWEN3_30B_A3B, 8, "FP8-MX", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 16,
        23766, 547,
        "Qwen3_30B_a3B | 8 | FP8-MX | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 16 | 23766 | 547"),
    _mb("Qwen3 235B-A22B, 256 GB200, BF16", "gb200", QWEN3_235B_A22B, 256, "BF16", 8192, 1, 4096, 0, 1, 8, 1, 3,
        32, 256, 4916, 728,
        "Qwen3_235B_a22B | 256 | BF16 | 8192 | 1 | 4096 | 0 | 1 | 8 | 1 | 3 | 32 | 256 | 4916 | 728",
        "94 layers over PP 8 x VP 3 = 24 chunks: uneven."),
    # DGX-B200
    _mb("Llama 3 8B, 8 B200, FP8 current scaling", "b200", LLAMA3_8B, 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1,
        None, 1, 8, 30624, 1576,
        "LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 30624 (29521) | 1576 (1519)",
        "Recipe preset: CUDA graphs (full iteration)."),
    _mb("Llama 3 8B, 8 B200, MXFP8", "b200", LLAMA3_8B, 8, "FP8-MX", 128, 2, 8192, 0, 1, 1, 1,
        None, 1, 8, 29521, 1519,
        "LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 30624 (29521) | 1576 (1519)",
        MX_NOTE),
    _mb("Llama 3.1 405B, 128 B200, FP8 current scaling, CP 2", "b200", LLAMA31_405B, 128, "FP8-CS", 64, 1, 8192, 0,
        4, 8, 2, 8, 1, 32, 661, 1667,
        "LLAMA3.1_405B | 128 | FP8-CS (FP8-MX) | 64 | 1 | 8192 | 0 | 4 | 8 | 2 | 8 | 1 | 32 | 661 (624) | 1667 (1576)",
        "TP 4 x CP 2 = 8 GPUs: one node; 126 layers over PP 8 x VP 8 = 64 chunks: uneven."),
    _mb("Llama 3.1 405B, 128 B200, MXFP8, CP 2", "b200", LLAMA31_405B, 128, "FP8-MX", 64, 1, 8192, 0,
        4, 8, 2, 8, 1, 32, 624, 1576,
        "LLAMA3.1_405B | 128 | FP8-CS (FP8-MX) | 64 | 1 | 8192 | 0 | 4 | 8 | 2 | 8 | 1 | 32 | 661 (624) | 1667 (1576)",
        MX_NOTE + " TP 4 x CP 2 = one node."),
    _mb("DeepSeek-V3 (with MTP), 256 B200, MXFP8", "b200", DSV3_MTP, 256, "FP8-MX", 2048, 1, 4096, 0, 1, 16, 1, 1,
        8, 128, 2139, 557,
        "DeepSeekV3 (w/ MTP) | 256 | FP8-MX | 2048 | 1 | 4096 | 0 | 1 | 16 | 1 | 1 | 8 | 128 | 2139 | 557",
        "EP 8: one node. MTP: one multi-token-prediction layer, counted by the FLOPs formula.",
        recompute="selective (recipe preset: mla_up_proj)"),
    _mb("GPT-OSS 120B, 64 B200, BF16", "b200", GPT_OSS_120B, 64, "BF16", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 2,
        8213, 223,
        "GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 2 | 8213 | 223",
        "Sliding-window attention on every other layer.", recompute="selective (recipe preset: layernorm, moe_act)"),
    _mb("Qwen3 30B-A3B, 8 B200, MXFP8", "b200", QWEN3_30B_A3B, 8, "FP8-MX", 512, 1, 4096, 0, 1, 1, 1, 1, 8, 64,
        9299, 214,
        "Qwen3_30B_a3B | 8 | FP8-MX | 512 | 1 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 64 | 9299 | 214",
        "Same model and layout as the GB200 row but micro-batch 1 and 2.6x slower: a pricer should not fit it."),
    _mb("Qwen3 235B-A22B, 64 B200, MXFP8", "b200", QWEN3_235B_A22B, 64, "FP8-MX", 1024, 1, 4096, 0, 1, 8, 1, 2, 8,
        128, 3269, 484,
        "Qwen3_235B_a22B | 64 | FP8-MX | 1024 | 1 | 4096 | 0 | 1 | 8 | 1 | 2 | 8 | 128 | 3269 | 484",
        "EP 8: one node; 94 layers over PP 8 x VP 2: uneven."),
    # DGX-H100
    _mb("Llama 3 8B, 8 H100, FP8 current scaling, FSDP", "h100", LLAMA3_8B, 8, "FP8-CS", 128, 1, 8192, 8, 1, 1, 1,
        None, 1, 16, 14451, 744,
        "LLAMA3_8B | 8 | FP8-CS | 128 | 1 | 8192 | 8 | 1 | 1 | 1 | n/a | 1 | 16 | 14451 | 744",
        "Recipe preset (DDP there): recompute_num_layers=5."),
    _mb("Llama 3 70B, 64 H100, FP8 current scaling", "h100", LLAMA3_70B, 64, "FP8-CS", 128, 1, 8192, 0, 4, 8, 1, 5,
        1, 64, 1602, 719,
        "LLAMA3_70B | 64 | FP8-CS | 128 | 1 | 8192 | 0 | 4 | 8 | 1 | 5 | 1 | 64 | 1602 | 719",
        "Recipe: TP communication overlap with userbuffers (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192)."),
    _mb("Llama 3.1 405B, 1024 H100, FP8 current scaling, CP 2", "h100", LLAMA31_405B, 1024, "FP8-CS", 512, 1, 8192,
        0, 8, 8, 2, 8, 1, 64, 292, 737,
        "LLAMA3.1_405B | 1024 | FP8-CS | 512 | 1 | 8192 | 0 | 8 | 8 | 2 | 8 | 1 | 64 | 292 | 737",
        "TP 8 fills a node, so the CP 2 ring crosses InfiniBand."),
    _mb("GPT-OSS 120B, 64 H100, BF16", "h100", GPT_OSS_120B, 64, "BF16", 512, 4, 4096, 0, 1, 4, 1, 1, 8, 2,
        5630, 153,
        "GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 4 | 1 | 1 | 8 | 2 | 5630 | 153",
        "Sliding-window attention on every other layer.", recompute="selective (recipe preset: layernorm, moe_act)"),
    _mb("Qwen3 30B-A3B, 16 H100, FP8 current scaling", "h100", QWEN3_30B_A3B, 16, "FP8-CS", 512, 2, 4096, 0, 1, 2,
        1, 24, 8, 32, 5275, 121,
        "Qwen3_30B_a3B | 16 | FP8-CS | 512 | 2 | 4096 | 0 | 1 | 2 | 1 | 24 | 8 | 32 | 5275 | 121",
        "48 layers over PP 2 x VP 24: one layer per chunk; recipe preset: moe_a2a_overlap."),
    _mb("Qwen3 235B-A22B, 256 H100, FP8 current scaling", "h100", QWEN3_235B_A22B, 256, "FP8-CS", 2048, 1, 4096, 0,
        2, 8, 1, 4, 32, 128, 1575, 233,
        "Qwen3_235B_a22B | 256 | FP8-CS | 2048 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 | 32 | 128 | 1575 | 233",
        "EP 32 spans 4 nodes (all-to-all over InfiniBand); recipe preset: moe_a2a_overlap."),
)

# -- torchtitan, end of 2024 ---------------------------------------------------------------------------------

TT_URL = "github.com/pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit b5bcd76)"
TT_FLOPS = "no FLOPs: the benchmark prints tokens per second per GPU (TPS/GPU) only (it declines MFU under Float8)"
TT_NOTE = ("Grand Teton hosts: 8 H100 with 96 GB HBM2e (2.4 TB/s) at the default 500 W power limit, not the "
           "700 W H100 SXM 80 GB; 400 Gb/s RDMA per GPU between hosts. TPS/GPU read at iteration 90. FSDP2 "
           "(per-parameter sharding); Float8 is torchao's Float8Linear on nn.Linear, dynamic (per-tensor, "
           "current) scaling by default at the benchmark's commit 9dec370 (config_manager.py "
           "--float8.scaling_type_input default 'dynamic').")


def _tt(name, table, printed, model, gpus, tok, *, seq=8192, local_batch, tp=1, pp=1, cp=1, vp=1, micro_batch=None,
        fp8=False, compiled=True, recompute, derived="", notes=""):
    dp = gpus // (tp * pp * cp)
    assert dp * tp * pp * cp == gpus, name
    return {
        "name": name,
        "source": f"{TT_URL}, {table}: \"{printed}\"",
        "framework": "torchtitan",
        "gpu": "h100", "gpus": gpus, "model": model,
        "precision": "fp8" if fp8 else "bf16", "fp8_recipe": "tensorwise" if fp8 else None, "fp8_gather": None,
        "seq_len": seq, "global_batch": local_batch * dp,
        "micro_batch": micro_batch if micro_batch is not None else (local_batch if pp == 1 else None),
        "tp": tp, "pp": pp, "cp": cp, "vp": vp, "ep": 1, "etp": None, "dp": dp,
        "zero": "fsdp", "cp_kind": "all_gather" if cp > 1 else None,
        "recompute": recompute, "capacity_factor": None,
        "tokens_per_s_per_gpu": tok, "tflops_per_gpu": None, "flops_counting": TT_FLOPS,
        "derived": " ".join(x for x in (
            f"dp = {gpus}/({tp}*{pp}*{cp}) = {dp}; global batch = local batch {local_batch} x dp.", derived) if x),
        "notes": " ".join(x for x in (TT_NOTE, "torch.compile on." if compiled else "eager (no torch.compile).",
                                      "cp_kind: torchtitan's default context_parallel_rotate_method 'allgather' "
                                      "(config_manager.py at the benchmark's commit 9dec370)." if cp > 1 else "",
                                      "fp8_gather unknown: the benchmark does not say whether "
                                      "enable_fsdp_float8_all_gather was on (the repo's 405B toml at 9dec370 "
                                      "sets it)." if fp8 else "", notes) if x),
    }


T1 = "Table 1, '1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local batch size 2, global batch size 16. Selective activation checkpointing.'"
T2 = "Table 2, 'FSDP + CP + torch.compile + Float8. Llama 3.1 8B model. 8 GPUs. Local batch size 1. Full activation checkpointing.'"
T3 = "Table 3, '1D Parallelism (FSDP). Llama 3.1 8B model. 128 GPUs. Local batch size 2, global batch size 256. Selective activation checkpointing.'"
T4 = "Table 4, '2D parallelism (FSDP + TP) + torch.compile + Float8. Llama 3.1 70B model. 256 GPUs (FSDP 32, TP 8). Local batch size 16, global batch size 512. Full activation checkpointing.'"
T5 = "Table 5, '3D parallelism (FSDP + TP + PP) + torch.compile + Float8 + AsyncTP. Llama 3.1 405B model. 512 GPUs (FSDP 8, TP 8, PP8). Local batch size 32, global batch size 256. Full activation checkpointing.'"
T6 = "Table 6, '4D parallelism (FSDP + TP + PP + CP) + torch.compile + Float8 + AsyncTP + 1F1B. Llama 3.1 405B model. 512 GPUs (TP 8, PP8). Local batch size 8. Full activation checkpointing.'"
SAC = "selective (torchtitan 'op' policy)"
PP_MB = ("micro_batch: the benchmark does not give the number of micro-batches; torchtitan's default at 9dec370 "
         "is one per pipeline stage (pipeline_parallel_microbatches = PP), i.e. local batch / 8.")

_TT_ROWS = (
    _tt("Llama 3.1 8B, 8 H100, FSDP, eager", T1, "FSDP | 5,762 | 82.4", LLAMA3_8B, 8, 5762, local_batch=2,
        compiled=False, recompute=SAC),
    _tt("Llama 3.1 8B, 8 H100, FSDP, compiled", T1, "FSDP + torch.compile | 6,667 | 77.0", LLAMA3_8B, 8, 6667,
        local_batch=2, recompute=SAC),
    _tt("Llama 3.1 8B, 8 H100, FSDP, compiled, Float8", T1, "FSDP + torch.compile + Float8 | 8,532 | 76.8",
        LLAMA3_8B, 8, 8532, local_batch=2, fp8=True, recompute=SAC),
    _tt("Llama 3.1 8B, 128 H100, FSDP, compiled", T3, "FSDP + torch.compile | 6,514 | 62.0", LLAMA3_8B, 128, 6514,
        local_batch=2, recompute=SAC),
    _tt("Llama 3.1 8B, 128 H100, FSDP, compiled, Float8", T3, "FSDP + torch.compile + Float8 | 8,380 | 61.8",
        LLAMA3_8B, 128, 8380, local_batch=2, fp8=True, recompute=SAC),
    _tt("Llama 3.1 8B, 8 H100, 32k tokens, FSDP 8, Float8", T2, "FSDP 8, CP 1 | 32768 | 3,890 | 83.9", LLAMA3_8B,
        8, 3890, seq=32768, local_batch=1, fp8=True, recompute="full"),
    _tt("Llama 3.1 8B, 8 H100, 64k tokens, FSDP 4 x CP 2, Float8", T2, "FSDP 4, CP 2 | 65536 | 2,540 | 84.2",
        LLAMA3_8B, 8, 2540, seq=65536, cp=2, local_batch=1, fp8=True, recompute="full"),
    _tt("Llama 3.1 8B, 8 H100, 128k tokens, FSDP 2 x CP 4, Float8", T2, "FSDP 2, CP 4 | 131072 | 1,071 | 84.0",
        LLAMA3_8B, 8, 1071, seq=131072, cp=4, local_batch=1, fp8=True, recompute="full"),
    _tt("Llama 3.1 8B, 8 H100, 256k tokens, CP 8, Float8", T2, "FSDP 1, CP 8 | 262144 | 548 | 84.5", LLAMA3_8B,
        8, 548, seq=262144, cp=8, local_batch=1, fp8=True, recompute="full"),
    _tt("Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, Float8", T4, "2D | 829 | 71.9", LLAMA3_70B, 256, 829, tp=8,
        local_batch=16, fp8=True, recompute="full"),
    _tt("Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, Float8, async TP", T4, "2D + AsyncTP | 876 | 67.6", LLAMA3_70B,
        256, 876, tp=8, local_batch=16, fp8=True, recompute="full", notes="Async TP: TP collectives overlapped "
        "with the matrix products (micro-pipelined)."),
    _tt("Llama 3.1 405B, 512 H100, FSDP 8 x TP 8 x PP 8, Float8, 1F1B", T5, "1F1B | 100 | 82.5", LLAMA31_405B, 512,
        100, tp=8, pp=8, local_batch=32, micro_batch=4, fp8=True, recompute="full", derived=PP_MB,
        notes="Async TP on."),
    _tt("Llama 3.1 405B, 512 H100, FSDP 8 x TP 8 x PP 8, Float8, interleaved 1F1B", T5, "Interleaved 1F1B | 128 | 72.7",
        LLAMA31_405B, 512, 128, tp=8, pp=8, vp=2, local_batch=32, micro_batch=4, fp8=True, recompute="full",
        derived=PP_MB + " vp 2: torchtitan's default for a multi-stage schedule without split points "
        "(generate_split_points, num_stages_per_rank = 2).", notes="Async TP on."),
    _tt("Llama 3.1 405B, 512 H100, 32k tokens, FSDP 8 x TP 8 x PP 8, Float8", T6, "FSDP 8, CP 1 | 32768 | 76 | 75.3",
        LLAMA31_405B, 512, 76, seq=32768, tp=8, pp=8, local_batch=8, micro_batch=1, fp8=True, recompute="full",
        derived=PP_MB, notes="Async TP on; 1F1B."),
    _tt("Llama 3.1 405B, 512 H100, 64k tokens, FSDP 4 x CP 2 x TP 8 x PP 8, Float8", T6,
        "FSDP 4, CP 2 | 65536 | 47 | 75.9", LLAMA31_405B, 512, 47, seq=65536, tp=8, pp=8, cp=2, local_batch=8,
        micro_batch=1, fp8=True, recompute="full", derived=PP_MB, notes="Async TP on; 1F1B."),
    _tt("Llama 3.1 405B, 512 H100, 128k tokens, FSDP 2 x CP 4 x TP 8 x PP 8, Float8", T6,
        "FSDP 2, CP 4 | 131072 | 31 | 77.1", LLAMA31_405B, 512, 31, seq=131072, tp=8, pp=8, cp=4, local_batch=8,
        micro_batch=1, fp8=True, recompute="full", derived=PP_MB, notes="Async TP on; 1F1B."),
    _tt("Llama 3.1 405B, 512 H100, 256k tokens, CP 8 x TP 8 x PP 8, Float8", T6, "FSDP 1, CP 8 | 262144 | 16 | 84.9",
        LLAMA31_405B, 512, 16, seq=262144, tp=8, pp=8, cp=8, local_batch=8, micro_batch=1, fp8=True,
        recompute="full", derived=PP_MB, notes="Async TP on; 1F1B."),
)

# -- Llama 3, Table 4 ----------------------------------------------------------------------------------------

L3_TABLE = ("Dubey et al. 2024, 'The Llama 3 Herd of Models', arXiv:2407.21783v3, §3.3.2, Table 4 'Scaling "
            "configurations and MFU for each stage of Llama 3 405B pre-training' (GPUs | TP | CP | PP | DP | Seq. "
            "Len. | Batch size/DP | Tokens/Batch | TFLOPs/GPU | BF16 MFU)")
L3_FLOPS = ("unknown: the paper states 'BF16 Model FLOPs Utilization (MFU; Chowdhery et al. (2023))' but not its "
            "formula (PaLM's MFU is 6N + 12*L*H*Q*T per token, attention not halved for causality; whether Llama 3 "
            "used it is not said), so tokens per second are not derived")
L3_NOTE = ("Meta's Grand Teton H100 (80 GB HBM3, 700 W), 8 per server on NVLink, RoCE 400 Gb/s per GPU. "
           "§3.3.2: FSDP shards optimizer states and gradients, 'for model shards they do not reshard after "
           "forward computation'; gradients reduce-scattered in FP32; parallelism order [TP, CP, PP, DP]; an "
           "interleaved schedule with V stages per pipeline rank (V not stated) and a tunable number N of "
           "contiguous micro-batches (micro-batch size not stated); the first and last stages hold one Transformer "
           "layer fewer; NCCLX (Meta's fork of NCCL).")


def _l3(name, gpus, tp, cp, pp, dp, seq, per_dp, tflops, mfu, extra=""):
    assert gpus == tp * cp * pp * dp, name
    return {
        "name": name,
        "source": f"{L3_TABLE}: \"{gpus:,} | {tp} | {cp} | {pp} | {dp} | {seq:,} | {per_dp} | 16M | {tflops} | {mfu}\"",
        "framework": "meta", "gpu": "h100", "gpus": gpus, "model": LLAMA31_405B,
        "precision": "bf16", "fp8_recipe": None, "fp8_gather": False,
        "seq_len": seq, "global_batch": per_dp * dp, "micro_batch": None,
        "tp": tp, "pp": pp, "cp": cp, "vp": 1, "ep": 1, "etp": None, "dp": dp,
        "zero": "fsdp (parameters kept after forward: ZeRO-2-like)", "cp_kind": "all_gather" if cp > 1 else None,
        "recompute": "none" if seq <= 8192 else "not stated",
        "capacity_factor": None,
        "tokens_per_s_per_gpu": None, "tflops_per_gpu": tflops, "flops_counting": L3_FLOPS,
        "derived": f"global batch = batch size/DP {per_dp} x DP {dp} = {per_dp * dp} sequences "
                   f"({per_dp * dp * seq:,} tokens, the table's '16M').{extra}",
        "notes": L3_NOTE + (" CP (§3.3.2): the sequence cut into 2 x CP chunks, rank i holding chunks i and "
                            "2CP-1-i; 'an all-gather based method where the key (K) and value (V) tensors are "
                            "first all-gathered', the all-gather exposed." if cp > 1 else
                            " Recompute none: 'Llama 3 could be pre-trained on sequences of 8K tokens without "
                            "activation checkpointing' (§3.3.2).")
                 + " vp recorded as 1 though the schedule is interleaved: V is not given.",
    }


_L3_ROWS = (
    _l3("Llama 3 405B, 8,192 H100, 8k tokens", 8192, 8, 1, 16, 64, 8192, 32, 430, "43%"),
    _l3("Llama 3 405B, 16,384 H100, 8k tokens", 16384, 8, 1, 16, 128, 8192, 16, 400, "41%"),
    _l3("Llama 3 405B, 16,384 H100, 128k tokens, CP 16", 16384, 8, 16, 16, 8, 131072, 16, 380, "38%",
        " DP 8 = 16,384/(8*16*16); arXiv v1's table printed DP 4, which does not multiply out; v3 prints 8."),
)

# -- DeepSeek-V3 -------------------------------------------------------------------------------------------

_DSV3_ROW = {
    "name": "DeepSeek-V3 671B, 2,048 H800, FP8 blockwise",
    "source": ("DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', arXiv:2412.19437: §1 / Table 1 'training "
               "DeepSeek-V3 on each trillion tokens requires only 180K H800 GPU hours, i.e., 3.7 days on our "
               "cluster with 2048 H800 GPUs'; §3.2 'DeepSeek-V3 applies 16-way Pipeline Parallelism (PP), 64-way "
               "Expert Parallelism (EP) spanning 8 nodes, and ZeRO-1 Data Parallelism (DP)' and 'without using "
               "costly Tensor Parallelism (TP)'; §3.3.2 activations '1x128 tile', weights '128x128 block'; §4.2 "
               "sequence length 4K, batch size 'gradually increased from 3072 to 15360 in the training of the "
               "first 469B tokens, and then keeps 15360'"),
    "framework": "deepseek", "gpu": "h800", "gpus": 2048, "model": {**DEEPSEEK_V3, "num_mtp_layers": 1},
    "precision": "fp8", "fp8_recipe": "blockwise", "fp8_gather": None,
    "seq_len": 4096, "global_batch": 15360, "micro_batch": None,
    "tp": 1, "pp": 16, "cp": 1, "vp": 2, "ep": 64, "etp": 1, "dp": 128,
    "zero": "zero1", "cp_kind": None,
    "recompute": "selective (§3.2.3: RMSNorm and MLA up-projections recomputed in backward)",
    "capacity_factor": None,
    "tokens_per_s_per_gpu": 1e12 / (180e3 * 3600),
    "tflops_per_gpu": None,
    "flops_counting": "none published: the report gives GPU hours per trillion tokens, not FLOP/s",
    "derived": ("tokens/s/GPU = 1e12 tokens / (180,000 GPU-hours x 3600 s) = 1543, an average over the whole "
                "pre-training (batch ramp, restarts and evaluation included); dp = 2048/16 = 128 with EP 64 "
                "inside it; global batch: the 15,360 it kept after 469B tokens; vp 2: DualPipe holds two "
                "model chunks per rank (§3.2.1 Table 2, 'Parameter 2x')."),
    "notes": ("DualPipe: bidirectional pipeline overlapping each chunk's all-to-all and PP communication with "
              "computation; tokens dispatched to at most 4 nodes; 20 SMs given to communication (§3.2.2); H800 "
              "'NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)' (§3.2.2); MTP depth 1; "
              "master weights and "
              "gradients FP32, Adam moments BF16; dropless with auxiliary-loss-free balancing; embedding, output "
              "head, gating, norms and attention in BF16/FP32 (§3.3.1); no token dropping (§2.1.2). micro_batch not stated."),
}

FIELD_RUNS = _MB_ROWS + _TT_ROWS + _L3_ROWS + (_DSV3_ROW,)

# -- hardware ------------------------------------------------------------------------------------------------

TT_PEAK = ("github.com/pytorch/torchtitan torchtitan/tools/utils.py get_peak_flops (commit b5bcd76), quoting NVIDIA: ")
KLOCKWOOD = ("glennklockwood.com/garden/processors/B200 (tables of NVIDIA's Blackwell architecture technical brief): ")
MLPERF_B200 = ("MLCommons inference_results_v6.0, closed/Nebius/systems/nebius_b200_n1.json (a DGX/HGX B200 node as "
               "its submitter describes it): ")

HARDWARE_FACTS = (
    # -- compute
    {"what": "B200 (HGX/DGX, 1000 W) dense BF16 tensor peak", "value": 2250, "unit": "TFLOP/s per GPU",
     "source": TT_PEAK + "'B300' or 'B200': 'data from https://nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-"
               "3384703' -> 2.25e15; also " + KLOCKWOOD + "'The HGX variant of B200 ... at 1,000 W: BF16 2250 | 4500'"},
    {"what": "GB200 (1200 W) dense BF16 tensor peak", "value": 2500, "unit": "TFLOP/s per GPU",
     "source": TT_PEAK + "'GB200': 'BF16 dense per GPU: 2,500 TFLOPS (half of 5,000 TFLOPS with sparsity) GB200 data "
               "from https://www.nvidia.com/en-us/data-center/dgx-gb200' -> 2.5e15; also " + KLOCKWOOD +
               "'the GB200 variant of B200 when configured to 1,200 W: BF16 2500 | 5000'"},
    {"what": "B200 (HGX/DGX, 1000 W) dense FP8 tensor peak", "value": 4500, "unit": "TFLOP/s per GPU",
     "source": KLOCKWOOD + "HGX B200 at 1,000 W: 'FP8 | 4500 | 9000' (dense | sparse); secondary: NVIDIA's own page "
               "was not in the stored corpora"},
    {"what": "GB200 (1200 W) dense FP8 tensor peak", "value": 5000, "unit": "TFLOP/s per GPU",
     "source": KLOCKWOOD + "GB200 at 1,200 W: 'FP8 | 5000 | 10000' (dense | sparse); secondary as above"},
    # -- memory
    {"what": "B200 HBM3e capacity (DGX/HGX B200)", "value": 180, "unit": "GB per GPU",
     "source": MLPERF_B200 + "'accelerator_model_name': 'NVIDIA B200-SXM-180GB', 'accelerator_memory_capacity': "
               "'180 GB'; DGX B200: 'Eight NVIDIA Blackwell GPUs with 1,440 GB total HBM3e memory and 64 TB/s HBM3e "
               "bandwidth' (brent-newsom-nvidia.github.io/AIPS-Boom/wiki/NVIDIA-DGX-B200, from nvidia.com/en-us/"
               "data-center/dgx-b200)"},
    {"what": "B200 HBM3e bandwidth (DGX B200: 64 TB/s over 8 GPUs)", "value": 8, "unit": "TB/s per GPU",
     "source": "DGX B200 '1,440 GB total HBM3e memory and 64 TB/s HBM3e bandwidth' (AIPS-Boom wiki, from "
               "nvidia.com/en-us/data-center/dgx-b200), divided by 8 GPUs"},
    {"what": "GB200 HBM3e capacity as a GB200 NVL72 node reports it", "value": 186, "unit": "GB per GPU",
     "source": "MLCommons inference_results_v6.1, closed/Crusoe/systems/GB200-NVL72_GB200-186GB_aarch64x16_Dynamo.json: "
               "'accelerator_memory_capacity': '186 GB', 'accelerator_model_name': 'NVIDIA GB200'"},
    # -- NVLink 5
    {"what": "NVLink 5 links per GPU (GB200)", "value": 18, "unit": "links",
     "source": "docs.nvidia.com/health-validation/reference/checks/nvlink, nvlink_bandwidth_count_speed: "
               "'expected_link_count 18 ... GB200 exposes 18 NVLink 5 links'"},
    {"what": "NVLink 5 per-link speed (GB200; H100's NVLink 4 for comparison: 26562)", "value": 53125,
     "unit": "MB/s per link",
     "source": "docs.nvidia.com/health-validation/reference/checks/nvlink: 'expected_speed_mbytes_per_sec GB200: "
               "53125, GB300: 53125, H100: 26562'"},
    {"what": "NVLink 5 bandwidth per GPU, both directions together (900 GB/s each way)", "value": 1800,
     "unit": "GB/s per GPU",
     "source": MLPERF_B200 + "'accelerator_interconnect': '18x 5th Gen NVLink, 14.4 TB/s aggregated bandwidth' for 8 "
               "GPUs; Azure/AI-benchmarking-guide issue #7: 'Each GPU has 900GB/s unidirectional bw to nvswitch'"},
    {"what": "NCCL's modelled NVLink bandwidth per link, Blackwell (SM100); Hopper (SM90) is 20.6", "value": 40.1,
     "unit": "GB/s per link per direction",
     "source": "NVIDIA/nccl src/graph/topo.h: '#define SM90_NVLINK_BW 20.6', '#define SM100_NVLINK_BW 40.1'; NVIDIA/"
               "nccl issue #1807 (B200, NCCL 2.27): 'in nccl log, the maxBw is 720' (18 x 40.1 = 721.8)"},
    {"what": "NVLink domain of a GB200 NVL72 rack", "value": 72, "unit": "GPUs (36 Grace CPUs, 130 TB/s NVLink "
                                                                         "Switch System)",
     "source": "datacrunch.io/blog/nvidia-gb200-nvl72-for-ai-training-and-inference: 'a customized datacenter rack "
               "containing 36 Grace CPUs and 72 Blackwell GPUs connected by a 130 TB/s NVLink Switch System' "
               "(130 TB/s / 72 = 1.8 TB/s per GPU); NVIDIA Mission Control docs (nvlinkinfo): NVLink 5 supports "
               "'up to 576 GPUs in a single NVLink domain'"},
    # -- measured collectives
    {"what": "measured all-reduce bus bandwidth, 72 GPUs of one GB200 NVL72 rack, 8 GiB", "value": 834.57,
     "unit": "GB/s busbw (out-of-place; 846.82 in-place; 4 GiB: 839.16)",
     "source": "coreweave/nccl-tests pull request #43 'Add a GB200 NVL72 example': '8589934592 2147483648 float sum -1 "
               "20299 423.16 834.57 0 20006 429.37 846.82 0' (all_reduce_perf, full rack)"},
    {"what": "measured all-reduce bus bandwidth, 8 B200 in one node", "value": 830,
     "unit": "GB/s busbw ('830+')",
     "source": "NVIDIA/nccl issue #1807: 'should the all_reduce_perf performance of 8 B200s in a single machine reach "
               "900+? Ours is 830+.' (NCCL 2.27.1)"},
    {"what": "measured GPU-to-GPU copy bandwidth on GB200 (nvbandwidth p2p)", "value": 770, "unit": "GB/s",
     "source": "Azure/AI-benchmarking-guide issue #7, comment 2025-04-16: 'btw, nvbandwidth's p2p is about 770GB/s'"},
    {"what": "H100 NVLink 4 as NCCL reaches it (line rate 450 GB/s each way; NVLS all-reduce peak busbw ~480)",
     "value": 370, "unit": "GB/s effective per GPU per direction",
     "source": "NVIDIA/nccl-tests issue #212, sjeaugey: '450GB/s is the line rate. With the protocol overhead (~20%) "
               "NCCL can get an effective NVLink bandwidth of 370GB/s ... On 8 GPUs, you should reach a peak busBw of "
               "~480GB/s'"},
    {"what": "measured all-reduce bus bandwidth, 8 H800 in one node", "value": 215, "unit": "GB/s busbw",
     "source": "NVIDIA/nccl issue #1374 (user report): 'I have also conducted a test on H800 * 8 node, and the reported "
               "allreduce budBW is 215 GB/s, which is bigger than unidirectional peak BW 200GB/s'"},
    # -- networks
    {"what": "DGX/HGX B200 scale-out network", "value": 400, "unit": "Gb/s per GPU (8 x ConnectX-7 NDR per node)",
     "source": MLPERF_B200 + "'host_networking': '8x ConnectX-7 IB NDR 400Gb/s + 200Gb/s Ethernet NIC'; NVIDIA/"
               "nccl-tests issue #389: '8xB200 compute nodes ... equipped with ConnectX-7 NDR 400 Gb/s InfiniBand'"},
    {"what": "GB200 NVL72 compute tray NICs (one deployment)", "value": 4,
     "unit": "ConnectX-7-class NICs per 4-GPU tray (BlueField-3)",
     "source": "MLCommons inference_results_v6.1, Crusoe GB200-NVL72 system JSON: 'host_network_card_count': 'for each "
               "4-GPU node: 4x Mellanox MT43244 BlueField-3 [ConnectX-7 Lx]'"},
    # -- H800 and the runs' own clusters
    {"what": "H800 NVLink bandwidth as DeepSeek's cluster reaches it", "value": 160, "unit": "GB/s per GPU",
     "source": "DeepSeek-V3 report, arXiv:2412.19437, §3.2.2: 'NVLink offers a bandwidth of 160 GB/s, roughly "
               "3.2 times that of IB (50 GB/s)'"},
    {"what": "H800 cluster InfiniBand bandwidth (DeepSeek-V3)", "value": 50, "unit": "GB/s per GPU",
     "source": "DeepSeek-V3 report, arXiv:2412.19437, §3.2.2 (as above)"},
    {"what": "Grand Teton H100 (torchtitan benchmarks) HBM", "value": 96, "unit": "GB HBM2e, 2.4 TB/s, 500 W",
     "source": f"{TT_URL}, Hardware: 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory "
               "bandwidth'; 'We used the default 500W power limit'"},
    {"what": "Grand Teton H100 (torchtitan benchmarks) network", "value": 400, "unit": "Gb/s RDMA per GPU",
     "source": f"{TT_URL}, Hardware: 'Hosts are inter-connected with backend RDMA network with 400 Gb/s per GPU.'"},
)
