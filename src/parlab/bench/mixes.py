"""The guide's mixes run for real: a tiny GPT-2 trained under one layout on every rank, and what the layout
costs (chapter 07).

:func:`run` builds the layout with ``parlab.compose.parallelize``, trains a few steps (the losses, to hold
against one process), then measures one more step three ways: the memory each rank holds
(``Parallelized.memory``), the bytes it sends on each axis (``comm_by_axis``), and, untimed instruments
off, the step time (the slowest rank's, median of ``timed`` steps) and the pipeline's operations on a
timeline (its bubble). :func:`layout_on` scales a layout the strategy tool (``parlab.advice``) recommends
for a cluster down to this machine's ranks, keeping its axes.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.compose import COURSE, comm_by_axis, parallelize

#: The tiny decoder of chapter 07: 4 layers, so that 2 pipeline stages hold 2 each; 4 heads for 2 TP ranks.
SIZES = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=128, seq_len=32)
ADAMW = {"lr": 1e-3}


@dataclass(frozen=True)
class Mix:
    """A layout to run: axis sizes, the ZeRO stage of its dp axis, and the implementation of each axis
    (``parallelize``'s ``data_parallel``, ``tensor_parallel``, ``pipeline``, ``schedule`` arguments)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    how: tuple = ()

    @property
    def label(self) -> str:
        axes = [f"{name} {size}" for name, size in (("DP", self.dp), ("PP", self.pp), ("TP", self.tp)) if size > 1]
        zero = {0: "", 1: " + ZeRO-1", 2: " + ZeRO-2", 3: " + ZeRO-3 (FSDP2)"}[self.zero_stage] if self.dp > 1 else ""
        return " × ".join(axes or ["1 rank"]) + zero

    def parallelize_kwargs(self) -> dict:
        """The course's strategy on every axis, FSDP2 for ZeRO-3 (the course's ZeRO-3 takes one backward
        per step, so it does not compose with a pipeline), the course's DDP for plain data parallelism."""
        dp = {0: "course-ddp", 1: "course-zero1", 3: "fsdp"}[self.zero_stage]
        return {**COURSE, "data_parallel": dp, **dict(self.how)}


def make_model(cfg: dict):
    from parlab.models import tiny_gpt2

    return tiny_gpt2(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"], vocab_size=cfg["vocab_size"],
                     n_positions=cfg["seq_len"], seed=0, tie_word_embeddings=False)


def batches(cfg: dict, steps: int, start: int = 0) -> list:
    """Global batches of token ids, ``(inputs, targets)`` alike (the loss shifts them)."""
    from parlab.models import token_batch

    return [(t, t) for t in (token_batch(cfg["global_batch"], cfg["seq_len"], cfg["vocab_size"], seed=s)
                             for s in range(start, start + steps))]


def run(mix: Mix, cfg: dict) -> dict:
    """On every rank: train ``cfg["steps"]`` steps of :func:`make_model` under ``mix`` with
    ``cfg["micro_batches"]`` micro-batches per pipeline step; then measure. Returns this rank's
    ``losses``, ``coords``, ``memory`` (bytes by part), ``bytes`` ({axis: {op: bytes}} of one step),
    ``step_s`` (the slowest rank's median), ``events`` (a timeline of one step's pipeline operations)."""
    from parlab import runtime
    from parlab.measure import Timeline
    from parlab.models import shard
    from parlab.parallel import Topology
    from parlab.training import train_steps

    topo = Topology.build(dp=mix.dp, tp=mix.tp, pp=mix.pp)
    parts = parallelize(make_model(cfg), topo, num_micro_batches=cfg["micro_batches"], optimizer=torch.optim.AdamW,
                        optimizer_kwargs=ADAMW, **mix.parallelize_kwargs())
    losses = train_steps(parts, batches(cfg, cfg["steps"]))
    memory = parts.memory().as_dict()  # after a step: gradients and optimizer state exist
    x, y = (t.to(runtime.device()) for t in shard(batches(cfg, 1, start=cfg["steps"])[0], topo.coord("dp"), topo.dp))

    def step(timeline=None):
        parts.zero_grad()
        parts.forward_backward(x, y, timeline=timeline)
        parts.step()

    with comm_by_axis(topo) as axes:
        step()
    sent = {axis: {} for axis in axes}
    for axis, records in axes.items():
        for r in records:
            if r.op != "barrier":
                sent[axis][r.op] = sent[axis].get(r.op, 0) + r.bytes
    seconds = []
    for _ in range(cfg.get("timed", 3)):
        dist.barrier()
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    slowest = torch.tensor([statistics.median(seconds)])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank does
    timeline = Timeline()
    step(timeline)
    return {"losses": losses, "coords": {a: topo.coord(a) for a in ("pp", "dp", "tp")}, "memory": memory,
            "bytes": sent, "step_s": slowest.item(), "events": timeline.events}


def reference(cfg: dict) -> list[float]:
    """One process, the whole batch: the losses every layout must reproduce."""
    from parlab.training import train_reference

    return train_reference(make_model(cfg), batches(cfg, cfg["steps"]), torch.optim.AdamW, ADAMW)


def num_params(cfg: dict) -> int:
    return sum(p.numel() for p in make_model(cfg).parameters())


def layout_on(label: str, world_size: int) -> Mix | None:
    """The layout a recommendation names (``"TP 8 × PP 2 × DP 2 + ZeRO-1"``, ``"DDP ×32"``, ``"ZeRO-3 ×8"``,
    ``"PP 8 × DP 1"``), on ``world_size`` ranks: the same axes, each model-parallel axis of size 2 (the
    tiny model's 4 layers and 4 heads), data parallelism over the rest. ``None`` for a recommendation
    without a layout ("ZeRO ×N: measure")."""
    axes = {name.lower(): int(size) for name, size in re.findall(r"\b(TP|PP|DP) (\d+)", label)}
    zero = re.search(r"ZeRO-(\d)", label)
    stage = int(zero.group(1)) if zero else 0
    if label.startswith("DDP"):
        return Mix(dp=world_size)
    if label.startswith("ZeRO-3"):
        return Mix(dp=world_size, zero_stage=3)
    if not axes:
        return None
    tp = 2 if axes.get("tp", 1) > 1 else 1
    pp = 2 if axes.get("pp", 1) > 1 else 1
    if world_size % (tp * pp):
        raise ValueError(f"{label!r} needs tp × pp = {tp * pp} to divide world_size={world_size}")
    dp = world_size // (tp * pp)
    return Mix(dp=dp, tp=tp, pp=pp, zero_stage=stage if dp > 1 else 0)
