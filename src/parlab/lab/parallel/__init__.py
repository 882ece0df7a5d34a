"""``parlab.lab.parallel``: each parallelism strategy from scratch, one short file per strategy.

Every strategy wraps (or transforms) a model written as ordinary single-device code and takes the process
*group* it works on as an argument; ``topology.py`` says which group that is for each axis (``dp``, ``tp``,
``pp``) and ``comm.py`` is the one door every strategy's collectives go through, so that one
``parlab.lab.measure.CommLog`` can count them all. Chapter 03 teaches ``ddp`` (and ``dp``, DataParallel's data
flow); chapter 04 ``zero`` (ZeRO stages 1–3); chapter 05 ``tensor`` (Megatron-style tensor parallelism; ``tensor_plan`` applies it to
a model by a plan, ``tensor_models`` holds GPT-2's and Llama's); chapter 06 ``pipeline`` (its schedules, as
data, in ``pipeline_schedule``; their messages in ``pipeline_p2p``); chapter 07 composes them on a mesh;
chapter 10 adds ``context`` (ring attention over the ``cp`` axis) and ``expert`` (a mixture of experts over
the ``ep`` ranks carved out of dp × cp), checked against ``expert_reference`` (the layer token by token), and
``expert_practice`` (dropless dispatch, aux-loss-free balancing, node-limited routing).
"""

from parlab.lab.parallel.comm import communicate, communicate_batch
from parlab.lab.parallel.ddp import DDPBuckets, DDPNaive, DDPOverlap
from parlab.lab.parallel.pipeline import Pipeline
from parlab.lab.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from parlab.lab.topology import AXES, Topology
from parlab.lab.parallel.zero import ZeroStage1, ZeroStage2, ZeroStage3

__all__ = ["AXES", "Topology", "communicate", "communicate_batch", "DDPNaive", "DDPBuckets", "DDPOverlap",
           "ZeroStage1", "ZeroStage2", "ZeroStage3", "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "Pipeline"]
