"""Chapter 04's training run of ZeRO's stages (or PyTorch's, behind :class:`Wrapped`), and the single
process it is checked against: losses, weights and the **reduced gradients of the first step**
(:class:`FirstGradients`), which a parity check compares before Adam can hide a wrong scale; its
collectives, bytes, memory and timeline; and the picture of a ZeRO-3 step (:func:`plot_stage3_step`).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

import parlab
from parlab.lab.measure import bytes_written


class Wrapped(torch.nn.Module):
    """PyTorch's implementations with the course's stages' interface (``step``, ``zero_grad``,
    ``full_state_dict``), so that :func:`train` runs them unchanged. ``watched_ops``: the collectives they
    issue from Python, which ``record_comm`` records."""

    def __init__(self, model, optimizer, full_state_dict, watched_ops):
        super().__init__()
        self.model, self.optimizer, self.full_state_dict = model, optimizer, full_state_dict
        self.watched_ops = watched_ops

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()


class FirstGradients:
    """The gradients the optimizer receives in the first step, reduced over the ranks, whole and by parameter
    name. A parity check on them fails by (N − 1)/N for a wrong scale, where a check on Adam's weights sees
    only what eps lets through. The course's stages: their flat shards' ``.grad`` just before the optimizer
    steps (a step pre-hook); PyTorch's: each parameter's ``.grad`` after backward (DDP's averaged gradients,
    FSDP2's sharded DTensors)."""

    def __init__(self, wrapper, model=None):
        from parlab.lab.parallel.zero import _Zero

        self.wrapper, self.kept = wrapper, None
        self.model = model if model is not None else getattr(wrapper, "model", None)
        self.ours = isinstance(wrapper, _Zero)
        if self.ours:
            self._hook = wrapper.optimizer.register_step_pre_hook(self._take_shards)

    def _take_shards(self, optimizer, args, kwargs):
        self.kept = [g.master.grad.detach().clone() for g in self.wrapper.groups]
        self._hook.remove()

    def after_backward(self):
        if not self.ours and self.kept is None:
            model = getattr(self.model, "module", self.model)  # DDP's module
            self.kept = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    def whole(self) -> dict[str, torch.Tensor]:
        """On every rank (collectives, not recorded): {parameter name: its whole reduced gradient}."""
        if not self.ours:
            return {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in self.kept.items()}
        from parlab.lab.parallel.comm import communicate

        out = {}
        for g, shard in zip(self.wrapper.groups, self.kept):
            flat = torch.empty(g.padded_numel, dtype=shard.dtype, device=shard.device)
            communicate("all_gather", shard, self.wrapper.process_group, output=flat)
            out.update((name, view.clone()) for name, view in zip(g.names, g.views(flat)))
        return out


def train(make, cfg: dict) -> dict:
    """Runs on every rank: ``cfg["steps"]`` steps of ``make(model)`` (a wrapper) on this rank's shard of
    each global batch, each step inside ``with CommLog(), Timeline():`` (a ``Wrapped`` PyTorch DDP's buckets
    are recorded by a comm hook). ``cfg``: ``sizes`` (``tiny_gpt2``'s), ``batch_per_rank``, ``seq_len``,
    ``steps``.

    Each rank starts from its *own* random GPT-2 (seed = rank): only the wrapper's broadcast makes them agree.
    Returns the full weights (``state``), the global batch's ``losses``, the first step's reduced ``grads``,
    the last step's collectives (``records``: the ``CommLog``'s, and those ``record_comm`` saw of the wrapper's
    ``watched_ops``), the bytes the OS saw this rank send in it (``sent``), what it holds after it
    (``memory``), its timeline (``events``), each step's seconds on this rank (``step_s``), and the course's
    stages' flat ``groups`` and (stage 3) gathered-weights ``trace``."""
    from torch.nn.parallel import DistributedDataParallel

    from parlab.lab.measure import CommLog, Timeline, measure_memory, record_comm, record_ddp
    from parlab.lab.models import shard, tiny_gpt2, token_batch
    from parlab.lab.parallel import ZeroStage3

    rank, n, dev = parlab.rank(), parlab.world_size(), parlab.device()
    model = tiny_gpt2(**cfg["sizes"], seed=rank).to(dev)  # a different model on every rank, until broadcast
    log = CommLog()
    zero = make(model)
    if isinstance(getattr(zero, "model", None), DistributedDataParallel):
        record_ddp(zero.model, log)  # PyTorch's DDP all-reduces from C++, past the door: a comm hook records it
    grads = FirstGradients(zero)
    watched = getattr(zero, "watched_ops", ())
    watch = record_comm if watched else contextlib.nullcontext
    blocks_spans = isinstance(zero, ZeroStage3)  # stage 3 draws each block's forward and backward itself
    losses, seen, step_s = [], None, []
    for step in range(cfg["steps"]):
        log.records.clear()
        timeline = log.timeline = Timeline()  # a barrier, then t = 0 on every rank
        span = (lambda name: contextlib.nullcontext()) if blocks_spans else timeline.span
        batch = token_batch(cfg["batch_per_rank"] * n, cfg["seq_len"], cfg["sizes"]["vocab_size"], seed=step)
        x = shard(batch, rank, n).to(dev)  # (batch_per_rank, seq_len)
        before, start = bytes_written(), time.perf_counter()
        with log, timeline, watch() as seen:
            with span("forward"):
                loss = zero(input_ids=x, labels=x).loss
            with span("backward"):
                loss.backward()
            grads.after_backward()
            with timeline.span("step"):
                zero.step()
        step_s.append(time.perf_counter() - start)  # this rank's step, from the timeline's barrier
        sent = None if before is None else bytes_written() - before
        held = measure_memory(zero, zero.optimizer).as_dict()  # after the step, before zero_grad
        zero.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global batch's loss, for the comparison only (not recorded)
        losses.append(total.item() / n)
    records = log.records + [r for r in (seen.records if seen is not None else []) if r.op in watched]
    out = {"state": zero.full_state_dict(), "grads": grads.whole(), "losses": torch.tensor(losses),
           "records": records, "sent": sent, "memory": held, "events": timeline.events, "step_s": step_s}
    if hasattr(zero, "groups"):
        out["groups"] = [(g.name, g.numel, g.padded_numel) for g in zero.groups]
    if blocks_spans:  # (seconds since the timeline's zero, gather | free, group, bytes of gathered weights)
        out["trace"] = [(t - timeline.zero, what, name, held) for t, what, name, held in zero.memory_trace]
    return out


def margin(got: dict, want: dict, rtol: float = 1.3e-6, atol: float = 1e-5) -> float:
    """How far ``got`` is from ``want`` in units of ``assert_close``'s tolerance (its fp32 defaults): the
    largest |got − want| / (atol + rtol·|want|) over every element. Above 1, ``assert_close`` fails."""
    return max(((g.float() - w.float()).abs() / (atol + rtol * w.float().abs())).max().item()
               for g, w in ((got[k], want[k]) for k in want))


def single_process(cfg: dict, world_size: int, **adamw) -> dict:
    """Chapter 04's reference: one process trains :func:`train`'s GPT-2 (seed 0, as rank 0's) on the whole
    global batch (``world_size`` × ``cfg["batch_per_rank"]`` sequences) with AdamW(``**adamw``). Returns
    ``state`` (the final weights), ``losses`` and ``grads`` (the first step's gradients)."""
    from parlab.lab.models import tiny_gpt2, token_batch

    model = tiny_gpt2(**cfg["sizes"], seed=0)
    opt = torch.optim.AdamW(model.parameters(), **adamw)
    losses, grads = [], None
    for step in range(cfg["steps"]):
        x = token_batch(cfg["batch_per_rank"] * world_size, cfg["seq_len"], cfg["sizes"]["vocab_size"], seed=step)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        grads = grads or {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"state": {n: p.detach().clone() for n, p in model.named_parameters()}, "losses": torch.tensor(losses),
            "grads": grads}


def _short(name: str) -> str:
    return name.replace("transformer.h.", "h").replace("all_gather", "AG").replace("reduce_scatter", "RS")


def plot_stage3_step(run: list, title: str, axes) -> None:
    """A :func:`train` run of ``ZeroStage3`` (every rank's result): its last step as a Gantt chart of every
    rank (``axes[0]``) and rank 0's gathered weights over time (``axes[1]``: up at a gather, down at a free)."""
    import dataclasses

    from parlab.lab.measure import merge
    from parlab.lab.plots import gantt

    events = [dataclasses.replace(e, name=_short(e.name)) for e in merge(r["events"] for r in run)]
    gantt(events, title, ax=axes[0], label_min=0.04, label_sublanes=True)
    axes[0].set_xlabel("")
    t0 = min(e.start for e in events)
    trace = run[0]["trace"]
    times = [(t - t0) * 1e3 for t, *_ in trace]
    axes[1].step(times, [held / 2**10 for *_, held in trace], where="post", color="#55A868")
    for x, (_, what, name, held) in zip(times, trace):
        if what == "gather":
            axes[1].annotate(_short(name), (x, held / 2**10), fontsize=7, xytext=(0, 2), textcoords="offset points",
                             ha="center")
    axes[1].set_ylabel("gathered\n(KiB, rank 0)", fontsize=8)
    axes[1].set_ylim(0, max(held for *_, held in trace) / 2**10 * 1.3)
