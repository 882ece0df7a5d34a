"""What the α-β model of a ZeRO step (``parlab.decide.planner.predict_dp_step``) takes, what it leaves out, and what
it predicts on GPUs (chapter 04, under the hood G and section 8).

:func:`time_apart` times each implementation over all ranks and with each rank alone, beside the plain
model's forward, backward and optimizer step; :func:`gpu_step_times`, :func:`gpu_fitting` and
:func:`plot_gpu_model` price the strategies for :data:`GPU_MODELS` on A100s.
"""

from __future__ import annotations

import functools
import math

import torch

import parlab
from parlab.course.bench.zero_measure import KINDS, _stepper, make_model, prepare
from parlab.lab.measure import time_alternating


class _PlainStep:
    """One training step of the plain model with AdamW on this rank's batch, its forward, backward and
    optimizer step each timed (``times``)."""

    def __init__(self, cfg: dict):
        from parlab.lab.models import shard, token_batch

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


GPU_MODELS = ("GPT-2 XL (1.5B)", "Llama 2 7B")  # the two models chapter 04's GPU model prices


def gpu_compute(psi: float, tokens: int, gpu=None) -> dict[str, float]:
    """MODEL: one GPU's forward, backward (2×) and Adam step for Ψ = ``psi`` parameters and ``tokens`` tokens
    per step (2 FLOPs per parameter per token at the planner's utilisation; Adam bound by memory bandwidth)."""
    from parlab.decide import planner
    gpu = gpu or planner.A100
    forward = 2 * psi * tokens / (gpu.flops * planner.UTILIZATION)
    return dict(forward_s=forward, backward_s=2 * forward,
                optimizer_s=psi * planner.OPTIMIZER_BYTES_PER_PARAM / gpu.memory_bandwidth)


@functools.lru_cache(maxsize=None)
def _shape(name: str) -> tuple[int, int, int]:
    from parlab.decide import planner
    from parlab.decide.advice import preset
    from parlab.lab.measure import count_params

    config = preset(name)
    return count_params(config), config.num_hidden_layers, planner.root_params(config)


def gpu_step_times(name: str, link, gpus: int = 8, tokens: int = 2048,
                   implementation: str = "megatron") -> dict[str, float]:
    """MODEL (``parlab.decide.planner.predict_dp_step``): seconds per step of each strategy for the preset ``name`` in
    bf16 on ``gpus`` A100s joined by ``link``, ``tokens`` per GPU per step; stages 1 and 2 as ``implementation``
    overlaps them (``planner.IMPLEMENTATIONS``), stage 3 as FSDP2 runs it (the root gathered once per step)."""
    import math

    from parlab.decide import planner
    psi, layers, root = _shape(name)
    costs = planner.ring_costs(link, gpus)
    return {kind: planner.predict_dp_step(kind, costs, 2 * psi, gpus, **gpu_compute(psi, tokens),
                                          buckets=math.ceil(2 * psi / planner.BUCKET_BYTES), blocks=layers,
                                          root_bytes=2 * root, implementation=implementation)
            for kind in planner.STRATEGIES}


def gpu_fitting(name: str, gpus: int = 8) -> list[str]:
    """The strategies whose model states (bf16, Adam) fit one A100's memory for the preset ``name``."""
    from parlab.decide import planner
    from parlab.lab.measure import estimate_memory

    return [kind for stage, kind in enumerate(planner.STRATEGIES) if estimate_memory(
        num_params=_shape(name)[0], precision="bf16", world_size=gpus, zero_stage=stage).total <= planner.A100.memory]


def plot_gpu_model(links: dict, gpus: int, tokens: int, colors) -> dict:
    """MODEL: for each of :data:`GPU_MODELS`, each strategy's step time ÷ the fastest that fits, against the link's
    bandwidth (1 … 400 GB/s, NVLink's α), ``links`` marked. Returns {(model, link name): (fastest, {strategy:
    seconds})} at each of ``links``, for the strategies that fit."""
    import matplotlib.pyplot as plt

    from parlab.decide import planner
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
            # a short name (before its comma), on the line's right where a slower link lies close on its left
            near = any(link.bandwidth / 1.5 <= o.bandwidth < link.bandwidth for o in links.values())
            ax.text(link.bandwidth / 1e9, 1.78, link.name.split(",")[0], rotation=90, fontsize=7, va="top",
                    ha="left" if near else "right")
            t = {k: v for k, v in gpu_step_times(name, link, gpus, tokens).items() if k in fits}
            winners[name, link.name] = (min(t, key=t.get), t)
        ax.set_ylim(0.95, 1.8)  # room above the curves for the links' names
        ax.set_xlabel("link bandwidth (GB/s)")
        ax.set_ylabel("MODEL: step time ÷ the fastest's")
        ax.set_title(f"MODEL · {name}, bf16, {gpus} GPUs, {tokens:,} tokens per GPU\n"
                     f"stages 1-2 as Megatron-LM overlaps them", fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    return winners
