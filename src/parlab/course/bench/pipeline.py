"""Pipeline schedules run for real: recorded timelines, activation memory, messages and step times, the
course's executor beside ``torch.distributed.pipelining`` on the same model (chapter 06;
``benchmarks/pipeline_schedules.py``).

The model is a stack of residual MLP blocks (``parlab.lab.models.tiny_blocks``), ``blocks_per_rank`` of them
per rank, cut into ``p·v`` stages, so that every schedule, interleaved or not, gives each rank the same
work. :func:`record` runs on every rank: for each requested run it builds the stages, takes one untimed
step, then ``steps`` recorded ones, and keeps the step that took least time (the one a busy machine
disturbed least); every step's events are kept too, so that a chapter can show the spread over steps.
:func:`recorded_bubbles` gives a run's bubble at each recorded step.
:func:`gpt2_step` runs one step of a tiny GPT-2 cut by layers under our executor or PyTorch's, for the
chapter's parity check (:func:`gpt2_steps`: several in one launch); :func:`traffic` is the chapter's model of
what DDP, TP and PP send per step.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import parlab
from parlab.lab.measure import ActivationTracker, CommLog, Timeline, measure_activations
from parlab.lab.measure.attach import not_activations
from parlab.lab.measure.steptime import time_alternating
from parlab.lab.models import regression_batch, tiny_blocks
from parlab.lab.parallel import pipeline_schedule as ps
from parlab.lab.parallel.pipeline import Pipeline, record_stage, split_sequential

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
    """The pieces one run needs on this rank: (step function, this rank's stage modules, their indices). The
    step records into whatever is attached around it: a ``CommLog``, a ``Timeline``, an ``ActivationTracker``
    (which counts the stages' activations, not the loss's)."""
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
        pipe = Pipeline([stages[s] for s in mine], schedule, activation_shape=(cfg["batch"] // m, cfg["hidden"]))
        return functools.partial(pipe.step, x if first else None, y if last else None), [stages[s] for s in mine], mine
    import torch.distributed.pipelining as pipelining

    # PyTorch cuts the batch into views of one storage, and an ActivationTracker counts a storage once,
    # whole: the first stage would count the entire batch as soon as it saved one micro-batch's input. A
    # copy gives each micro-batch's input a storage of its own, as our executor's are.
    modules = {s: torch.nn.Sequential(_OwnStorage(), *stages[s]) if s == 0 else stages[s] for s in mine}
    torch_stages = [record_stage(pipelining.PipelineStage(modules[s], s, p * v, parlab.device()), with_stage=v > 1)
                    for s in mine]
    schedule = getattr(pipelining, TORCH_SCHEDULES[name])(torch_stages if v > 1 else torch_stages[0], m,
                                                           loss_fn=_not_counted(F.mse_loss))

    def step():
        losses: list = []
        schedule.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
        return losses

    # A multi-stage schedule runs its pipeline_order; a one-stage schedule's is only a drawing aid (in
    # PyTorch 2.13 Schedule1F1B's omits the last rank's first forward), so ours stands in for it.
    multi = isinstance(schedule, pipelining.schedules.PipelineScheduleMulti)
    step.pipeline_order = schedule.pipeline_order if multi else None
    return step, [modules[s] for s in mine], mine


def _not_counted(loss_fn):
    """``loss_fn`` for PyTorch's schedule, which computes the loss outside its stages: what it saves for
    backward is kept out of an ActivationTracker's count, as our executor keeps it."""
    @functools.wraps(loss_fn)
    def loss(*args, **kwargs):
        with not_activations():
            return loss_fn(*args, **kwargs)
    return loss


class _OwnStorage(torch.nn.Module):
    def forward(self, x):
        return x.clone()  # saves nothing for backward; the next layer saves this copy


def record(runs: list[tuple], cfg: dict, steps: int = 3) -> list[dict]:
    """On every rank: each run ``(who, name, m, v)`` (``who``: ``"ours"`` or ``"torch"``; ``v`` used by
    our interleaved schedule) → this rank's recorded step: ``events`` (its operations), ``seconds`` (the
    step), ``peak`` bytes of activations held and ``per_micro_batch`` (activations one micro-batch leaves
    on this rank's stages, measured alone), ``memory`` (time, bytes) samples, ``messages`` (op, bytes) and
    the ``losses`` on the last stage, all of them from the fastest step; ``rounds``: every recorded step's events (their spread).
    """
    out = []
    for run in runs:
        step, modules, mine = _setup(run, cfg)
        step()  # untimed: first-call costs (allocations, PyTorch's shape exchange) stay out of the record
        best, rounds = None, []
        for _ in range(steps):
            for module in modules:
                module.zero_grad(set_to_none=True)
            tracker = ActivationTracker([q for m in modules for q in m.parameters()])
            with CommLog() as log, Timeline() as timeline, tracker:
                losses = step()
            seconds = max(e.end for e in timeline.events) - min(e.start for e in timeline.events)
            seconds = _slowest(seconds)
            rounds.append(timeline.events)
            if best is None or seconds < best["seconds"]:
                best = {"events": timeline.events, "seconds": seconds, "peak": tracker.peak,
                        "memory": [(t - timeline.zero, b) for t, b in tracker.samples],
                        "messages": [(r.op, r.bytes) for r in log.records],  # PyTorch's send past our door: []
                        "losses": [float(v.detach()) for v in losses]}
        b = cfg["batch"] // run[2]
        x = torch.randn(b, cfg["hidden"], device=parlab.device())
        best["per_micro_batch"] = sum(measure_activations(module, x) for module in modules)
        best["run"], best["stages"], best["rounds"] = run, mine, rounds
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
            step, modules, _ = _setup((who, name, cfg["m"], 2), cfg)
            fns[f"{who} {name}"] = functools.partial(_train_step, step, modules)
    return time_alternating(fns, rounds=cfg["rounds"], steps=cfg["steps"], warmup=cfg["warmup"])


def _train_step(step, modules):
    step()
    for module in modules:
        module.zero_grad(set_to_none=True)


def summary(times: dict) -> dict:
    """Per schedule: the median step time of ours and of PyTorch's, and our throughput relative to PyTorch's
    (the median of per-round ratios, ``parlab.lab.measure.summarize``)."""
    from parlab.lab.measure import summarize

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


def recorded_bubbles(results, i: int) -> list[float]:
    """Run ``i`` of a :func:`record` launch (``results``: every rank's): the bubble of each recorded step."""
    from parlab.lab.measure import merge

    steps = len(results[0][i]["rounds"])
    return [ps.bubble_fraction(merge(r[i]["rounds"][k] for r in results)) for k in range(steps)]


# -- chapter 06: a tiny GPT-2 cut by layers, one step under our executor or PyTorch's ----------------------

GPT2 = dict(seq=32, vocab=128, embd=64, batch=8, m=4)  # the parity check's tiny GPT-2 and its batch


def _gpt2(num_layers: int):
    from parlab.lab.models import tiny_gpt2

    return tiny_gpt2(n_layer=num_layers, n_embd=GPT2["embd"], n_head=2, vocab_size=GPT2["vocab"],
                     n_positions=GPT2["seq"], seed=0, tie_word_embeddings=False)


def _gpt2_tokens():
    from parlab.lab.models import token_batch

    return token_batch(GPT2["batch"], GPT2["seq"], GPT2["vocab"], seed=1)  # (batch, seq)


def gpt2_step(who: str, name: str) -> dict:
    """On every rank: one training step of a tiny GPT-2 with 2p layers under schedule ``name`` (``"gpipe"``,
    ``"1f1b"``, ``"interleaved"``, v = 2), run by ``who``: ``"ours"`` or ``"torch"`` → this rank's
    ``losses`` (last stage), ``messages`` (op, bytes; ours only) and ``grads`` by stage."""
    from parlab.lab.parallel.pipeline import causal_lm_loss, split_gpt2

    p, m = parlab.world_size(), GPT2["m"]
    schedule = ps.make(name, p, m, v=2)
    stages = split_gpt2(_gpt2(2 * p), schedule.num_stages)  # same cut everywhere; keep our own
    tokens = _gpt2_tokens().to(parlab.device())
    mine = schedule.stages_of(parlab.rank())
    first, last = 0 in mine, schedule.num_stages - 1 in mine
    log = CommLog()
    if who == "ours":
        pipe = Pipeline([stages[s].to(parlab.device()) for s in mine], schedule, loss_fn=causal_lm_loss,
                        activation_shape=(GPT2["batch"] // m, GPT2["seq"], GPT2["embd"]))
        with log:
            losses = pipe.step(tokens if first else None, tokens if last else None)
    else:
        import torch.distributed.pipelining as pipelining

        stage = [pipelining.PipelineStage(stages[s].to(parlab.device()), s, schedule.num_stages, parlab.device())
                 for s in mine]
        run = getattr(pipelining, TORCH_SCHEDULES[name])(stage if len(mine) > 1 else stage[0], m,
                                                         loss_fn=causal_lm_loss)
        losses = []
        run.step(*((tokens,) if first else ()), **({"target": tokens, "losses": losses} if last else {}))
    return {"losses": [v.detach().cpu() for v in losses], "messages": [(r.op, r.bytes) for r in log.records],
            "grads": {s: [q.grad.cpu() for q in stages[s].parameters()] for s in mine}}


def gpt2_steps(runs: list[tuple]) -> dict:
    """On every rank: :func:`gpt2_step` for each ``(who, name)`` of ``runs``, in one launch (one start-up
    of the ranks instead of one per run) → ``{(who, name): this rank's result}``."""
    return {run: gpt2_step(*run) for run in runs}


def gpt2_stages(p: int, num_stages: int):
    """The tiny GPT-2 :func:`gpt2_step` trains on ``p`` ranks (2p layers), cut into ``num_stages`` stages."""
    from parlab.lab.parallel.pipeline import split_gpt2

    return split_gpt2(_gpt2(2 * p), num_stages)


def gpt2_single(num_layers: int, num_stages: int):
    """One process: the loss of the whole batch and every gradient, grouped by the stages of the same cut."""
    from parlab.lab.parallel.pipeline import split_gpt2

    model, tokens = _gpt2(num_layers), _gpt2_tokens()
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return loss.detach(), {s: [q.grad for q in st.parameters()] for s, st in enumerate(split_gpt2(model, num_stages))}


# -- chapter 06: what DDP, TP and PP send per step, a model ------------------------------------------------

def traffic(config, n: int, batch: int, seq: int, m: int, value_bytes: int = 2) -> dict:
    """(messages, bytes) the busiest of ``n`` ranks sends per step for ``config`` (a transformers config):
    DDP's bucketed ring all-reduces of the gradients (``planner.ddp_buckets``), Megatron TP's four ring
    all-reduces of (batch, seq, hidden) per layer (the heads must split ``n`` ways), and a pipeline's ``m``
    activations forward and ``m`` gradients backward of (batch/m, seq, hidden). Values of ``value_bytes``."""
    from parlab.decide import planner
    h, layers = config.hidden_size, config.num_hidden_layers
    if config.num_attention_heads % n:
        raise ValueError(f"{config.num_attention_heads} attention heads do not split over {n} tensor-parallel ranks")
    buckets = planner.ddp_buckets(config, value_bytes=value_bytes)
    act = batch * seq * h * value_bytes
    return {"DDP": (len(buckets) * 2 * (n - 1), sum(2 * (n - 1) * b / n for b in buckets)),
            "TP": (4 * layers * 2 * (n - 1), 4 * layers * 2 * (n - 1) * act / n),
            "PP": (2 * m, 2 * m * (batch // m) * seq * h * value_bytes)}


def traffic_seconds(config, what: str, link, n: int, batch: int, seq: int, m: int, value_bytes: int = 2) -> float:
    """The α-β time of :func:`traffic`'s ``what`` on ``link`` (a ``planner.Link``): the planner's collectives
    on a ring of ``n`` ranks, communication only."""
    from parlab.decide import planner
    costs = planner.ring_costs(link, n)
    h, layers = config.hidden_size, config.num_hidden_layers
    if what == "DDP":
        return sum(planner.collective_seconds("all_reduce", b, costs)
                   for b in planner.ddp_buckets(config, value_bytes=value_bytes))
    if what == "TP":
        return 4 * layers * planner.collective_seconds("all_reduce", batch * seq * h * value_bytes, costs)
    return 2 * m * planner.collective_seconds("send", batch // m * seq * h * value_bytes, costs)
