"""Data parallelism's step (chapter 04): what each ZeRO stage sends, what each implementation hides behind
computation, and DDP's buckets as PyTorch cuts them (chapter 06)."""

from __future__ import annotations

import math

from parlab.lab.checks import positive_int
from parlab.decide.planner.hardware import BUCKET_BYTES

# -- data parallelism: what each ZeRO stage sends, and what it can hide behind (chapter 04) ------------------

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
#: Whose ZeRO-1/2 is priced (:func:`predict_dp_step`'s ``implementation``), since what they overlap is the
#: implementation's choice, not ZeRO's:
#:
#: - ``"megatron"`` (default): Megatron-LM's distributed optimizer (``overlap_grad_reduce``,
#:   ``overlap_param_gather``): the gradients' reduce-scatter, bucket by bucket, during backward (stage 1:
#:   the last micro-batch's; stage 2: every one's), and the updated weights' all-gather during the next
#:   step's first forward (``megatron/core/distributed/README`` and ``distributed_data_parallel_config.py``);
#: - ``"deepspeed"``: DeepSpeed's ``overlap_comm``: the reduce-scatter during backward as above; the
#:   all-gather of the updated weights runs inside ``step()``, after the optimizer, with nothing beside it
#:   (``deepspeed/runtime/zero/stage_1_and_2.py``: ``all_gather_dp_groups``);
#: - ``"course"``: chapter 04's ``ZeroStage1``, which reduce-scatters after backward and all-gathers after
#:   the step (nothing hides), and ``ZeroStage2``, which reduce-scatters its buckets during backward;
#: - ``"fsdp1"``: PyTorch's ``FullyShardedDataParallel`` of torch 2.0 as MosaicML's llm-foundry ran it
#:   (Composer, ``FULL_SHARD``, ``limit_all_gathers``, checkpoint inside each FSDP unit): ZeRO-3 only, its
#:   per-micro-batch gathers and reduce-scatters priced **exposed**, added to the computation. That is an
#:   observation, not a mechanism: on llm-foundry's MPT 30B/70B H100 rows the time the overlapped model
#:   misses is, per layer and micro-batch, what moving the layer's weights at NCCL's bandwidth takes
#:   (``docs/planner.md``), whatever the tokens; why they do not hide (SMs and HBM taken by NCCL's kernels,
#:   FSDP1's rate limiter, the stream order) is not settled here.
#:
#: Under ``"megatron"``, ZeRO-2 and ZeRO-3 are Megatron-FSDP's ``optim_grads`` and ``optim_grads_params``
#: (``--use-megatron-fsdp --data-parallel-sharding-strategy``); ZeRO-1 is its distributed optimizer.
IMPLEMENTATIONS = ("megatron", "deepspeed", "course", "fsdp1")
#: When ZeRO-3 frees (reshards) the weights it gathered (:func:`zero3_step`'s ``reshard``), FSDP2's names:
#: - ``"after_forward"`` (FSDP2's default, DeepSpeed's stage 3): gathered for every forward and again for
#:   every backward, reduce-scattered after every backward: per micro-batch 2 all-gathers + 1 reduce-scatter;
#: - ``"after_backward"`` (``reshard_after_forward=False``, micro-batches run one after another, as under
#:   gradient accumulation or the course's pipeline executor): kept from a forward to its backward, freed
#:   after that backward, so the next pass gathers again: per micro-batch 1 all-gather + 1 reduce-scatter;
#: - ``"after_step"`` (``reshard_after_forward=False`` under ``torch.distributed.pipelining``, whose stage
#:   switches off resharding and gradient sync for every backward and reduces once when all are done:
#:   ``stage.py``'s ``backward_maybe_with_nosync`` and ``perform_reduce_grad``): 1 all-gather, during the
#:   first forward, and 1 reduce-scatter after the last backward, with nothing left to hide it; the weights
#:   and whole gradients stay on the rank through the step, which is stage 1's memory.
RESHARDS = ("after_forward", "after_backward", "after_step")
#: Megatron-Core's default gradient bucket, in parameters: ``max(40000000, 1000000 * dp_size)``, "larger DP
#: sizes need larger buckets to ensure collectives do not become latency-bound"
#: (``megatron/core/distributed/distributed_data_parallel_config.py``, ``bucket_size``): (floor, per DP rank).
MEGATRON_BUCKET_PARAMS = (40_000_000, 1_000_000)
#: DeepSpeed's gradient bucket, in elements: ZeRO-1/2's ``reduce_bucket_size`` (and ``allgather_bucket_size``)
#: default 5e8 (``deepspeed/runtime/zero/config.py``), and the engine's ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8
#: with which its BF16_Optimizer's gradients are all-reduced (``deepspeed/runtime/engine.py``).
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000


