"""One cost model for the course: links, collectives, and the time and memory of a training step under any
layout (chapter 07; chapters 04, 05 and 06 use its links and collectives).

**Links.** :data:`LINKS` names the links the course talks about, each with a latency α (seconds per
message, i.e. per step of a ring) and a bandwidth B (bytes per second, one direction, per GPU while every
GPU of its node sends), and where the bandwidth comes from: vendors' figures, or nccl-tests' measured bus
bandwidth where the vendor's would mislead (an 8-GPU PCIe server). Every α is an assumption of the right
order, not a measurement: fit your own with chapter 02's ``sweep`` and ``fit_alpha_beta``. A ring between
nodes runs over as many of a node's adapters as the group has GPUs there (:meth:`Cluster.link`).

**Collectives** (chapter 02's α-β model, T(m) = α + m·β per message, on a ring of n ranks; m is the
nccl-tests size: the whole buffer, all-gather's output, reduce-scatter's input):

- all-gather, reduce-scatter: n − 1 steps, each moving m/n over every link: (n−1)·α + (n−1)/n · m/B;
- all-reduce: a reduce-scatter then an all-gather: 2(n−1)·α + 2(n−1)/n · m/B;
- send/recv (a pipeline's boundary): α + m/B.

Two α's, then: a link's α is the latency of *one message* (one step of a ring); a collective's α is the
intercept of its whole call, T(m) = α_call + m·β_call, e.g. α_call = 2(n−1)·α for an all-reduce.
:func:`ring_costs` turns a link into (α_call, β_call) of each op; a curve fitted on a real machine
(``fit_alpha_beta`` over a ``sweep`` of whole calls) gives (α_call, β_call) directly and plugs in the same
way, and :func:`fitted_link` turns such a fit back into a link (per-message α, bandwidth B), so that it can
be priced at another ring size. :func:`collective_seconds` prices one call.

**A step** (:func:`predict`): the pipeline's slowest stage sets the pace (layers split as evenly as the
output layer on the last stage allows: :func:`stage_layers`); a rank executes its layers' FLOPs (2 per
weight and token, plus attention's 4·s·h, Narayanan et al. 2021's eq. 3; backward = 2 × forward, a fused
attention kernel's 2.5 × as it recomputes the scores, and the forward again under recomputation) at its
GPU generation's one fitted share of peak (:data:`UTILIZATION`, :data:`H100_UTILIZATION`), a fused
attention kernel's at its published rate where the GPU has one (:attr:`GPU.attention_flops`: the H100's,
FlashAttention-2's), and their memory-bound work at its memory bandwidth (fused: the bytes they save for backward;
eager: each op's own, counted, :meth:`Workload.elementwise_bytes`); tensor parallelism adds
Megatron's all-reduces of one activation per layer and micro-batch (two forward, two backward, two more
when recomputing), partly hidden with ``tp_overlap`` (each implementation's fitted share, :data:`TP_OVERLAP_HIDDEN`;
it needs sequence parallelism, as in Megatron-LM); a pipeline of p stages runs m micro-batches in
m + (p − 1)/v slots (the bubble, chapter 06; v interleaved chunks) and sends 1/t of an activation each way
per micro-batch (scatter/gather, ibid. §4.1); data parallelism's collectives come from
:func:`predict_dp_step` and :func:`zero3_step` (chapter 04), which know what each implementation of each
ZeRO stage hides; every collective call pays its ring's latency floor, (n − 1)·α, so ZeRO-3 at one
sequence per GPU over a 1,536-rank ring no longer hides (DeepSpeed's of 2021 gathered tensor by tensor, and
again for the recomputed forward where a layer exceeds its reuse distance: :func:`deepspeed_backward_gathers`). Memory per rank is :func:`parlab.lab.measure.estimate_memory` (chapter 01)
for the heaviest stage, with the implementation's gradient dtype (Megatron-LM in bf16: fp32, 18 bytes per
parameter; in fp16: fp16; DeepSpeed's BF16_Optimizer: fp32), refusing the ZeRO stages no implementation runs
beside a pipeline (:func:`unsupported`) and ZeRO-3's working set (:func:`zero3_working_set`). ``predict(..., without=(term,))`` leaves
one cost term out (:data:`TERMS`), so that a test can show what each adds. MFU (model FLOPs, no
recomputation) and HFU (what executes) are reported. The runs it is checked against
(``tests/test_planner.py``, ``docs/planner.md``): :data:`CALIBRATION_RUNS` fitted :data:`UTILIZATION`,
:data:`H100_CALIBRATION_RUNS` fitted :data:`H100_UTILIZATION`; :data:`HELD_OUT_RUNS` and
:data:`H100_HELD_OUT_RUNS` fitted nothing (the 1536-GPU ZeRO-3 row shaped a mechanism, though);
:data:`OUT_OF_SAMPLE_RUNS` chose nothing at all; :data:`H100_OUT_OF_SAMPLE_RUNS` chose nothing in time (their memory miss chose
MPT's GELU, which moved the H100 constant).

**Today's layouts** (``docs/planner.md``, "Today's layouts"): the layout carries every axis (:class:`Layout`:
dp, tp, pp, cp, ep with etp, vp, HSDP's ``shard``), the workload its precision (``"fp8"`` and its
:data:`FP8_RECIPES`) and its experts (read from a transformers MoE config), the GPU its rates per precision
(:data:`GPUS`: A100, H100, H800, B200, GB200; :data:`UTILIZATIONS`, one fitted share per generation and
precision; :data:`EXPERT_SECONDS`, one fitted fixed cost per local expert), the cluster its NVLink domain. FP8's
casts, context parallelism's K/V exchange, a MoE's all-to-alls and its experts' fixed cost are priced in
:mod:`~parlab.decide.planner.terms`; :mod:`~parlab.decide.planner.field` prices 40 published runs of these layouts
(:data:`~parlab.decide.planner.field.FITTED` and :data:`~parlab.decide.planner.field.EXPERT_FITTED` name the rows
each new constant was fitted on; every other row fitted nothing).

**The package, by idea:** :mod:`~parlab.decide.planner.hardware` (links, collectives, GPUs, clusters),
:mod:`~parlab.decide.planner.workload` (a model, its batch and precision), :mod:`~parlab.decide.planner.layout` (a
layout's axes and where their groups lie), :mod:`~parlab.decide.planner.counting` (a config counted on the meta
device), :mod:`~parlab.decide.planner.data_parallel` (what
each ZeRO stage sends and hides), :mod:`~parlab.decide.planner.step` (a layout's step, part by part),
:mod:`~parlab.decide.planner.memory` (memory per rank), :mod:`~parlab.decide.planner.search` (every layout of a cluster)
and :mod:`~parlab.decide.planner.published` and :mod:`~parlab.decide.planner.field` (the runs it is checked
against, :mod:`~parlab.decide.planner.field_data` the latter's rows). Every name but :mod:`field`'s is imported here:
``from parlab.decide.planner import predict``.
"""

