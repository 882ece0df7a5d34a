"""Step time of the from-scratch DDP (v1, v2, v3 in ``parlab.parallel.ddp``) against PyTorch's
``DistributedDataParallel``, on the same model and world size, in one run (chapter 03).

All four wrappers live in the same ranks, train the same tiny GPT-2 on the same shards, and are timed in
alternating rounds, so that whatever else the machine is doing falls on all of them alike. Each timed
block is bracketed by barriers and its time is the slowest rank's. The target set in issue 4: v3 reaches
at least 0.8x DDP's throughput (ratio = DDP step time / v3 step time).

    python benchmarks/ddp_throughput.py                  # CPU: 2 gloo ranks, a small GPT-2
    python benchmarks/ddp_throughput.py --world-size 4   # GPUs: NCCL when 4 are visible

Writes ``benchmarks/results/ddp_throughput_<N>ranks.json`` and ``.png``, naming the machine and backend.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import describe, machine, results_dir, write  # noqa: E402

import parlab  # noqa: E402

KINDS = ("v1", "v2", "v3", "torch")
LABELS = {"v1": "v1 naive", "v2": "v2 buckets", "v3": "v3 overlap", "torch": "DistributedDataParallel"}
PRESETS = {  # GPT-2 sizes: a CPU box, and a GPU (GPT-2 small, as in the guide's benchmark)
    "cpu": dict(n_layer=4, n_embd=128, n_head=4, vocab_size=2048, seq_len=64, batch=8, bucket_mb=1.0),
    "gpu": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=512, batch=8, bucket_mb=25.0),
}


def measure(cfg: dict) -> dict:
    """Runs on every rank; returns {kind: [seconds per step, one per round]} (the slowest rank's)."""
    import torch.distributed as dist

    from parlab.models import shard, tiny_gpt2, token_batch
    from parlab.parallel import DDPBuckets, DDPNaive, DDPOverlap

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

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dist.barrier()

    for kind in KINDS:
        for _ in range(cfg["warmup"]):
            step(kind)
    times = {k: [] for k in KINDS}
    for r in range(cfg["rounds"]):
        order = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]  # no wrapper always goes first
        for kind in order:
            sync()
            start = time.perf_counter()
            for _ in range(cfg["steps"]):
                step(kind)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            elapsed = torch.tensor([time.perf_counter() - start], device=dev)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step ends when the slowest rank is done
            times[kind].append(elapsed.item() / cfg["steps"])
    num_params = sum(p.numel() for p in models["v1"].parameters())
    return {"times": times, "num_params": num_params, "buckets": len(models["v3"].buckets)}


def summarize(times: dict) -> tuple[dict, dict]:
    """Median step time per wrapper, and throughput relative to DDP as the median over rounds of
    t_DDP / t_wrapper within the same round: pairing rounds cancels most of a busy machine's drift."""
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(t / s for t, s in zip(times["torch"], v)) for k, v in times.items()}
    return median, ratio


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="model size; default: gpu when world-size GPUs are visible, else cpu")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per timed block")
    ap.add_argument("--rounds", type=int, default=6, help="timed blocks per wrapper, interleaved")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=None, help="bucket size for v2, v3 and DDP alike")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # a script writes PNGs; a notebook importing plot() keeps its own backend
    for name in ("world_size", "steps", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    preset = args.preset or ("gpu" if gpus >= args.world_size else "cpu")
    cfg = dict(PRESETS[preset], steps=args.steps, rounds=args.rounds, warmup=args.warmup)
    if args.bucket_mb is not None:
        cfg["bucket_mb"] = args.bucket_mb
    backend = "nccl" if gpus >= args.world_size else "gloo"

    out = parlab.launch(measure, world_size=args.world_size, args=(cfg,), backend=backend, timeout=600)[0]
    med, ratio = summarize(out["times"])
    result = {
        "benchmark": "ddp_throughput", "machine": machine(backend), "world_size": args.world_size,
        "preset": preset, "config": cfg, "num_params": out["num_params"], "v3_buckets": out["buckets"],
        "step_s": out["times"], "median_step_s": med,
        # throughput ratio = (1 / t_kind) / (1 / t_ddp), paired by round
        "throughput_vs_ddp": ratio,
        "target": "v3 >= 0.8x DistributedDataParallel throughput",
    }
    result["target_met"] = result["throughput_vs_ddp"]["v3"] >= 0.8

    where = describe(result["machine"])
    print(f"\nGPT-2 ({preset} preset, {out['num_params'] / 1e6:.2f} M parameters), {args.world_size} ranks, "
          f"batch {cfg['batch']} x {cfg['seq_len']} tokens per rank, bucket {cfg['bucket_mb']} MB; {where}")
    print(f"{'wrapper':<26}{'median step (ms)':>18}{'throughput vs DDP':>20}")
    for k in KINDS:
        print(f"{LABELS[k]:<26}{med[k] * 1e3:>18.1f}{result['throughput_vs_ddp'][k]:>19.2f}x")
    verdict = "met" if result["target_met"] else "NOT met"
    print(f"target v3 >= 0.8x DDP: {verdict} ({result['throughput_vs_ddp']['v3']:.2f}x)")
    title = (f"DDP from scratch vs DistributedDataParallel, {args.world_size} ranks, "
             f"{out['num_params'] / 1e6:.2f} M params\n{where}")
    js, png = write(results_dir(args.out), f"ddp_throughput_{args.world_size}ranks", result, plot(result, title))
    print(f"wrote {js} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