def bucket_bytes(implementation: str, dp: int, grad_bytes: int) -> float:
    """Bytes of one gradient bucket as ``implementation`` cuts them for DDP and ZeRO-1/2 over ``dp`` ranks,
    gradients of ``grad_bytes`` each: Megatron-Core's :data:`MEGATRON_BUCKET_PARAMS`, DeepSpeed's
    :data:`DEEPSPEED_BUCKET_ELEMENTS`, else PyTorch DDP's ``bucket_cap_mb`` (25 MiB: the course's DDP and
    ZeRO-2, and plain DDP beside llm-foundry's FSDP1). ZeRO-3 reduces per wrapped block
    (:func:`zero3_step`'s ``blocks``), not by buckets. Each bucket is one collective call, paying its ring's
    latency once."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    positive_int("dp", dp, "data-parallel ranks")
    if implementation == "megatron":
        floor, per_rank = MEGATRON_BUCKET_PARAMS
        return max(floor, per_rank * dp) * grad_bytes
    if implementation == "deepspeed":
        return DEEPSPEED_BUCKET_ELEMENTS * grad_bytes
    return BUCKET_BYTES


def bucket_count(implementation: str, dp: int, reduce_bytes: float, grad_bytes: int) -> int:
    """Collective calls that reduce ``reduce_bytes`` of gradients: the buckets of :func:`bucket_bytes`."""
    return max(1, math.ceil(reduce_bytes / bucket_bytes(implementation, dp, grad_bytes)))


def predict_dp_step(strategy: str, costs: dict, num_bytes: float, world_size: int, forward_s: float,
                    backward_s: float, optimizer_s: float, buckets: int = 1, blocks: int = 1,
                    overlap: bool = True, micro_batches: int = 1, root_bytes: float = 0.0,
                    root_gathers: int = 1, *, implementation: str = "megatron",
                    reshard: str = "after_forward", gathers_per_block: int = 1, prefetch: bool = True,
                    backward_gathers: int = 1, reduce_bytes: float | None = None) -> float:
    """Seconds per training step of one data-parallel strategy under the α-β model (a model, not a measurement).

    ``costs[op] = (α, β)`` per collective call (:func:`ring_costs`, or fitted with ``fit_alpha_beta``);
    ``num_bytes``: the gradients' (= the weights') size; ``forward_s``, ``backward_s``, ``optimizer_s``: one
    rank's compute in the step (the optimizer over all its weights: ZeRO divides it by N). ``buckets``:
    collectives DDP and stages 1/2 cut the gradients into; ``blocks``: stage 3's gather units. ``overlap``:
    communication runs beside computation (GPUs: NCCL on its own stream) and only the longer of the two
    counts; else (CPU: the same cores) they add. ``micro_batches``: forward/backward passes per step
    (gradient accumulation, or a pipeline): DDP and stage 1 reduce once, during the last backward; stage 2
    must reduce-scatter during every backward, since it keeps no whole gradient to accumulate into.

    ``implementation``: whose stages 1 and 2 are priced (:data:`IMPLEMENTATIONS`). Only ZeRO's reduce-scatter (Ψ) can hide behind backward, not DDP's whole all-reduce (2Ψ).

    ``reduce_bytes``: the bytes every stage's gradient reductions carry, when they are not the
    weights' (Megatron-LM in bf16 reduces fp32 gradients: twice ``num_bytes``); ``None``: ``num_bytes``.

    Stage 3's gathers, what hides them and its root are :func:`zero3_step`'s (the arguments from
    ``blocks`` on, ``root_bytes`` and the keywords go to it).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    if reshard not in RESHARDS:
        raise ValueError(f"reshard={reshard!r}; choose one of {', '.join(RESHARDS)}")
    if implementation == "fsdp1" and strategy in ("zero1", "zero2"):
        raise ValueError(f"strategy={strategy!r} under implementation 'fsdp1': it prices FSDP1's FULL_SHARD "
                         f"(zero3) or plain DDP (ddp); choose one of those, or another implementation")
    m = positive_int("micro_batches", micro_batches, "forward/backward passes per step")
    grads = num_bytes if reduce_bytes is None else reduce_bytes
    if strategy == "zero3":  # FSDP1 as llm-foundry ran it: nothing hides (IMPLEMENTATIONS)
        return zero3_step(costs, num_bytes, world_size, forward_s, backward_s, optimizer_s, blocks=blocks,
                          overlap=overlap and implementation != "fsdp1", micro_batches=m, root_bytes=root_bytes, root_gathers=root_gathers,
                          reshard=reshard, gathers_per_block=gathers_per_block, prefetch=prefetch,
                          backward_gathers=backward_gathers, reduce_bytes=grads)
    comm, beside = _pricing(costs, num_bytes, overlap)
    n, first, last = world_size, forward_s / m, backward_s / m  # one pass: what a step's first/last can hide
    if strategy == "ddp":  # buckets all-reduced during the last backward
        return forward_s + backward_s - last + beside(last, comm("all_reduce", buckets, grads)) + optimizer_s
    reduce = (1 if strategy == "zero1" else m) * comm("reduce_scatter", buckets, grads)
    if strategy == "zero1" and implementation == "course":  # one flat buffer after backward: nothing beside it
        backward = backward_s + comm("reduce_scatter", 1, grads)
    elif strategy == "zero1":  # during the last backward
        backward = backward_s - last + beside(last, reduce)
    else:  # during every backward
        backward = beside(backward_s, reduce)
    if implementation == "megatron":  # the updated weights gathered under the next step's first forward
        forward = forward_s - first + beside(first, comm("all_gather", buckets))
        return forward + backward + optimizer_s / n
    gather = comm("all_gather", 1 if strategy == "zero1" else buckets)  # after the step
    return forward_s + backward + optimizer_s / n + gather


