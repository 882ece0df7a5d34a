"""The guide's DataParallel vs DistributedDataParallel benchmark, rerun with one protocol (chapter 03).

The guide ("Efficient Training on Multiple GPUs", Hugging Face) trained GPT-2 with ``run_clm`` on
wikitext-2 for 200 steps at batch size 4 per GPU on 2x TITAN RTX 24 GB joined by NVLink (NV2), and
reported the training time of three set-ups: nn.DataParallel 110.59 s, DistributedDataParallel 101.90 s,
and DDP with NVLink turned off (``NCCL_P2P_DISABLE=1``) 131.44 s.

``benchmarks/dp_vs_ddp.py`` keeps the protocol and drops the downloads: a GPT-2 built from a transformers config (GPT-2
small's sizes), generated token ids instead of wikitext, fixed batch size per GPU and number of steps,
AdamW as the Trainer uses. It runs the three set-ups one after another and prints its table beside the
published one. Chapter 03 (section 7; under the hood, E) runs the same functions.

On CPU there are no GPUs for nn.DataParallel to scatter to (it then runs the module unchanged), so the
analogue plays DP's data flow with ranks (``parlab.lab.parallel.dp``, rank 0 as GPU 0) on the same cores as
DDP, and there is no NVLink to turn off: it shows the shape of the experiment, not its numbers.
"""

from __future__ import annotations

import os
import time

import torch

import parlab

PUBLISHED = {"hardware": "2x TITAN RTX 24 GB, NVLink NV2; pytorch 1.8, cuda 11.0, transformers 4.3",
             "seconds": {"DP": 110.59, "DDP": 101.90, "DDP, NCCL_P2P_DISABLE=1": 131.44}}
SETUPS = tuple(PUBLISHED["seconds"])
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=1024, batch=4, steps=200)
CPU_TINY = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, seq_len=64, batch=4, steps=20)


def build(cfg: dict):
    from parlab.lab.models import tiny_gpt2

    return tiny_gpt2(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                     vocab_size=cfg["vocab_size"], n_positions=cfg["seq_len"], seed=0)


def batches(cfg: dict, global_batch: int):
    """Generated text: the same token ids for every set-up, one (global_batch, seq_len) batch per step."""
    from parlab.lab.models import token_batch

    return [token_batch(global_batch, cfg["seq_len"], cfg["vocab_size"], seed=s)
            for s in range(cfg["warmup"] + cfg["steps"])]


def run_dp(cfg: dict, n: int) -> dict:
    """nn.DataParallel in this process: every step scatters the batch from device 0, replicates the
    model, gathers the outputs (here, one loss per replica) back to device 0."""
    cuda = torch.cuda.is_available()
    model = build(cfg).to("cuda:0" if cuda else "cpu")
    dp = torch.nn.DataParallel(model, device_ids=list(range(n)) if cuda else [])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    data = batches(cfg, cfg["batch"] * n)
    start = None
    for i, x in enumerate(data):
        if i == cfg["warmup"]:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        x = x.to("cuda:0" if cuda else "cpu")
        loss = dp(input_ids=x, labels=x).loss.mean()  # (n,) per-replica losses gathered on device 0
        loss.backward()
        opt.step()
        opt.zero_grad()
    if cuda:
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - start, "final_loss": loss.item()}


def played_dp_rank(cfg: dict) -> dict:
    """CPU analogue of DP: its five exchanges through rank 0, played by ranks (parlab.lab.parallel.dp)."""
    import torch.distributed as dist

    from parlab.lab.parallel.dp import train_like_dataparallel

    n, dev = parlab.world_size(), parlab.device()
    model = build(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    data = batches(cfg, cfg["batch"] * n)
    train_like_dataparallel(model, data[:cfg["warmup"]], opt)
    dist.barrier()
    start = time.perf_counter()
    train_like_dataparallel(model, data[cfg["warmup"]:], opt)
    seconds = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return {"seconds": seconds.item()}


def run_played_dp(cfg: dict, n: int) -> dict:
    return parlab.launch(played_dp_rank, world_size=n, args=(cfg,), backend="gloo", timeout=600, output="rank0")[0]


def ddp_rank(cfg: dict) -> dict:
    """One rank of DistributedDataParallel: its own process, its own shard, one gradient exchange."""
    import torch.distributed as dist

    from parlab.lab.models import shard

    rank, n, dev = parlab.rank(), parlab.world_size(), parlab.device()
    model = build(cfg).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    data = [shard(x, rank, n) for x in batches(cfg, cfg["batch"] * n)]
    start = None
    for i, x in enumerate(data):
        if i == cfg["warmup"]:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dist.barrier()
            start = time.perf_counter()
        x = x.to(dev)
        loss = ddp(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = torch.tensor([time.perf_counter() - start], device=dev)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    return {"seconds": seconds.item(), "final_loss": mean_loss.item() / n}


def run_ddp(cfg: dict, n: int, backend: str, env: dict | None = None) -> dict:
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})  # the ranks inherit this process's environment
    try:
        return parlab.launch(ddp_rank, world_size=n, args=(cfg,), backend=backend, timeout=600, output="rank0")[0]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def table(measured: dict, cpu: bool) -> str:
    pub = PUBLISHED["seconds"]
    unit = "s"
    lines = [f"{'set-up':<26}{'published (s)':>14}{'vs DDP':>8}   {'this run (' + unit + ')':>14}{'vs DDP':>8}",
             "-" * 74]
    for s in SETUPS:
        m = measured.get(s)
        mine = f"{m['seconds']:>14.2f}{m['seconds'] / measured['DDP']['seconds']:>8.2f}" if m else \
            f"{'n/a':>14}{'':>8}"
        lines.append(f"{s:<26}{pub[s]:>14.2f}{pub[s] / pub['DDP']:>8.2f}   {mine}")
    if cpu:
        lines.append("On CPU, DP is its data flow played by ranks (parlab.lab.parallel.dp): nn.DataParallel "
                     "itself has no devices to use.\n"
                     "n/a: on CPU there is no NVLink to turn off (gloo ignores NCCL_P2P_DISABLE).")
    return "\n".join(lines)


def plot(measured: dict, where: str):
    import matplotlib.pyplot as plt

    pub = PUBLISHED["seconds"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ys = range(len(SETUPS))
    ax.barh([y - 0.2 for y in ys], [pub[s] / pub["DDP"] for s in SETUPS], height=0.4,
            label="published: 2x TITAN RTX, NVLink", color="#bbbbbb")
    mine = [measured[s]["seconds"] / measured["DDP"]["seconds"] if s in measured else 0 for s in SETUPS]
    ax.barh([y + 0.2 for y in ys], mine, height=0.4, label=f"this run: {where}", color="#3377bb")
    for y, (s, v) in enumerate(zip(SETUPS, mine)):
        ax.text(v if v else 0.02, y + 0.2, f" {v:.2f}" if v else " n/a", va="center", fontsize=8)
    ax.set_yticks(list(ys), SETUPS)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("training time relative to DDP (lower is faster)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("DataParallel vs DistributedDataParallel", fontsize=9)
    return fig
