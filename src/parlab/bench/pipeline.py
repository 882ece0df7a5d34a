"""Pipeline schedules run for real: recorded timelines, activation memory, messages and step times, the
course's executor beside ``torch.distributed.pipelining`` on the same model (chapter 06;
``benchmarks/pipeline_schedules.py``).

The model is a stack of residual MLP blocks (``parlab.models.tiny_blocks``), ``blocks_per_rank`` of them
per rank, cut into ``p·v`` stages, so that every schedule, interleaved or not, gives each rank the same
work. :func:`record` runs on every rank: for each requested run it builds the stages, takes one untimed
step, then ``steps`` recorded ones, and keeps the step that took least time (the one a busy machine
disturbed least).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import parlab
from parlab.measure import ActivationTracker, CommLog, Timeline, measure_activations
from parlab.measure.steptime import time_alternating
from parlab.models import regression_batch, tiny_blocks
from parlab.parallel import pipeline_schedule as ps
from parlab.parallel.pipeline import Pipeline, record_stage, split_sequential

#: PyTorch's schedules by the course's names; the last three split the backward into I and W.
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                   "zero-bubble": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
                   "dualpipev": "ScheduleDualPipeV"}
V_SHAPED = ("zbv", "dualpipev")  # rank r holds stages r and 2p − 1 − r
#: model sizes for the benchmark: a CPU box, and GPUs (one per rank)
PRESETS = {"cpu": dict(hidden=512, batch=256, blocks_per_rank=2, m=8),
           "gpu": dict(hidden=2048, batch=1024, blocks_per_rank=4, m=8)}
COMPARED = ("gpipe", "1f1b", "interleaved")


def _setup(run: tuple, cfg: dict):
    """The pieces one run needs on this rank: (step function, this rank's stage modules, their indices)."""
    who, name, m, v = run
    rank, p = parlab.rank(), parlab.world_size()
    v = 1 if name in ("naive", "gpipe", "1f1b") else (2 if name in V_SHAPED else v)  # stages per rank
    model = tiny_blocks(p * cfg["blocks_per_rank"], cfg["hidden"], seed=0).to(parlab.device())
    stages = split_sequential(model, p * v)
    x, y = (t.to(parlab.device()) for t in regression_batch(cfg["batch"], cfg["hidden"], cfg["hidden"], seed=1))
    mine = [rank, 2 * p - 1 - rank] if name in V_SHAPED else [rank + c * p for c in range(v)]
    first, last = 0 in mine, p * v - 1 in mine
    if who == "ours":
        schedule = ps.make(name, p, m, v)
        log = CommLog()
        pipe = Pipeline([stages[s] for s in mine], schedule, activation_shape=(cfg["batch"] // m, cfg["hidden"]),
                        on_collective=log)

        def step(timeline=None, tracker=None):
            log.records.clear()
            return pipe.step(x if first else None, y if last else None, timeline=timeline, tracker=tracker)

        return step, [stages[s] for s in mine], mine, log
    import torch.distributed.pipelining as pipelining

    # PyTorch cuts the batch into views of one storage, and an ActivationTracker counts a storage once,
    # whole: the first stage would count the entire batch as soon as it saved one micro-batch's input. A
    # copy gives each micro-batch's input a storage of its own, as our executor's are.
    modules = {s: torch.nn.Sequential(_OwnStorage(), *stages[s]) if s == 0 else stages[s] for s in mine}
    torch_stages = [pipelining.PipelineStage(modules[s], s, p * v, parlab.device()) for s in mine]
    schedule = getattr(pipelining, TORCH_SCHEDULES[name])(torch_stages if v > 1 else torch_stages[0], m,
                                                           loss_fn=F.mse_loss)

    def step(timeline=None, tracker=None):
        for stage in torch_stages:  # record this step into this timeline (None: record nothing)
            record_stage(stage, timeline, tracker, with_stage=v > 1)
        losses: list = []
        schedule.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
        return losses

    # A multi-stage schedule runs its pipeline_order; a one-stage schedule's is only a drawing aid (in
    # PyTorch 2.13 Schedule1F1B's omits the last rank's first forward), so ours stands in for it.
    multi = isinstance(schedule, pipelining.schedules.PipelineScheduleMulti)
    step.pipeline_order = schedule.pipeline_order if multi else None
    return step, [modules[s] for s in mine], mine, None


class _OwnStorage(torch.nn.Module):
    def forward(self, x):
        return x.clone()  # saves nothing for backward; the next layer saves this copy


def record(runs: list[tuple], cfg: dict, steps: int = 3) -> list[dict]:
    """On every rank: each run ``(who, name, m, v)`` (``who``: ``"ours"`` or ``"torch"``; ``v`` used by
    our interleaved schedule) → this rank's recorded step: ``events`` (its operations), ``seconds`` (the
    step), ``peak`` bytes of activations held and ``per_micro_batch`` (activations one micro-batch leaves
    on this rank's stages, measured alone), ``memory`` (time, bytes) samples, ``messages`` (op, bytes) and
    the ``losses`` on the last stage."""
    out = []
    for run in runs:
        step, modules, mine, log = _setup(run, cfg)
        step()  # untimed: first-call costs (allocations, PyTorch's shape exchange) stay out of the record
        best = None
        for _ in range(steps):
            for module in modules:
                module.zero_grad(set_to_none=True)
            timeline, tracker = Timeline(sync=True), ActivationTracker([q for m in modules for q in m.parameters()])
            losses = step(timeline, tracker)
            seconds = max(e.end for e in timeline.events) - min(e.start for e in timeline.events)
            seconds = _slowest(seconds)
            if best is None or seconds < best["seconds"]:
                best = {"events": timeline.events, "seconds": seconds, "peak": tracker.peak,
                        "memory": [(t - timeline.zero, b) for t, b in tracker.samples],
                        "messages": [(r.op, r.bytes) for r in log.records] if log else [],
                        "losses": [float(v.detach()) for v in losses]}
        b = cfg["batch"] // run[2]
        x = torch.randn(b, cfg["hidden"], device=parlab.device())
        best["per_micro_batch"] = sum(measure_activations(module, x) for module in modules)
        best["run"], best["stages"] = run, mine
        best["pipeline_order"] = getattr(step, "pipeline_order", None)
        out.append(best)
    return out


def _slowest(seconds: float) -> float:
    """A pipeline step lasts until its slowest rank is done: the largest value over the ranks."""
    import torch.distributed as dist

    t = torch.tensor([seconds], device=parlab.device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def measure(cfg: dict) -> dict:
    """On every rank: seconds per step of our GPipe, 1F1B and interleaved 1F1B (v = 2) and of PyTorch's, on the
    same model with ``cfg["m"]`` micro-batches, timed in alternating rounds (the slowest rank's time)."""
    fns = {}
    for name in COMPARED:
        for who in ("ours", "torch"):
            step, modules, _, _ = _setup((who, name, cfg["m"], 2), cfg)
            fns[f"{who} {name}"] = functools.partial(_train_step, step, modules)
    return time_alternating(fns, rounds=cfg["rounds"], steps=cfg["steps"], warmup=cfg["warmup"])


def _train_step(step, modules):
    step()
    for module in modules:
        module.zero_grad(set_to_none=True)


def summary(times: dict) -> dict:
    """Per schedule: the median step time of ours and of PyTorch's, and our throughput relative to PyTorch's
    (the median of per-round ratios, ``parlab.measure.summarize``)."""
    from parlab.measure import summarize

    out = {}
    for name in COMPARED:
        pair = {"ours": times[f"ours {name}"], "torch": times[f"torch {name}"]}
        median, ratio = summarize(pair, reference="torch")
        out[name] = {"ours_s": median["ours"], "torch_s": median["torch"], "throughput_vs_torch": ratio["ours"]}
    return out


def plot(result: dict, title: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 3.2))
    ax = fig.subplots()
    names = list(result)
    y = range(len(names))
    ax.barh([i - 0.2 for i in y], [result[n]["ours_s"] * 1e3 for n in names], 0.4, label="course (parlab)", color="#3377bb")
    ax.barh([i + 0.2 for i in y], [result[n]["torch_s"] * 1e3 for n in names], 0.4, label="torch.distributed.pipelining",
            color="#cc6633")
    for i, n in enumerate(names):
        ax.text(result[n]["ours_s"] * 1e3, i - 0.2, f"  {result[n]['throughput_vs_torch']:.2f}×", va="center", fontsize=8)
    ax.set_yticks(list(y), [TORCH_SCHEDULES[n] for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms), lower is better; label: our throughput ÷ PyTorch's")
    ax.set_xlim(0, max(max(r["ours_s"], r["torch_s"]) for r in result.values()) * 1e3 * 1.3)
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
