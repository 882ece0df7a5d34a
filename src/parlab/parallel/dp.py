"""``nn.DataParallel``'s data flow, played by ranks, for a causal language model (chapter 03).

``nn.DataParallel`` drives all GPUs from one process with GPU 0 as the hub. With no GPUs it does nothing
at all (``device_ids=[]``), so chapter 03 replays its five exchanges with ranks instead, rank 0 as GPU 0:

1. rank 0 reads the global batch and scatters one slice to every rank;
2. rank 0's current parameters are copied to every rank (the model is replicated every step);
3. every rank runs forward; the outputs are gathered on rank 0, which computes the loss;
4. the loss's gradient with respect to each rank's outputs is scattered back; every rank runs backward;
5. the gradients are summed on rank 0, which alone takes the optimizer step.

The same tensors move as in ``nn.DataParallel`` (which copies them between GPUs inside one process, not
with collectives), so the traffic through rank 0 and the work it does alone are the same. It trains
exactly like one process on the global batch; the chapter checks that.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def train_like_dataparallel(model, batches, optimizer=None, log: list | None = None) -> None:
    """Train ``model`` (input_ids -> ``.logits``) for one step per global batch in ``batches``.

    ``optimizer`` (used on rank 0 only) defaults to SGD with lr=0.05 over ``model``'s parameters.
    Every rank calls it with the same ``batches`` (each (global batch, seq) token ids; only rank 0 reads
    them, the others use their shapes). If ``log`` is a list, one ``(step, phase, seconds, nbytes)`` is
    appended per phase: ``nbytes`` counts what this rank sends or receives, rank 0 once per other rank.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = next(model.parameters()).device
    params = list(model.parameters())
    num_bytes = sum(p.numel() * p.element_size() for p in params)
    opt = (optimizer or torch.optim.SGD(params, lr=0.05)) if rank == 0 else None

    def hub(nbytes):  # rank 0 sends to (or receives from) each of the others
        return nbytes * (n - 1) if rank == 0 else nbytes

    def timed(step, phase, nbytes, fn):
        start = time.perf_counter()
        out = fn()
        if log is not None:
            log.append((step, phase, time.perf_counter() - start, nbytes))
        return out

    for step, batch in enumerate(batches):
        if batch.shape[0] % n:
            raise ValueError(f"batch size {batch.shape[0]} does not split over {n} ranks")
        batch = batch.to(dev)
        mine = torch.empty_like(batch.chunk(n)[0])  # (batch / n, seq)
        timed(step, "1 scatter inputs", hub(mine.numel() * mine.element_size()),
              lambda: dist.scatter(mine, list(batch.chunk(n)) if rank == 0 else None, src=0))
        timed(step, "2 replicate model", hub(num_bytes), lambda: [dist.broadcast(p.data, src=0) for p in params])
        logits = timed(step, "3 forward", 0, lambda: model(input_ids=mine).logits)  # (batch / n, seq, vocab)
        outs = [torch.empty_like(logits) for _ in range(n)] if rank == 0 else None
        timed(step, "3 gather outputs", hub(logits.numel() * logits.element_size()),
              lambda: dist.gather(logits.detach(), outs, dst=0))
        grads = None
        if rank == 0:
            def loss_on_hub():
                every = torch.cat(outs).requires_grad_()  # (batch, seq, vocab), all on rank 0
                vocab = every.shape[-1]
                loss = F.cross_entropy(every[:, :-1].reshape(-1, vocab), batch[:, 1:].reshape(-1))
                loss.backward()  # d loss / d outputs, for every rank's outputs
                return list(every.grad.chunk(n))
            grads = timed(step, "4 loss on rank 0", 0, loss_on_hub)
        grad_out = torch.empty_like(logits)
        timed(step, "4 scatter loss grads", hub(grad_out.numel() * grad_out.element_size()),
              lambda: dist.scatter(grad_out, grads, src=0))
        timed(step, "4 backward", 0, lambda: logits.backward(grad_out))
        # Summed, not averaged: the loss on rank 0 already averaged over the whole batch.
        timed(step, "5 reduce grads", hub(num_bytes), lambda: [dist.reduce(p.grad, dst=0) for p in params])
        if rank == 0:
            timed(step, "5 optimizer step", 0, opt.step)
            opt.zero_grad()
        model.zero_grad()