def _pricing(costs: dict, num_bytes: float, overlap: bool):
    """``comm(op, calls, nbytes)``: ``calls`` latencies and ``nbytes`` through ``costs[op]``; ``beside(compute,
    communication)``: the longer of the two when they overlap, else their sum."""

    def comm(op, calls, nbytes=num_bytes):
        alpha, beta = costs[op]
        return calls * alpha + nbytes * beta

    def beside(compute, communication):
        return max(compute, communication) if overlap else compute + communication

    return comm, beside


def zero3_step(costs: dict, num_bytes: float, world_size: int, forward_s: float, backward_s: float,
               optimizer_s: float, *, blocks: int = 1, overlap: bool = True, micro_batches: int = 1,
               root_bytes: float = 0.0, root_gathers: int = 1, reshard: str = "after_forward",
               gathers_per_block: int = 1, prefetch: bool = True, backward_gathers: int = 1,
               reduce_bytes: float | None = None) -> float:
    """Seconds per step of ZeRO-3 (:func:`predict_dp_step`'s ``"zero3"``), which prefetches: the blocks' gathers
    hide behind forward, gathers and reduce-scatters behind backward; ``reshard``: see :data:`RESHARDS`.

    Each stage-3 collective pays its ring's latency floor, (n − 1)·α per call whatever its size
    (:func:`~parlab.decide.planner.hardware.ring_costs`): at 1,536 ranks over InfiniBand, 7.7 ms, a sixth of
    a GPT-3 layer's forward at one sequence per GPU (about 42 ms on an A100), so that DeepSpeed's 12 calls a
    layer (one per tensor) outlast it. ``gathers_per_block``: the calls that gather one block
    (FSDP2: 1, its parameters flattened into one all-gather; DeepSpeed's ZeRO-3 of 2021: one per parameter
    tensor). ``prefetch``: the next block's gather runs beside this block's computation, so the longer of
    the two counts; ``False`` (a block too large for the implementation's prefetch buffer) makes them add.

    Stage 3's root: ``root_bytes`` of ``num_bytes`` belong to the parameters outside the blocks (embeddings,
    final norm, output layer), one more gather unit. Its all-gather is the first thing forward needs and its
    reduce-scatter the last thing backward issues, so neither has computation to hide behind: both are on
    the critical path, once per pass, and so is a second gather in backward when the root is freed after
    forward (``root_gathers=2``: chapter 04's ``ZeroStage3``; FSDP2's ``fully_shard`` keeps the root from
    forward to backward: ``root_gathers=1``, the default).

    ``backward_gathers``: all-gathers of each block per backward under ``"after_forward"``: 1, or 2 when full
    recomputation's forward gathers the block and frees it again before backward gathers it (DeepSpeed's
    ZeRO-3: its forward hooks fire in the recomputation too, ``parameter_offload.py``'s
    ``pre_sub_module_forward_function``, deepspeedai/DeepSpeed#4784; FSDP2 keeps a block gathered from its
    recomputed forward to its backward).
    """
    if reshard not in RESHARDS:
        raise ValueError(f"reshard={reshard!r}; choose one of {', '.join(RESHARDS)}")
    m = positive_int("micro_batches", micro_batches, "forward/backward passes per step")
    if not 0 <= root_bytes <= num_bytes:
        raise ValueError(f"root_bytes={root_bytes!r} must lie between 0 and num_bytes={num_bytes!r}")
    if root_gathers not in (1, 2) or backward_gathers not in (1, 2):
        raise ValueError(f"root_gathers={root_gathers!r}, backward_gathers={backward_gathers!r}: each 1 (kept "
                         f"gathered from forward to backward) or 2 (gathered again for backward)")
    positive_int("gathers_per_block", gathers_per_block, "collective calls that gather one block")
    comm, beside = _pricing(costs, num_bytes, overlap and prefetch)  # no prefetch: every gather waits, then computes
    n, first, grads = world_size, forward_s / m, num_bytes if reduce_bytes is None else reduce_bytes
    body, per_block = num_bytes - root_bytes, blocks * gathers_per_block
    scale = grads / num_bytes if num_bytes else 1.0  # gradients reduced in their own dtype
    root = (root_gathers * comm("all_gather", 1, root_bytes) + comm("reduce_scatter", 1, scale * root_bytes)
            if root_bytes else 0.0)
    if reshard == "after_forward":
        return (beside(forward_s, m * comm("all_gather", per_block, body))
                + beside(backward_s, m * (backward_gathers * comm("all_gather", per_block, body)
                                          + comm("reduce_scatter", per_block, scale * body)))
                + m * root + optimizer_s / n)
    root_gather = comm("all_gather", 1, root_bytes) if root_bytes else 0.0
    if reshard == "after_backward":  # the first forward gathers; each later pass's backward gathers again
        root_reduce = comm("reduce_scatter", 1, scale * root_bytes) if root_bytes else 0.0
        return (beside(forward_s, comm("all_gather", per_block, body))
                + beside(backward_s, (m - 1) * comm("all_gather", per_block, body)
                         + m * comm("reduce_scatter", per_block, scale * body))
                + m * (root_gather + root_reduce) + optimizer_s / n)
    # after_step: one gather under the first forward, one reduce-scatter of everything after the last backward
    units = blocks + (1 if root_bytes else 0)
    return (forward_s - first + beside(first, comm("all_gather", per_block, body)) + root_gather + backward_s
            + comm("reduce_scatter", units, grads) + optimizer_s / n)


