"""ZeRO's stages beside PyTorch's DDP and FSDP2, timed: step time and memory per rank of every implementation
on the same model in the same ranks, in alternating rounds (chapter 04, sections 7 and 8; ``benchmarks/zero.py``).

:func:`prepare` builds one implementation on this rank; :func:`measure` times and weighs them all;
:func:`plot` draws the result.
"""

from __future__ import annotations

import functools

import torch

import parlab
from parlab.lab.measure import measure_memory, peak_memory, time_alternating

KINDS = ("ddp", "zero1", "zero2", "zero3", "zero3_prefetch", "fsdp2")
LABELS = {"ddp": "DistributedDataParallel", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
          "zero3_prefetch": "ZeRO-3 + prefetch", "fsdp2": "FSDP2 fully_shard"}
PRESETS = {  # GPT-2 sizes: a CPU box, and a GPU (GPT-2 small, as in the guide's benchmark)
    "cpu": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=2048, seq_len=64, batch=8, bucket_mb=1.0),
    "gpu": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=512, batch=8, bucket_mb=25.0),
}


def make_model(cfg: dict):
    """The tiny GPT-2 of a preset, the same on every rank."""
    from parlab.lab.models import tiny_gpt2

    return tiny_gpt2(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                     vocab_size=cfg["vocab_size"], n_positions=cfg["seq_len"], seed=0)


def prepare(kind: str, cfg: dict, group=None):
    """(model to call, what takes the step: ``.step()``, ``.zero_grad()``, (module, optimizer) for
    ``measure_memory``) of one implementation, on this rank, over ``group`` (default: all ranks; FSDP2: all)."""
    from parlab.lab.parallel import ZeroStage1, ZeroStage2, ZeroStage3

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

        from parlab.lab import runtime
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
    from parlab.lab.models import shard, token_batch

    rank, n = parlab.rank(), parlab.world_size()
    x = shard(token_batch(cfg["batch"] * n, cfg["seq_len"], cfg["vocab_size"], seed=0), rank, n).to(parlab.device())

    def step(kind, zero_grad=True):
        model, stepper, _ = runs[kind]
        model(input_ids=x, labels=x).loss.backward()
        stepper.step()
        if zero_grad:
            stepper.zero_grad()

    return step


def plot(result: dict, title: str, reference: str):
    """Median step time (with throughput relative to ``reference``) and memory per rank, one bar each. With
    ``result["step_s"]`` (seconds per step, one per round), every round is drawn as a dot over its bar and
    the throughput label gives the range over rounds: the spread is part of the measurement."""
    import matplotlib.pyplot as plt

    from parlab.lab.plots import MEMORY_COLORS

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
