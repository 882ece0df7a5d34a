"""Published runs the planner is checked against (chapter 07, ``tests/test_planner.py``), and how its one
fitted constant was found."""

from __future__ import annotations

from dataclasses import dataclass, replace

from parlab.planner.hardware import Cluster, cluster_of
from parlab.planner.step import Prediction, predict
from parlab.planner.workload import Layout, Workload


# -- checked against published runs (chapter 07) ------------------------------------------------------------

def eq3_flops(batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one training step of a GPT with full activation recomputation, Narayanan et al. 2021, eq. 3:
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). Their TFLOP/s per GPU are this count over the step time and the
    GPUs, so it counts recomputation: a hardware (HFU-like) figure, not MFU."""
    return 96 * batch * seq_len * layers * hidden**2 * (1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))


@dataclass(frozen=True)
class PublishedRun:
    """A training run whose inputs and outcome are published: the model's shape, the layout, the batch and
    the published seconds per step. All on DGX A100 80 GB nodes (8 GPUs, NVSwitch, 8 × 200 Gb/s HDR), bf16
    or fp16, sequences of 2048, full activation recomputation."""

    name: str
    shape: tuple  # layers, hidden, heads, vocabulary
    layout: Layout
    global_batch: int
    micro_batch: int
    step_s: float
    source: str
    family: str = "gpt"
    implementation: str = "megatron"

    @property
    def nodes(self) -> int:
        return self.layout.dp * self.layout.tp * self.layout.pp // 8

    def workload(self) -> Workload:
        from transformers import BloomConfig, GPT2Config

        layers, hidden, heads, vocab = self.shape
        config = (BloomConfig(hidden_size=hidden, n_layer=layers, n_head=heads, vocab_size=vocab)
                  if self.family == "bloom" else
                  GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=2048))
        # no fused attention in 2021-22: Megatron's softmax kernel keeps the s × s scores
        return Workload(config, global_batch=self.global_batch, seq_len=2048, micro_batch=self.micro_batch,
                        checkpointing=True, attention="eager")

    def predict(self, cluster: Cluster | None = None) -> Prediction:
        return predict(self.workload(), self.layout, cluster or cluster_of("nvlink", self.nodes),
                       implementation=self.implementation)


def _narayanan(name, shape, tp, pp, dp, batch, tflops):
    # published TFLOP/s per GPU → seconds per step, through the paper's own FLOP count (eq. 3)
    layers, hidden, _, vocab = shape
    step = eq3_flops(batch, 2048, layers, hidden, vocab) / (tflops * 1e12 * tp * pp * dp)
    return PublishedRun(name, shape, Layout(dp=dp, tp=tp, pp=pp), batch, 1, step,
                        f"Narayanan et al. 2021 (arXiv:2104.04473), Table 1: {tflops} TFLOP/s per GPU (eq. 3, "
                        f"recomputation counted), {tp * pp * dp} A100 80 GB on Selene; micro-batch 1 assumed")


#: The runs the planner is checked against (``tests/test_planner.py``, chapter 07).
PUBLISHED_RUNS = (
    _narayanan("GPT 1.7B", (24, 2304, 24, 51200), 1, 1, 32, 512, 137),
    _narayanan("GPT 18.4B", (40, 6144, 48, 51200), 8, 1, 32, 1024, 135),
    _narayanan("GPT 145.6B", (80, 12288, 96, 51200), 8, 8, 24, 2304, 148),
    _narayanan("GPT 1008B", (128, 25600, 160, 51200), 8, 64, 6, 3072, 163),
    PublishedRun("BLOOM 176B", (70, 14336, 112, 250880), Layout(dp=8, tp=4, pp=12, zero_stage=1), 2048, 2, 104.7,
                 "BigScience tr11-176B-ml (bigscience-workshop/bigscience, train/tr11-176B-ml/README.md and "
                 "chronicles): 384 A100 80 GB (48 nodes), TP 4, PP 12, DP 8, ZeRO-1, micro-batch 2, global "
                 "batch 2048; 104.7 s per iteration (149.8 TFLOP/s per GPU counting recomputation)",
                 family="bloom", implementation="deepspeed"),
)


def calibrated_utilization(runs=PUBLISHED_RUNS) -> float:
    """The utilisation at which the median of ``runs``' predicted ÷ published step times is 1: how
    :data:`UTILIZATION` was found (one figure for every run; bisection on the monotone median)."""
    import statistics

    workloads = [(run, run.workload()) for run in runs]

    def median_ratio(u):
        return statistics.median(predict(w, run.layout, replace(cluster_of("nvlink", run.nodes), utilization=u),
                                         implementation=run.implementation).step_s / run.step_s
                                 for run, w in workloads)

    low, high = 0.2, 1.0
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if median_ratio(middle) > 1 else (low, middle)
    return (low + high) / 2
