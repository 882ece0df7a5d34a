"""Published runs of today's layouts from two technical reports, Llama 3 (Dubey et al. 2024, §3.3.2, Table 4)
and DeepSeek-V3 (arXiv:2412.19437): rows of :data:`~parlab.decide.planner.field_data.FIELD_RUNS`, in its keys
(:data:`~parlab.decide.planner.field_models.KEYS`). Llama 3's print TFLOP/s without their FLOP count and DeepSeek-V3's
names no micro-batch, so their time is not priced (:func:`~parlab.decide.planner.field.field_runs`)."""

from __future__ import annotations

from parlab.decide.planner.field_models import DEEPSEEK_V3, LLAMA31_405B

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
        "recompute": "none" if seq <= 8192 else None, "recompute_layers": None,
        "capacity_factor": None,
        "fused": True, "tp_overlap": True, "ep_overlap": False, "offload_layers": 0,
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


L3_ROWS = (
    _l3("Llama 3 405B, 8,192 H100, 8k tokens", 8192, 8, 1, 16, 64, 8192, 32, 430, "43%"),
    _l3("Llama 3 405B, 16,384 H100, 8k tokens", 16384, 8, 1, 16, 128, 8192, 16, 400, "41%"),
    _l3("Llama 3 405B, 16,384 H100, 128k tokens, CP 16", 16384, 8, 16, 16, 8, 131072, 16, 380, "38%",
        " DP 8 = 16,384/(8*16*16); arXiv v1's table printed DP 4, which does not multiply out; v3 prints 8."),
)

# -- DeepSeek-V3 -------------------------------------------------------------------------------------------

DSV3_ROW = {
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
    "recompute": "none", "recompute_layers": None,
    "capacity_factor": None,
    "fused": True, "tp_overlap": False, "ep_overlap": True, "offload_layers": 0,
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
              "head, gating, norms and attention in BF16/FP32 (§3.3.1); no token dropping (§2.1.2). micro_batch not stated. "
              "recompute: §3.2.3 recomputes RMSNorm and the MLA up-projections in backward (small work: none)."),
}
