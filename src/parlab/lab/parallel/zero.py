"""ZeRO from scratch: the Zero Redundancy Optimizer's three stages. Taught in chapter 04.

Data parallelism (chapter 03) keeps on every rank a whole copy of the weights, the gradients and the
optimizer state: 2Ψ + 2Ψ + KΨ bytes in mixed precision (K = 12 for Adam). ZeRO partitions them over the N
ranks of the data-parallel group instead (S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC 2020, arXiv:1910.02054, §5 and §7):

- :class:`ZeroStage1` (P_os): each rank keeps the optimizer state (and fp32 master weights) of its 1/N
  shard only. After backward the gradients are reduce-scattered (``reduce="reduce_scatter"``: each rank
  receives its Ψ/N, a volume of Ψ in the paper's count; or, naively, all-reduced, a volume of 2Ψ, of which
  each rank uses 1/N: ``"all_reduce"``); each rank updates its shard; the weights are all-gathered, Ψ. In
  all 2Ψ, what DDP's all-reduce costs (§7.2.1). This class overlaps nothing: Megatron-LM's distributed
  optimizer reduce-scatters during backward and all-gathers during the next forward (chapter 04, section 8).
- :class:`ZeroStage2` (P_os+g): the gradients too. They are reduce-scattered bucket by bucket *during*
  backward, as chapter 03's DDP v3 all-reduces them, and a full gradient lives only until its bucket has
  been sent: each rank keeps the gradient shard it updates with.
- :class:`ZeroStage3` (P_os+g+p): the weights too. Each block's weights are all-gathered just before its
  forward and freed after it, all-gathered again before its backward and freed after it, when its
  gradients are reduce-scattered: 3Ψ per step (§7.2.2). ``prefetch=True`` issues the next block's
  all-gather while this one computes, hiding communication at the cost of holding two blocks at once.

Flat buffers with padding: each group of parameters (the whole model for stage 1, a bucket for stage 2, a
block for stage 3) is laid end to end in one flat buffer whose length is rounded up with zeros to a
multiple of N (:class:`FlatParams`), so that any parameter count shards over any N: rank r owns elements
[r·S, (r+1)·S), S = ⌈Ψ/N⌉. The padding is zero in weights and gradients, and Adam keeps it zero.

Mixed precision: ``param_dtype=torch.bfloat16`` computes in bf16 while the optimizer updates fp32 master
shards (cast to bf16 before they are gathered); gradients are reduced in ``reduce_dtype`` (default
``param_dtype``), as FSDP2's ``MixedPrecisionPolicy`` does.

The three share one usage (inside a rank, with the process group initialised)::

    zero = ZeroStage3(model, torch.optim.AdamW, lr=1e-3, blocks=model.transformer.h, prefetch=True)
    loss = loss_fn(zero(x_shard), y_shard)
    loss.backward()
    zero.step()       # reduce what is left, update this rank's shard, (stages 1-2) all-gather the weights
    zero.zero_grad()

Every collective goes through ``parlab.lab.parallel.comm.communicate`` on ``process_group`` (default: all
ranks; chapter 07 passes ``Topology.group("dp")``), so any attached ``parlab.lab.measure.CommLog`` (``with
CommLog() as log:``) records them, labelled with the group's name; stage 3 names each block's forward and
backward as spans on any attached ``parlab.lab.measure.Timeline``. :meth:`_Zero.full_state_dict` gathers the master weights
into whole tensors named like the model's parameters.
"""

from parlab.lab.parallel.zero_flat import FlatParams, _Zero
from parlab.lab.parallel.zero_stage1 import REDUCE, ZeroStage1
from parlab.lab.parallel.zero_stage2 import ZeroStage2
from parlab.lab.parallel.zero_stage3 import ZeroStage3

__all__ = ["REDUCE", "FlatParams", "ZeroStage1", "ZeroStage2", "ZeroStage3", "_Zero"]
