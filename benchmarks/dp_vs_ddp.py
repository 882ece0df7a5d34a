"""The guide's DataParallel vs DistributedDataParallel benchmark, rerun with one protocol (chapter 03).

The guide ("Efficient Training on Multiple GPUs", Hugging Face) trained GPT-2 with ``run_clm`` on
wikitext-2 for 200 steps at batch size 4 per GPU on 2x TITAN RTX 24 GB joined by NVLink (NV2), and
reported the training time of three set-ups: nn.DataParallel 110.59 s, DistributedDataParallel 101.90 s,
and DDP with NVLink turned off (``NCCL_P2P_DISABLE=1``) 131.44 s.

This script (over ``parlab.course.bench.dp_vs_ddp``, which chapter 03 runs too) keeps the protocol and drops the downloads: a GPT-2 built from a transformers config (GPT-2
small's sizes), generated token ids instead of wikitext, fixed batch size per GPU and number of steps,
AdamW as the Trainer uses. It runs the three set-ups one after another and prints its table beside the
published one.

    python benchmarks/dp_vs_ddp.py                  # needs 2+ GPUs; says so and exits 0 otherwise
    python benchmarks/dp_vs_ddp.py --cpu-analogue   # tiny GPT-2, 2 gloo ranks on CPU, about a minute

On CPU there are no GPUs for nn.DataParallel to scatter to (it then runs the module unchanged), so the
analogue plays DP's data flow with ranks (``parlab.lab.parallel.dp``, rank 0 as GPU 0) on the same cores as
DDP, and there is no NVLink to turn off: it shows the shape of the experiment, not its numbers. Writes ``benchmarks/results/dp_vs_ddp[_cpu].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import describe, machine, results_dir, write  # noqa: E402

from parlab.course.bench.dp_vs_ddp import (  # noqa: E402
    CPU_TINY,
    GPT2_SMALL,
    PUBLISHED,
    SETUPS,
    plot,
    run_ddp,
    run_dp,
    run_played_dp,
    table,
)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-analogue", action="store_true",
                    help="run a tiny version on CPU (2 gloo ranks) instead of GPT-2 small on 2 GPUs")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs (DP replicas, DDP ranks) to use")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 200 on GPU, 20 on CPU)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # a script writes PNGs; a notebook importing plot() keeps its own backend
    if args.gpus < 2:
        ap.error(f"--gpus must be at least 2 (the benchmark compares ways of using several); got {args.gpus}")
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not args.cpu_analogue and visible < args.gpus:
        print(f"dp_vs_ddp: this benchmark needs {args.gpus} GPUs and {visible} are visible; nothing was run.\n"
              f"Run it on a machine with {args.gpus}+ GPUs, or add --cpu-analogue for the small CPU version.")
        print("\nThe guide's published result (" + PUBLISHED["hardware"] + "):")
        for s in SETUPS:
            print(f"  {s:<26}{PUBLISHED['seconds'][s]:>8.2f} s")
        return 0
    cfg = dict(CPU_TINY if args.cpu_analogue else GPT2_SMALL, warmup=args.warmup)
    if args.steps is not None:
        cfg["steps"] = args.steps
    n = 2 if args.cpu_analogue else args.gpus
    backend = "gloo" if args.cpu_analogue else "nccl"
    print(f"GPT-2 {cfg['n_layer']} layers x {cfg['n_embd']}, {cfg['steps']} steps, batch {cfg['batch']} x "
          f"{cfg['seq_len']} tokens per {'rank' if args.cpu_analogue else 'GPU'}, {n} of them", flush=True)

    measured = {}
    measured["DDP"] = run_ddp(cfg, n, backend)
    if not args.cpu_analogue:
        measured["DDP, NCCL_P2P_DISABLE=1"] = run_ddp(cfg, n, backend, {"NCCL_P2P_DISABLE": "1"})
    measured["DP"] = run_played_dp(cfg, n) if args.cpu_analogue else run_dp(cfg, n)

    m = machine(backend)
    where = describe(m)
    print(f"\nThis run: {where}\nPublished: {PUBLISHED['hardware']}\n")
    print(table(measured, args.cpu_analogue))
    name = "dp_vs_ddp_cpu" if args.cpu_analogue else "dp_vs_ddp"
    data = {"benchmark": name, "machine": m, "config": cfg, "world_size": n, "measured": measured,
            "published": PUBLISHED, "relative_to_ddp": {s: v["seconds"] / measured["DDP"]["seconds"]
                                                       for s, v in measured.items()}}
    js, png = write(results_dir(args.out), name, data, plot(measured, where))
    print(f"\nwrote {js} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