from parlab.decide.planner.hardware import (A100, B200, BLACKWELL_UTILIZATION, BUCKET_BYTES, GB200, GPU, GPUS, H100, H800, H100_UTILIZATION, UTILIZATIONS, EXPERT_SECONDS, LINKS, OPS, OPTIMIZER_BYTES_PER_PARAM,
                                     UTILIZATION, Cluster, Link, cluster_of, collective_seconds, fitted_link,
                                     ring_costs)
from parlab.decide.planner.data_parallel import (DEEPSPEED_BUCKET_ELEMENTS, IMPLEMENTATIONS, MEGATRON_BUCKET_PARAMS, RESHARDS,
                                                 STRATEGIES, bucket_bytes, bucket_count, ddp_buckets, predict_dp_step,
                                                 zero3_step)
from parlab.decide.planner.workload import ATTENTIONS, FP8_RECIPES, GRAD_DTYPES, PRECISIONS, RECOMPUTES, Workload, root_params
from parlab.decide.planner.layout import CP_KINDS, Layout, stage_layers, stage_params
from parlab.decide.planner.memory import stage_memory, zero3_working_set
from parlab.decide.planner.step import TERMS, TP_OVERLAP_HIDDEN, Prediction, deepspeed_backward_gathers, predict, unsupported
from parlab.decide.planner.search import candidates, layout_of
from parlab.decide.planner.published import (CALIBRATION_RUNS, H100_CALIBRATION_RUNS, H100_HELD_OUT_RUNS,
                                      H100_OUT_OF_SAMPLE_RUNS, HELD_OUT_RUNS,
                                      OUT_OF_SAMPLE_RUNS, PUBLISHED_RUNS, PublishedRun,
                                      baseline_step, baseline_utilization, calibrated_utilization, eq3_flops)

__all__ = ["BLACKWELL_UTILIZATION", "EXPERT_SECONDS", "TP_OVERLAP_HIDDEN", "B200", "GB200", "GPUS", "H800", "UTILIZATIONS", "CP_KINDS", "FP8_RECIPES", "PRECISIONS", "ATTENTIONS", "DEEPSPEED_BUCKET_ELEMENTS", "GRAD_DTYPES", "MEGATRON_BUCKET_PARAMS", "bucket_bytes", "bucket_count", "CALIBRATION_RUNS", "OUT_OF_SAMPLE_RUNS", "H100_CALIBRATION_RUNS", "H100_HELD_OUT_RUNS", "H100_OUT_OF_SAMPLE_RUNS", "H100_UTILIZATION", "HELD_OUT_RUNS", "RECOMPUTES", "TERMS", "zero3_working_set", "baseline_step", "baseline_utilization", "A100", "BUCKET_BYTES", "GPU", "H100", "IMPLEMENTATIONS", "LINKS", "OPS", "OPTIMIZER_BYTES_PER_PARAM",
           "PUBLISHED_RUNS", "RESHARDS", "STRATEGIES", "UTILIZATION", "Cluster", "Layout", "Link", "Prediction",
           "PublishedRun", "Workload", "calibrated_utilization", "candidates", "cluster_of", "collective_seconds", "deepspeed_backward_gathers",
           "ddp_buckets", "eq3_flops", "fitted_link", "layout_of", "predict", "predict_dp_step", "ring_costs",
           "root_params", "stage_layers", "stage_memory", "stage_params", "unsupported", "zero3_step"]
