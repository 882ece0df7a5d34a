"""ZeRO's stages (``parlab.parallel.zero``) beside PyTorch's DDP and FSDP2, as chapter 04 runs them.

- :func:`train`: the chapter's training run on each rank: any wrapper (the course's stages, or PyTorch's
  behind :class:`Wrapped`), its collectives, bytes, memory, a timeline, and the **reduced gradients of the
  first step** (:class:`FirstGradients`), which a parity check compares before Adam can hide a wrong scale.
- :func:`measure`: step time and memory per rank, every implementation on the same model in the same ranks,
  timed in alternating rounds (chapter 04, sections 7 and 8; ``benchmarks/zero.py``); :func:`plot` draws them.
- :func:`time_apart` (chapter 04, under the hood): the compute that ``parlab.planner.predict_dp_step`` takes,
  and what that model leaves out, each implementation timed alone and with its peers.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time

import torch
import torch.distributed as dist

import parlab
from parlab.measure import bytes_written, measure_memory, peak_memory, time_alternating

KINDS = ("ddp", "zero1", "zero2", "zero3", "zero3_prefetch", "fsdp2")
LABELS = {"ddp": "DistributedDataParallel", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
          "zero3_prefetch": "ZeRO-3 + prefetch", "fsdp2": "FSDP2 fully_shard"}
PRESETS = {  # GPT-2 sizes: a CPU box, and a GPU (GPT-2 small, as in the guide's benchmark)
    "cpu": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=2048, seq_len=64, batch=8, bucket_mb=1.0),
    "gpu": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=512, batch=8, bucket_mb=25.0),
}


def make_model(cfg: dict):
    """The tiny GPT-2 of a preset, the same on every rank."""
    from parlab.models import tiny_gpt2

    return tiny_gpt2(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                     vocab_size=cfg["vocab_size"], n_positions=cfg["seq_len"], seed=0)


def prepare(kind: str, cfg: dict, group=None):
    """(model to call, what takes the step: ``.step()``, ``.zero_grad()``, (module, optimizer) for
    ``measure_memory``) of one implementation, on this rank, over ``group`` (default: all ranks; FSDP2: all)."""
    from parlab.parallel import ZeroStage1, ZeroStage2, ZeroStage3

    dev = parlab.device()
    model = make_model(cfg).to(dev)
    adamw = dict(lr=1e-4, process_group=group)
    if kind.startswith("zero"):
        if kind == "zero1":
            zero = ZeroStage1(model, torch.optim.AdamW, **adamw)
        elif kind == "zero2":
            zero = ZeroStage2(model, torch.optim.AdamW, bucket_bytes=int(cfg["bucket_mb"] * 2**20), **adamw)
        else:
            zero = ZeroStage3(model, torch.optim.AdamW, blocks=model.transformer.h,
                              prefetch=kind == "zero3_prefetch", **adamw)
        return zero, zero, (zero, zero.optimizer)
    adamw.pop("process_group")
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        from parlab import runtime

        ranks = runtime.mesh(group=group)  # this rank's device type, over the group
        for block in model.transformer.h:
            fully_shard(block, mesh=ranks)
        fully_shard(model, mesh=ranks)
        opt = torch.optim.AdamW(model.parameters(), **adamw)
        return model, opt, (model, opt)
    if kind == "ddp":
        # Gradients as views of DDP's buckets: one copy of them, as the memory formula counts.
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                                                        bucket_cap_mb=cfg["bucket_mb"], gradient_as_bucket_view=True,
                                                        process_group=group)
        opt = torch.optim.AdamW(ddp.parameters(), **adamw)
        opt.zero_grad = functools.partial(opt.zero_grad, set_to_none=False)  # keep the bucket views
        return ddp, opt, (model, opt)
    raise ValueError(f"kind={kind!r}; choose from {', '.join(KINDS)}")


def measure(cfg: dict) -> dict:
    """Runs on every rank. ``cfg``: a preset plus ``kinds``, ``rounds``, ``steps``, ``warmup``. Returns
    {"times": {kind: [seconds per step, one per round]} (the slowest rank's), "memory": {kind: bytes this rank
    holds after a step, by part, and "peak": the most during one (on a CPU, the least of three steps' peaks)},
    "groups": {kind: [(name, numel, padded numel)] of the course's stages' flat groups}, "num_params"}."""
    dev = parlab.device()
    kinds = cfg.get("kinds", KINDS)
    runs = {k: prepare(k, cfg) for k in kinds}
    step = _stepper(runs, cfg)

    memory = {}
    # On a CPU rank, peak_memory now and then counts a buffer that gloo's worker freed unseen (a bucket's or a
    # block's flat gradient), or a gloo buffer in flight at that moment: both only add, and vary from step to
    # step, so the least of a few identical steps is the step's own peak.
    tries = 1 if dev.type == "cuda" else 3
    for kind in kinds:  # one at a time, so that each peak is its own
        for _ in range(2):  # the optimizer's state exists after one step, DDP's rebuilt buckets after two
            step(kind)
        held = measure_memory(*runs[kind][2]).total  # what the rank holds between steps
        extra = []
        for _ in range(tries):
            extra.append(peak_memory(step, kind, False, device=dev)[1])
            memory[kind] = measure_memory(*runs[kind][2]).as_dict()  # after the step, before zero_grad
            runs[kind][1].zero_grad()
        memory[kind]["peak"] = held + min(extra)
    times = time_alternating({k: functools.partial(step, k) for k in kinds}, rounds=cfg["rounds"],
                             steps=cfg["steps"], warmup=cfg["warmup"])
    groups = {k: [(g.name, g.numel, g.padded_numel) for g in run[0].groups] for k, run in runs.items()
              if hasattr(run[0], "groups")}
    return {"times": times, "memory": memory, "groups": groups,
            "num_params": sum(p.numel() for p in make_model(cfg).parameters())}


def _stepper(runs: dict, cfg: dict):
    """step(kind, zero_grad=True): one training step of ``runs[kind]`` on this rank's shard of the batch."""
    from parlab.models import shard, token_batch

    rank, n = parlab.rank(), parlab.world_size()
    x = shard(token_batch(cfg["batch"] * n, cfg["seq_len"], cfg["vocab_size"], seed=0), rank, n).to(parlab.device())

    def step(kind, zero_grad=True):
        model, stepper, _ = runs[kind]
        model(input_ids=x, labels=x).loss.backward()
        stepper.step()
        if zero_grad:
            stepper.zero_grad()

    return step



# -- the chapter's training run ---------------------------------------------------------------------------------

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
        from parlab.parallel.zero import _Zero

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
        from parlab.parallel.comm import communicate

        out = {}
        for g, shard in zip(self.wrapper.groups, self.kept):
            flat = torch.empty(g.padded_numel, dtype=shard.dtype, device=shard.device)
            communicate("all_gather", shard, self.wrapper.process_group, output=flat)
            out.update((name, view.clone()) for name, view in zip(g.names, g.views(flat)))
        return out


def train(make, cfg: dict) -> dict:
    """Runs on every rank: ``cfg["steps"]`` steps of ``make(model, log)`` (a wrapper) on this rank's shard of
    each global batch. ``cfg``: ``sizes`` (``tiny_gpt2``'s), ``batch_per_rank``, ``seq_len``, ``steps``.

    Each rank starts from its *own* random GPT-2 (seed = rank): only the wrapper's broadcast makes them agree.
    Returns the full weights (``state``), the global batch's ``losses``, the first step's reduced ``grads``,
    the last step's collectives (``records``: the ``CommLog``'s, and those ``record_comm`` saw of the wrapper's
    ``watched_ops``), the bytes the OS saw this rank send in it (``sent``), what it holds after it
    (``memory``), its timeline (``events``), each step's seconds on this rank (``step_s``), and the course's
    stages' flat ``groups`` and (stage 3) gathered-weights ``trace``."""
    from parlab.measure import CommLog, Timeline, measure_memory, record_comm
    from parlab.models import shard, tiny_gpt2, token_batch
    from parlab.parallel import ZeroStage3

    rank, n, dev = parlab.rank(), parlab.world_size(), parlab.device()
    model = tiny_gpt2(**cfg["sizes"], seed=rank).to(dev)  # a different model on every rank, until broadcast
    log = CommLog()
    zero = make(model, log)
    grads = FirstGradients(zero)
    watched = getattr(zero, "watched_ops", ())
    watch = record_comm if watched else contextlib.nullcontext
    blocks_spans = isinstance(zero, ZeroStage3)  # stage 3 draws each block's forward and backward itself
    losses, seen, step_s = [], None, []
    for step in range(cfg["steps"]):
        log.records.clear()
        timeline = log.timeline = Timeline()  # a barrier, then t = 0 on every rank
        if blocks_spans:
            zero.timeline = timeline
        span = (lambda name: contextlib.nullcontext()) if blocks_spans else timeline.span
        batch = token_batch(cfg["batch_per_rank"] * n, cfg["seq_len"], cfg["sizes"]["vocab_size"], seed=step)
        x = shard(batch, rank, n).to(dev)  # (batch_per_rank, seq_len)
        before, start = bytes_written(), time.perf_counter()
        with watch() as seen:
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


def plot(result: dict, title: str, reference: str):
    """Median step time (with throughput relative to ``reference``) and memory per rank, one bar each. With
    ``result["step_s"]`` (seconds per step, one per round), every round is drawn as a dot over its bar and
    the throughput label gives the range over rounds: the spread is part of the measurement."""
    import matplotlib.pyplot as plt

    from parlab.plots import MEMORY_COLORS

    kinds = list(result["median_step_s"])
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 0.45 * len(kinds) + 1.8), sharey=True)
    med, rounds = result["median_step_s"], result.get("step_s")
    bars = ax_t.barh([LABELS[k] for k in kinds], [med[k] * 1e3 for k in kinds], color="#3377bb", alpha=0.6)
    for i, (bar, k) in enumerate(zip(bars, kinds)):
        label = f"  {result['throughput_vs'][k]:.2f}x {LABELS[reference]}"
        if rounds:
            ax_t.plot([t * 1e3 for t in rounds[k]], [i] * len(rounds[k]), "k.", ms=5)
            ratios = [t / s for t, s in zip(rounds[reference], rounds[k])]
            label += f" (rounds: {min(ratios):.2f}–{max(ratios):.2f})"
        ax_t.text(max([bar.get_width()] + [t * 1e3 for t in (rounds or {}).get(k, [])]),
                  bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
    top = max(max(v) for v in rounds.values()) if rounds else max(med.values())
    ax_t.set_xlim(0, top * 1e3 * 2.3)
    ax_t.set_xlabel("step time (ms): median bar" + (", one dot per round" if rounds else "") + "; lower is better")
    ax_t.invert_yaxis()
    left = [0.0] * len(kinds)
    for part in ("params", "grads", "optimizer"):
        vals = [result["memory"][k][part] / 2**20 for k in kinds]
        ax_m.barh(range(len(kinds)), vals, left=left, color=MEMORY_COLORS[part], label=part)
        left = [a + b for a, b in zip(left, vals)]
    ax_m.plot([result["memory"][k]["peak"] / 2**20 for k in kinds], range(len(kinds)), "k|", ms=14, mew=2,
              label="peak during a step")
    ax_m.set_xlabel("MiB per rank (rank 0)")
    ax_m.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# -- what the α-β model of a step takes, and what it leaves out (chapter 04, under the hood G; the model: parlab.planner)

class _PlainStep:
    """One training step of the plain model with AdamW on this rank's batch, its forward, backward and
    optimizer step each timed (``times``)."""

    def __init__(self, cfg: dict):
        from parlab.models import shard, token_batch

        rank, n, self.dev = parlab.rank(), parlab.world_size(), parlab.device()
        self.model = make_model(cfg).to(self.dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = shard(token_batch(cfg["batch"] * n, cfg["seq_len"], cfg["vocab_size"], seed=0), rank, n).to(self.dev)
        self.times = {"forward_s": [], "backward_s": [], "optimizer_s": []}

    def _timed(self, fn):
        import time

        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        start = time.perf_counter()
        out = fn()
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return out, time.perf_counter() - start

    def __call__(self):
        loss, f = self._timed(lambda: self.model(input_ids=self.x, labels=self.x).loss)
        _, b = self._timed(loss.backward)
        _, s = self._timed(self.opt.step)
        self.opt.zero_grad()
        for key, value in zip(self.times, (f, b, s)):
            self.times[key].append(value)

    def medians(self, skip: int) -> dict[str, float]:
        """The median of each part over the steps after the first ``skip``; the slowest rank's."""
        import statistics

        import torch.distributed as dist

        out = torch.tensor([statistics.median(v[skip:]) for v in self.times.values()])
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return dict(zip(self.times, out.tolist()))


def time_apart(cfg: dict) -> dict:
    """On every rank at once, in alternating rounds (chapter 04, under the hood G): seconds per step of each of
    ``cfg["kinds"]`` (not FSDP2) over all ranks (``"together"``) and with each rank in a process group of its
    own (``"alone"``: nothing to send, no peer to wait for; what is left is the computation, the optimizer
    over every weight, since a rank alone holds every shard, and the implementation's own work: hooks, copies
    into and out of flat buffers, calls into a collective of one rank), and of the plain model with AdamW
    (``"plain"``), whose forward, backward and optimizer step are timed apart in the same rounds
    (``"compute"``, as :func:`time_compute` returns them). Medians; the slowest rank's."""
    import statistics

    import torch.distributed as dist

    alone, _ = dist.new_subgroups(group_size=1)
    kinds = [k for k in cfg.get("kinds", KINDS) if k != "fsdp2"]
    runs = {k: prepare(k, cfg) for k in kinds} | {f"{k} alone": prepare(k, cfg, group=alone) for k in kinds}
    step, plain = _stepper(runs, cfg), _PlainStep(cfg)
    steps = {k: functools.partial(step, k) for k in runs} | {"plain": plain}
    times = time_alternating(steps, rounds=cfg["rounds"], steps=cfg["steps"], warmup=cfg["warmup"])
    median = {k: statistics.median(v) for k, v in times.items()}
    return {"together": {k: median[k] for k in kinds}, "alone": {k: median[f"{k} alone"] for k in kinds},
            "plain": median["plain"], "compute": plain.medians(skip=cfg["warmup"])}


# -- pictures and models chapter 04 draws -------------------------------------------------------------------------

def _short(name: str) -> str:
    return name.replace("transformer.h.", "h").replace("all_gather", "AG").replace("reduce_scatter", "RS")


def plot_stage3_step(run: list, title: str, axes) -> None:
    """A :func:`train` run of ``ZeroStage3`` (every rank's result): its last step as a Gantt chart of every
    rank (``axes[0]``) and rank 0's gathered weights over time (``axes[1]``: up at a gather, down at a free)."""
    import dataclasses

    from parlab.measure import merge
    from parlab.plots import gantt

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


GPU_MODELS = ("GPT-2 XL (1.5B)", "Llama 2 7B")  # the two models chapter 04's GPU model prices


def gpu_compute(psi: float, tokens: int, gpu=None) -> dict[str, float]:
    """MODEL: one GPU's forward, backward (2×) and Adam step for Ψ = ``psi`` parameters and ``tokens`` tokens
    per step (2 FLOPs per parameter per token at the planner's utilisation; Adam bound by memory bandwidth)."""
    from parlab import planner

    gpu = gpu or planner.A100
    forward = 2 * psi * tokens / (gpu.flops * planner.UTILIZATION)
    return dict(forward_s=forward, backward_s=2 * forward,
                optimizer_s=psi * planner.OPTIMIZER_BYTES_PER_PARAM / gpu.memory_bandwidth)


@functools.lru_cache(maxsize=None)
def _shape(name: str) -> tuple[int, int, int]:
    from parlab import planner
    from parlab.advice import preset
    from parlab.measure import count_params

    config = preset(name)
    return count_params(config), config.num_hidden_layers, planner.root_params(config)


def gpu_step_times(name: str, link, gpus: int = 8, tokens: int = 2048,
                   implementation: str = "megatron") -> dict[str, float]:
    """MODEL (``parlab.planner.predict_dp_step``): seconds per step of each strategy for the preset ``name`` in
    bf16 on ``gpus`` A100s joined by ``link``, ``tokens`` per GPU per step; stages 1 and 2 as ``implementation``
    overlaps them (``planner.IMPLEMENTATIONS``), stage 3 as FSDP2 runs it (the root gathered once per step)."""
    import math

    from parlab import planner

    psi, layers, root = _shape(name)
    costs = planner.ring_costs(link, gpus)
    return {kind: planner.predict_dp_step(kind, costs, 2 * psi, gpus, **gpu_compute(psi, tokens),
                                          buckets=math.ceil(2 * psi / planner.BUCKET_BYTES), blocks=layers,
                                          root_bytes=2 * root, implementation=implementation)
            for kind in planner.STRATEGIES}


def gpu_fitting(name: str, gpus: int = 8) -> list[str]:
    """The strategies whose model states (bf16, Adam) fit one A100's memory for the preset ``name``."""
    from parlab import planner
    from parlab.measure import estimate_memory

    return [kind for stage, kind in enumerate(planner.STRATEGIES) if estimate_memory(
        num_params=_shape(name)[0], precision="bf16", world_size=gpus, zero_stage=stage).total <= planner.A100.memory]


def single_process(cfg: dict, world_size: int, **adamw) -> dict:
    """Chapter 04's reference: one process trains :func:`train`'s GPT-2 (seed 0, as rank 0's) on the whole
    global batch (``world_size`` × ``cfg["batch_per_rank"]`` sequences) with AdamW(``**adamw``). Returns
    ``state`` (the final weights), ``losses`` and ``grads`` (the first step's gradients)."""
    from parlab.models import tiny_gpt2, token_batch

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


def plot_gpu_model(links: dict, gpus: int, tokens: int, colors) -> dict:
    """MODEL: for each of :data:`GPU_MODELS`, each strategy's step time ÷ the fastest that fits, against the link's
    bandwidth (1 … 400 GB/s, NVLink's α), ``links`` marked. Returns {(model, link name): (fastest, {strategy:
    seconds})} at each of ``links``, for the strategies that fit."""
    import matplotlib.pyplot as plt

    from parlab import planner

    bandwidths = [10 ** (k / 10) * 1e9 for k in range(0, 27)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    winners = {}
    for ax, name in zip(axes, GPU_MODELS):
        fits = gpu_fitting(name, gpus)
        alpha = next(iter(links.values())).alpha
        curves = [gpu_step_times(name, planner.Link("", alpha, b), gpus, tokens) for b in bandwidths]
        # where stages 1 and 2 price alike at every bandwidth (Megatron's, one micro-batch), one line says so:
        # two lines drawn on top of each other would hide one of them
        same = all(math.isclose(t["zero1"], t["zero2"]) for t in curves)
        for stage, kind in enumerate(planner.STRATEGIES):
            if same and kind == "zero1":
                continue
            label = "zero1 = zero2 (the same time)" if same and kind == "zero2" else kind
            ax.semilogx([b / 1e9 for b in bandwidths], [t[kind] / min(t[k] for k in fits) for t in curves],
                        "-" if kind in fits else ":", color=colors[stage], lw=2.5 if kind == "zero2" else 1.5,
                        label=label + ("" if kind in fits else " (does not fit 80 GB)"))
        for link in links.values():
            ax.axvline(link.bandwidth / 1e9, color="grey", lw=0.6)
            ax.text(link.bandwidth / 1e9, 1.68, link.name, rotation=90, fontsize=7, va="top", ha="right")
            t = {k: v for k, v in gpu_step_times(name, link, gpus, tokens).items() if k in fits}
            winners[name, link.name] = (min(t, key=t.get), t)
        ax.set_ylim(0.95, 1.7)
        ax.set_xlabel("link bandwidth (GB/s)")
        ax.set_ylabel("MODEL: step time ÷ the fastest's")
        ax.set_title(f"MODEL · {name}, bf16, {gpus} GPUs, {tokens:,} tokens per GPU\n"
                     f"stages 1-2 as Megatron-LM overlaps them", fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    return winners