# -- DDP's buckets as PyTorch cuts them (chapter 06) ---------------------------------------------------------

def ddp_buckets(model, value_bytes: int = 2, bucket_bytes: int | None = None) -> list[int]:
    """Bytes of each bucket PyTorch's ``DistributedDataParallel`` all-reduces per step for ``model`` (a
    transformers config or a ``parlab.decide.advice`` preset name) whose gradients take ``value_bytes`` each (2:
    a bf16 model; 4: fp32 weights, as under ``torch.autocast``). Each bucket is one all-reduce: on a ring,
    2(n−1) messages (:func:`ring_costs`).

    ``bucket_bytes``: DDP's ``bucket_cap_mb`` in bytes; ``None``, DDP's default: 25 MiB
    (``torch/nn/parallel/distributed.py``: ``_DEFAULT_BUCKET_CAP_MB = 25``, ``_MB_TO_BYTES = 1024 * 1024``),
    and then a first bucket of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), as DDP rebuilds them after
    the first step (chapter 03). The assignment is DDP's own function,
    ``dist._compute_bucket_assignment_by_size`` (a bucket closes once it holds the cap or more, so a few
    large weights make buckets larger than the cap and fewer than bytes ÷ cap), run over the parameters in
    reverse order on the meta device: nothing is allocated."""
    import torch
    import torch.distributed as dist

    from parlab.decide.advice import preset
    from parlab.lab.measure.activations import config_json, meta_model

    dtypes = {2: torch.bfloat16, 4: torch.float32}
    if value_bytes not in dtypes:
        raise ValueError(f"value_bytes={value_bytes!r}; choose 2 (bf16 gradients) or 4 (fp32 gradients)")
    if bucket_bytes is not None:
        positive_int("bucket_bytes", bucket_bytes, "bytes per bucket (DDP's bucket_cap_mb × 2**20)")
    config = preset(model) if isinstance(model, str) else model
    grads = [torch.empty(p.numel(), dtype=dtypes[value_bytes], device="meta")
             for p in reversed(list(meta_model(config_json(config)).parameters()))]
    limits = ([dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_BYTES] if bucket_bytes is None
              else [bucket_bytes])
    buckets, _ = dist._compute_bucket_assignment_by_size(grads, limits, [False] * len(grads))
    return [sum(grads[i].numel() * value_bytes for i in bucket) for bucket in buckets]
