"""Published training runs of today's layouts (FP8, context parallelism, mixtures of experts, interleaved
pipelines; H100, H800, B200 and GB200: no A100 row, the A100 runs being in ``published.py``), as plain data
for checking the planner on runs it did not fit.

Each row of :data:`FIELD_RUNS` is a plain ``dict`` with the same keys (:data:`~parlab.decide.planner.field_models.KEYS`); nothing here imports the
planner. ``model`` builds a ``transformers`` config: ``getattr(transformers, model["class"])(**kwargs)`` with the
other keys. Every value was read in the row's ``source``; a value worked out from others says how in
``derived``. :data:`~parlab.decide.planner.field_hardware.HARDWARE_FACTS` holds figures for the GPUs these rows ran on: peaks, memory and links as
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
- Llama 3 (Dubey et al. 2024, arXiv:2407.21783v3), §3.3.2, Table 4, and the DeepSeek-V3 technical report
  (arXiv:2412.19437), §1 Table 1 and §3: their rows in :mod:`~parlab.decide.planner.field_reports`.
"""

from __future__ import annotations


from parlab.decide.planner.field_reports import DSV3_ROW, L3_ROWS  # the rows of Llama 3's and DeepSeek-V3's reports
from parlab.decide.planner.field_models import (DEEPSEEK_V3, GPT_OSS_120B, LLAMA3_8B, LLAMA3_70B, LLAMA31_405B,
                                                QWEN3_30B_A3B, QWEN3_235B_A22B)

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
    "overlap_grad_reduce and overlap_param_gather all True (src/megatron/bridge/recipes/llama/llama3.py), "
    "but every performance config sets grad_reduce_in_fp32 = False, so gradients are kept and reduced in bf16 "
    "(scripts/performance/configs/*/*_llm_pretrain.py at 97ad8cc6f, e.g. llama3's set_llama3_common_configs); "
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
MB_RECOMPUTE = (
    "recompute: none unless the row's notes name a recipe preset's: Megatron-Core's TransformerConfig defaults to "
    "recompute_granularity None ('no recompute is performed and all activations are saved', transformer_config.py "
    "at the Megatron-LM commit 97ad8cc6f pins, 92c8482e6), and neither the pretrain recipes nor the performance "
    "presets set one for these rows but Llama 3 8B on H100 and DeepSeek-V3 (the Qwen3 presets set None explicitly). GPT-OSS's presets list "
    "recompute_modules ['layernorm', 'moe_act'] but leave the granularity None, so nothing is recomputed (the "
    "modules apply only under 'selective'). DeepSeek-V3's set 'selective' with ['mla_up_proj'], which leaves "
    "core attention kept and reruns the query and key/value up-projections, about a tenth of a layer's forward "
    "FLOPs (9 % by their shapes): priced as none.")
RECIPES = {  # the table's precision word -> (precision, fp8 recipe); Megatron-Bridge mixed_precision.py
    "BF16": ("bf16", None),
    "FP8-CS": ("fp8", "tensorwise"),  # bf16_with_fp8_current_scaling_mixed: fp8_recipe "tensorwise"
    "FP8-MX": ("fp8", "mxfp8"),  # bf16_with_mxfp8_mixed: fp8_recipe "mxfp8"
}


