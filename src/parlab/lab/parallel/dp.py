"""``nn.DataParallel``'s data flow, played by ranks, for a transformers causal language model (chapter 03).

``nn.DataParallel`` drives all GPUs from one process, GPU 0 holding the model. Each forward (PyTorch
``torch/nn/parallel/data_parallel.py``, ``_functions.py``, ``comm.py``; ``torch/csrc/cuda/comm.cpp``):

1. **scatter**: the inputs on GPU 0 are split along the batch and copied to each GPU (``comm.scatter``);
   with transformers the labels go with them;
2. **replicate**: GPU 0's parameters and buffers are broadcast to every GPU (``Broadcast`` →
   ``comm.broadcast_coalesced``: tensors packed into buffers of up to 10 MiB, sent with an NCCL broadcast
   when PyTorch has NCCL, else copied device to device) — every step, since only GPU 0's copy is trained;
3. **forward** on every replica, each in its own Python thread; a transformers model given ``labels``
   computes its own loss on its own shard;
4. **gather**: every output goes to GPU 0 (``comm.gather``): the losses (one per replica) *and* the logits,
   since DataParallel gathers whatever the model returns;
5. **backward**: the caller reduces the losses on GPU 0 (``loss.mean()``); ``Gather``'s backward scatters
   each replica its share of the gradient (1/n), every replica runs backward, and ``Broadcast``'s
   backward, ``ReduceAddCoalesced``, sums the replicas' gradients into GPU 0's ``.grad``
   (``comm.reduce_add_coalesced``: 10 MiB buffers, an NCCL reduce when available);
6. **step**: the optimizer, on GPU 0 alone.

With no GPUs ``nn.DataParallel`` does nothing at all (``device_ids=[]``), so chapter 03 plays these steps
with ranks, rank 0 as GPU 0, each exchange a collective through :func:`parlab.lab.parallel.comm.communicate`
(so an attached :class:`parlab.lab.measure.CommLog` counts every byte) and each computation a span
(``parlab.lab.measure.attach.span``) on any attached :class:`parlab.lab.measure.Timeline`. The same tensors move,
between the same places; what ranks cannot show is the single process, whose Python threads share the
GIL. It trains exactly like one process on the global batch, which the chapter and ``tests/test_dp.py``
check.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from parlab.lab.measure.attach import span
from parlab.lab.parallel.comm import communicate

COALESCE_BYTES = 10 * 1024 * 1024  # broadcast_coalesced / reduce_add_coalesced's buffer_size (10 MiB)


def _coalesced(tensors, limit: int = COALESCE_BYTES):
    """Runs of ``tensors`` of one dtype whose bytes add up to at most ``limit`` (one tensor if larger)."""
    run, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if run and (size + nbytes > limit or t.dtype != run[0].dtype):
            yield run
            run, size = [], 0
        run.append(t)
        size += nbytes
    if run:
        yield run


@torch.no_grad()
def _broadcast_coalesced(tensors, comm) -> None:
    """``comm.broadcast_coalesced``: rank 0's ``tensors``, packed into ≤ 10 MiB buffers, onto every rank."""
    for run in _coalesced(tensors):
        flat = _flatten_dense_tensors(run)  # (sum of numel,): one buffer
        comm("broadcast", flat, "replicate")
        for t, part in zip(run, _unflatten_dense_tensors(flat, run)):
            t.copy_(part)


def _reduce_add_coalesced(grads, comm, rank: int) -> None:
    """``comm.reduce_add_coalesced``: every rank's ``grads``, summed into rank 0's, in ≤ 10 MiB buffers."""
    for run in _coalesced(grads):
        flat = _flatten_dense_tensors(run)
        comm("reduce", flat, "gradients")
        if rank == 0:
            for g, part in zip(run, _unflatten_dense_tensors(flat, run)):
                g.copy_(part)


def dataparallel_step(model, batch: torch.Tensor, optimizer=None) -> float | None:
    """One DataParallel step on global ``batch`` (global batch, seq) token ids; returns the loss on rank 0.

    Every rank calls it with a batch of the same shape; only rank 0's values are used. ``optimizer`` is
    used on rank 0 only (DataParallel steps GPU 0's parameters). Inside ``with Timeline():`` each
    computation is a span; inside ``with CommLog(timeline=tl):`` every exchange is recorded (and drawn) too.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if batch.shape[0] % n:
        raise ValueError(f"batch size {batch.shape[0]} does not split over {n} ranks")
    dev = next(model.parameters()).device

    def comm(op, tensor, label, **kw):
        root = {"src": 0} if op in ("scatter", "broadcast") else {"dst": 0}
        communicate(op, tensor, label=label, **root, **kw)

    # 1. scatter: rank 0's batch, one slice per rank (token ids; the labels are the same ids)
    batch = batch.to(dev)
    mine = torch.empty_like(batch.chunk(n)[0])  # (batch / n, seq)
    comm("scatter", mine, "inputs", chunks=list(batch.chunk(n)) if rank == 0 else None)
    # 2. replicate: rank 0's parameters, packed into ≤ 10 MiB buffers, broadcast
    params = [p for p in model.parameters() if p.requires_grad]
    _broadcast_coalesced([*params, *model.buffers()], comm)
    # 3. forward: each replica computes its own loss on its own slice
    with span("forward"):
        out = model(input_ids=mine, labels=mine)
    # 4. gather: the losses and the logits go to rank 0
    losses = [torch.empty_like(out.loss) for _ in range(n)] if rank == 0 else None
    logits = [torch.empty_like(out.logits) for _ in range(n)] if rank == 0 else None
    comm("gather", out.loss.detach().reshape(1), "losses",
         chunks=[x.reshape(1) for x in losses] if rank == 0 else None)
    comm("gather", out.logits.detach(), "logits", chunks=logits)  # (batch / n, seq, vocab) from each
    # 5. backward: rank 0 averages the losses; d(mean)/d(loss_r) = 1/n goes back to each replica
    share = torch.empty((), device=dev)
    result = None
    if rank == 0:
        with span("loss"):
            gathered = torch.stack(losses).requires_grad_()  # (n,)
            mean = gathered.mean()
            mean.backward()
            result = mean.item()
    comm("scatter", share.reshape(1), "loss grads",
         chunks=[g.reshape(1) for g in gathered.grad] if rank == 0 else None)
    with span("backward"):
        out.loss.backward(share)
    #    ... and the replicas' gradients are summed on rank 0, in ≤ 10 MiB buffers
    _reduce_add_coalesced([p.grad for p in params], comm, rank)
    if rank != 0:  # a replica's gradients live only until they are reduced
        model.zero_grad(set_to_none=True)
    # 6. step, on rank 0 alone
    if rank == 0 and optimizer is not None:
        with span("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    return result


def train_like_dataparallel(model, batches, optimizer=None) -> list[float | None]:
    """:func:`dataparallel_step` on each global batch; ``optimizer`` (rank 0 only) defaults to SGD lr=0.05.
    Returns rank 0's losses (``None`` on the other ranks)."""
    if optimizer is None and dist.get_rank() == 0:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return [dataparallel_step(model, batch, optimizer) for batch in batches]
