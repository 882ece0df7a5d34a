"""The course's DDP (v1, v2, v3, ``parlab.lab.parallel.ddp``) against PyTorch's ``DistributedDataParallel``: step
time on the same model and ranks, in alternating rounds (chapter 03, under the hood E; ``benchmarks/ddp_throughput.py``).
"""

from __future__ import annotations

import functools

import torch

import parlab
from parlab.lab.measure.steptime import time_alternating

KINDS = ("v1", "v2", "v3", "torch")
LABELS = {"v1": "v1 naive", "v2": "v2 buckets", "v3": "v3 overlap", "torch": "DistributedDataParallel"}
PRESETS = {  # GPT-2 sizes: a CPU box, and a GPU (GPT-2 small, as in the guide's benchmark)
    "cpu": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=2048, seq_len=64, batch=8, bucket_mb=1.0),
    "gpu": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=512, batch=8, bucket_mb=25.0),
}


def measure(cfg: dict) -> dict:
    """Runs on every rank; returns {kind: [seconds per step, one per round]} (the slowest rank's) under
    ``times``, and the device type the ranks ran on under ``device`` (a plot's label says what ran)."""
    from parlab.lab.models import shard, tiny_gpt2, token_batch
    from parlab.lab.parallel import DDPBuckets, DDPNaive, DDPOverlap

    rank, n, dev = parlab.rank(), parlab.world_size(), parlab.device()
    bucket_bytes = int(cfg["bucket_mb"] * 1024 * 1024)

    def wrapped(kind):
        model = tiny_gpt2(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                          vocab_size=cfg["vocab_size"], n_positions=cfg["seq_len"], seed=0).to(dev)
        if kind == "v1":
            return DDPNaive(model)
        if kind == "v2":
            return DDPBuckets(model, bucket_bytes)
        if kind == "v3":
            return DDPOverlap(model, bucket_bytes)
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=cfg["bucket_mb"])

    models = {k: wrapped(k) for k in KINDS}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    x = shard(token_batch(cfg["batch"] * n, cfg["seq_len"], cfg["vocab_size"], seed=0), rank, n).to(dev)

    def step(kind):
        m = models[kind]
        m(input_ids=x, labels=x).loss.backward()
        if kind != "torch":
            m.sync_gradients()
        opts[kind].step()
        opts[kind].zero_grad()

    times = time_alternating({k: functools.partial(step, k) for k in KINDS}, rounds=cfg["rounds"],
                             steps=cfg["steps"], warmup=cfg["warmup"])
    num_params = sum(p.numel() for p in models["v1"].parameters())
    return {"times": times, "num_params": num_params, "buckets": len(models["v3"].buckets), "device": dev.type}


def plot(result: dict, title: str):
    import matplotlib.pyplot as plt

    med = result["median_step_s"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    kinds = list(KINDS)
    bars = ax.barh([LABELS[k] for k in kinds], [med[k] * 1e3 for k in kinds],
                   color=["#bbbbbb", "#88aacc", "#3377bb", "#cc6633"])
    for bar, k in zip(bars, kinds):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f"  {result['throughput_vs_ddp'][k]:.2f}x DDP", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms), lower is better")
    ax.set_xlim(0, max(med.values()) * 1e3 * 1.35)
    ax.set_title(title, fontsize=9)
    return fig