def _mb(name, gpu, model, gpus, prec, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, ga, tok, tfl, printed,
        notes="", recompute="none", recompute_layers=None, ep_overlap=False, offload_layers=0):
    """One row of the 25.11 tables; ``printed`` is the row as the table prints it. ``recompute``: the planner's
    value for what the row's recipe preset recomputes (:data:`MB_RECOMPUTE`), its words in ``notes``."""
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
        "recompute": recompute, "recompute_layers": recompute_layers,
        "capacity_factor": None,
        "fused": True, "tp_overlap": tp > 1, "ep_overlap": ep_overlap, "offload_layers": offload_layers,
        "tokens_per_s_per_gpu": tok, "tflops_per_gpu": tfl,
        "flops_counting": MEGATRON_BRIDGE_FLOPS,
        "derived": derived,
        "notes": " ".join(x for x in (SYSTEMS[gpu] + ".", MB_NOTE, MB_RECOMPUTE, notes,
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
        "the Grace CPU (cpu_offloading_num_layers=40) with fsdp_double_buffer.", offload_layers=40),
    _mb("Llama 3.1 405B, 256 GB200, FP8 current scaling", "gb200", LLAMA31_405B, 256, "FP8-CS", 1536, 1, 8192, 0,
        4, 16, 1, 4, 1, 384, 813, 2053,
        "LLAMA3.1_405B | 256 | FP8-CS | 1536 | 1 | 8192 | 0 | 4 | 16 | 1 | 4 | 1 | 384 | 813 | 2053",
        "126 layers over PP 16 x VP 4 = 64 chunks: uneven. The GB200 FP8-CS recipe preset at 97ad8cc6f is another "
        "layout (128 GPUs, TP 2, Megatron-FSDP, cpu_offloading_num_layers=92), so this row's offload is not stated: "
        "priced as none."),
    _mb("DeepSeek-V3 (no MTP), 256 GB200, BF16", "gb200", DSV3_NOMTP, 256, "BF16", 4096, 1, 4096, 0, 1, 4, 1, 4,
        64, 64, 3139, 782,
        "DeepSeekV3 (w/o MTP) | 256 | BF16 | 4096 | 1 | 4096 | 0 | 1 | 4 | 1 | 4 | 64 | 64 | 3139 | 782",
        "EP 64 inside the NVL72 NVLink domain; recipe preset: HybridEP dispatcher (moe_flex_dispatcher_backend "
        "'hybridep'), recompute_modules ['mla_up_proj'], CUDA graphs on router and preprocess.", recompute="none"),
    _mb("DeepSeek-V3 (no MTP), 256 GB200, MXFP8", "gb200", DSV3_NOMTP, 256, "FP8-MX", 4096, 1, 4096, 0, 1, 8, 1, 4,
        32, 128, 4018, 1003,
        "DeepSeekV3 (w/o MTP) | 256 | FP8-MX | 4096 | 1 | 4096 | 0 | 1 | 8 | 1 | 4 | 32 | 128 | 4018 | 1003",
        "61 layers over PP 8 x VP 4 = 32 chunks: uneven."
        " Recipe preset: recompute_modules ['mla_up_proj'].", recompute="none"),
    _mb("GPT-OSS 120B, 64 GB200, BF16", "gb200", GPT_OSS_120B, 64, "BF16", 1280, 1, 8192, 0, 1, 1, 1, 1, 64, 20,
        15876, 488,
        "GPT OSS 120B | 64 | BF16 | 1280 | 1 | 8192 | 0 | 1 | 1 | 1 | 1 | 64 | 20 | 15876 | 488",
        "Every other layer uses 128-token sliding-window attention (the FLOPs formula counts full causal "
        "attention on every layer)." " Recipe preset: recompute_modules ['layernorm', 'moe_act'].", recompute="none"),
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
        "EP 8: one node. MTP: one multi-token-prediction layer, counted by the FLOPs formula."
        " Recipe preset: recompute_modules ['mla_up_proj'].", recompute="none"),
    _mb("GPT-OSS 120B, 64 B200, BF16", "b200", GPT_OSS_120B, 64, "BF16", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 2,
        8213, 223,
        "GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 2 | 8213 | 223",
        "Sliding-window attention on every other layer." " Recipe preset: recompute_modules ['layernorm', 'moe_act'].", recompute="none"),
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
        "Recipe preset (DDP there): recompute_num_layers=5, which scripts/performance/utils/overrides.py turns into "
        "full recomputation (recompute_method 'block') of 5 of the 32 layers.", recompute="full", recompute_layers=5),
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
        "Sliding-window attention on every other layer." " Recipe preset: recompute_modules ['layernorm', 'moe_act'].", recompute="none"),
    _mb("Qwen3 30B-A3B, 16 H100, FP8 current scaling", "h100", QWEN3_30B_A3B, 16, "FP8-CS", 512, 2, 4096, 0, 1, 2,
        1, 24, 8, 32, 5275, 121,
        "Qwen3_30B_a3B | 16 | FP8-CS | 512 | 2 | 4096 | 0 | 1 | 2 | 1 | 24 | 8 | 32 | 5275 | 121",
        "48 layers over PP 2 x VP 24: one layer per chunk; recipe preset: moe_a2a_overlap.", ep_overlap=True),
    _mb("Qwen3 235B-A22B, 256 H100, FP8 current scaling", "h100", QWEN3_235B_A22B, 256, "FP8-CS", 2048, 1, 4096, 0,
        2, 8, 1, 4, 32, 128, 1575, 233,
        "Qwen3_235B_a22B | 256 | FP8-CS | 2048 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 | 32 | 128 | 1575 | 233",
        "EP 32 spans 4 nodes (all-to-all over InfiniBand); recipe preset: moe_a2a_overlap.", ep_overlap=True),
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
        fp8=False, compiled=True, async_tp=False, recompute, derived="", notes=""):
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
        "recompute": recompute, "recompute_layers": None, "capacity_factor": None,
        "fused": compiled, "tp_overlap": async_tp, "ep_overlap": False, "offload_layers": 0,
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
SAC = "op"  # torchtitan's op-level selective checkpointing (ac_mode 'selective', selective_ac_option 'op')
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
        256, 876, tp=8, local_batch=16, fp8=True, recompute="full", async_tp=True, notes="Async TP: TP collectives overlapped "
        "with the matrix products (micro-pipelined)."),
    _tt("Llama 3.1 405B, 512 H100, FSDP 8 x TP 8 x PP 8, Float8, 1F1B", T5, "1F1B | 100 | 82.5", LLAMA31_405B, 512,
        100, tp=8, pp=8, local_batch=32, micro_batch=4, fp8=True, recompute="full", derived=PP_MB,
        async_tp=True, notes="Async TP on."),
    _tt("Llama 3.1 405B, 512 H100, FSDP 8 x TP 8 x PP 8, Float8, interleaved 1F1B", T5, "Interleaved 1F1B | 128 | 72.7",
        LLAMA31_405B, 512, 128, tp=8, pp=8, vp=2, local_batch=32, micro_batch=4, fp8=True, recompute="full",
        derived=PP_MB + " vp 2: torchtitan's default for a multi-stage schedule without split points "
        "(generate_split_points, num_stages_per_rank = 2).", async_tp=True, notes="Async TP on."),
    _tt("Llama 3.1 405B, 512 H100, 32k tokens, FSDP 8 x TP 8 x PP 8, Float8", T6, "FSDP 8, CP 1 | 32768 | 76 | 75.3",
        LLAMA31_405B, 512, 76, seq=32768, tp=8, pp=8, local_batch=8, micro_batch=1, fp8=True, recompute="full",
        derived=PP_MB, async_tp=True, notes="Async TP on; 1F1B."),
    _tt("Llama 3.1 405B, 512 H100, 64k tokens, FSDP 4 x CP 2 x TP 8 x PP 8, Float8", T6,
        "FSDP 4, CP 2 | 65536 | 47 | 75.9", LLAMA31_405B, 512, 47, seq=65536, tp=8, pp=8, cp=2, local_batch=8,
        micro_batch=1, fp8=True, recompute="full", derived=PP_MB, async_tp=True, notes="Async TP on; 1F1B."),
    _tt("Llama 3.1 405B, 512 H100, 128k tokens, FSDP 2 x CP 4 x TP 8 x PP 8, Float8", T6,
        "FSDP 2, CP 4 | 131072 | 31 | 77.1", LLAMA31_405B, 512, 31, seq=131072, tp=8, pp=8, cp=4, local_batch=8,
        micro_batch=1, fp8=True, recompute="full", derived=PP_MB, async_tp=True, notes="Async TP on; 1F1B."),
    _tt("Llama 3.1 405B, 512 H100, 256k tokens, CP 8 x TP 8 x PP 8, Float8", T6, "FSDP 1, CP 8 | 262144 | 16 | 84.9",
        LLAMA31_405B, 512, 16, seq=262144, tp=8, pp=8, cp=8, local_batch=8, micro_batch=1, fp8=True,
        recompute="full", derived=PP_MB, async_tp=True, notes="Async TP on; 1F1B."),
)

FIELD_RUNS = _MB_ROWS + _TT_ROWS + L3_ROWS + (DSV3_ROW,)
