"""The course's small training task and the one training loop every strategy shares (chapters 00, 03–07).

A residual MLP (``parlab.lab.models.tiny_blocks``) learns a synthetic regression task. :func:`train_single`
is the one-process reference; :func:`train` trains whatever ``parlab.lab.compose.parallelize`` made of the same
model on a mesh (:func:`train_steps` and :func:`train_reference` do the same for any model and batches), and returns the loss of each step over the *global* batch, identical on every rank, so
that any strategy, any mix of strategies and any launcher can be compared with the reference number for
number. The functions in ``parlab.lab.builtin`` and the scripts in ``examples/`` are built from these.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

from parlab.lab import runtime
from parlab.lab.models import regression_batch, shard, tiny_blocks

HIDDEN = 16
NUM_BLOCKS = 4
LR = 0.05


def make_model(seed: int = 0) -> nn.Sequential:
    """The same initial weights on every rank and in the reference, from ``seed``."""
    return tiny_blocks(NUM_BLOCKS, HIDDEN, seed)


def make_batch(step: int, global_batch: int, seed: int = 0):
    """The global batch of ``step``: the same on every rank, regardless of launcher or strategy."""
    return regression_batch(global_batch, HIDDEN, HIDDEN, seed=seed * 100_003 + step)


def train_single(steps: int = 5, global_batch: int = 16, seed: int = 0) -> list[float]:
    """The reference: one process, the whole batch."""
    return train_reference(make_model(seed=seed), [make_batch(step, global_batch, seed) for step in range(steps)],
                           optimizer_kwargs={"lr": LR})


def train_reference(model: nn.Module, batches, optimizer=torch.optim.SGD, optimizer_kwargs: dict | None = None) -> list[float]:
    """One process trains ``model`` (a block stack or a transformers decoder, as ``parallelize`` takes) on
    ``batches`` of ``(inputs, targets)``, each whole; returns the loss of each step. Every layout of the
    same model is held to these numbers."""
    from parlab.lab.compose_models import single_process

    run, loss_fn = single_process(model)
    opt = optimizer(model.parameters(), **(optimizer_kwargs or {"lr": LR}))
    losses = []
    for x, y in batches:
        loss = loss_fn(run(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train(parts, steps: int = 5, global_batch: int = 16, seed: int = 0) -> list[float]:
    """The shared loop on the course's task: ``parts`` (a ``parlab.lab.compose.Parallelized``) trains for
    ``steps`` (see :func:`train_steps`)."""
    return train_steps(parts, [make_batch(step, global_batch, seed) for step in range(steps)])


def train_steps(parts, batches) -> list[float]:
    """The shared loop: ``parts`` (a ``parlab.lab.compose.Parallelized``) takes one step per global batch
    ``(inputs, targets)`` in ``batches``; returns each step's loss over the global batch, on every rank.

    Each data-parallel replica takes its slice of the global batch (the ranks of one tensor- or
    pipeline-parallel group share a slice); the pipeline, if any, cuts the slice into micro-batches.
    """
    topo = parts.topology
    device = runtime.device()
    losses = []
    for batch in batches:
        x, y = (t.to(device) for t in shard(tuple(batch), topo.coord("dp"), topo.dp))
        parts.zero_grad()
        loss = parts.forward_backward(x, y)  # mean over this replica's slice
        parts.step()
        losses.append(parts.global_loss(loss))
    return losses


def script_main(train_fn, argv: list[str] | None = None) -> None:
    """The body of each script in ``examples/``: run ``train_fn`` with ``parlab.launch``.

    Started by torchrun or SLURM, each process is one rank of that job; started with plain ``python``,
    it launches ``--world-size`` ranks itself. Rank 0 prints the losses and, with ``--out``, writes them
    as JSON.
    """
    import parlab
    from parlab.lab.launch.cluster import current_job, exit_without_teardown

    parser = argparse.ArgumentParser(description=(train_fn.__doc__ or "").splitlines()[0])
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 4)))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the losses as JSON to this file (rank 0)")
    args = parser.parse_args(argv)
    result = parlab.launch(train_fn, args.world_size, kwargs={"steps": args.steps, "global_batch": args.global_batch},
                           output="rank0")
    losses = result if current_job() else result[0]  # a job returns this rank's value, else one per rank
    if runtime.rank() == 0:
        print("losses:", " ".join(f"{v:.6f}" for v in losses))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(losses, f)
    if current_job():  # a rank of torchrun's or SLURM's job: leave as parlab.launch's own ranks do
        exit_without_teardown()
    sys.stdout.flush()
