"""Step time and memory per rank of the from-scratch ZeRO-3 (``parlab.lab.parallel.zero.ZeroStage3``, with and
without prefetch) against PyTorch's FSDP2 (``fully_shard``), on the same model and world size, in one run
(chapter 04).

Both live in the same ranks, train the same tiny GPT-2 on the same shards, with every transformer block
sharded on its own, and are timed in alternating rounds, so that whatever else the machine does falls on
both alike (``parlab.course.bench.zero``, which chapter 04 runs too). Each timed block is bracketed by barriers
and its time is the slowest rank's. Memory per rank: what rank 0 holds after a step (weights, gradients,
optimizer state) and the most it held during one. The target set in issue 10: ZeRO-3 with prefetch reaches
at least 0.7x FSDP2's throughput (ratio = FSDP2 step time / ZeRO-3 step time, paired by round).

    python benchmarks/zero.py                  # CPU: 2 gloo ranks, a small GPT-2
    python benchmarks/zero.py --world-size 4   # GPUs: NCCL when 4 are visible

Writes ``benchmarks/results/zero_<N>ranks.json`` and ``.png``, naming the machine and backend.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import describe, machine, results_dir, timing_parser, timing_setup, write  # noqa: E402

import parlab  # noqa: E402
from parlab.course.bench.zero import LABELS, PRESETS, measure, plot  # noqa: E402
from parlab.lab.measure import summarize  # noqa: E402

KINDS = ("zero3_prefetch", "zero3", "fsdp2")
TARGET = 0.7


def main(argv=None) -> int:
    ap = timing_parser(__doc__.split("\n\n")[0], PRESETS, steps=4)
    args = ap.parse_args(argv)
    preset, backend = timing_setup(ap, args)
    cfg = dict(PRESETS[preset], steps=args.steps, rounds=args.rounds, warmup=args.warmup, kinds=KINDS)

    out = parlab.launch(measure, world_size=args.world_size, args=(cfg,), backend=backend, timeout=900)[0]
    med, ratio = summarize(out["times"], reference="fsdp2")
    result = {
        "benchmark": "zero", "machine": machine(backend), "world_size": args.world_size, "preset": preset,
        "config": cfg, "num_params": out["num_params"], "step_s": out["times"], "median_step_s": med,
        "throughput_vs": ratio,  # (1 / t_kind) / (1 / t_fsdp2), paired by round
        "memory_bytes_rank0": out["memory"],
        "target": f"zero3_prefetch >= {TARGET}x FSDP2 throughput",
    }
    result["target_met"] = ratio["zero3_prefetch"] >= TARGET

    where = describe(result["machine"])
    print(f"\nGPT-2 ({preset} preset, {out['num_params'] / 1e6:.2f} M parameters), {args.world_size} ranks, "
          f"batch {cfg['batch']} x {cfg['seq_len']} tokens per rank; {where}")
    print(f"{'':<22}{'median step (ms)':>18}{'vs FSDP2':>10}{'held (MiB)':>12}{'peak (MiB)':>12}")
    for k in KINDS:
        mem = out["memory"][k]
        print(f"{LABELS[k]:<22}{med[k] * 1e3:>18.1f}{ratio[k]:>9.2f}x{mem['total'] / 2**20:>12.2f}"
              f"{mem['peak'] / 2**20:>12.2f}")
    verdict = "met" if result["target_met"] else "NOT met"
    print(f"target ZeRO-3 + prefetch >= {TARGET}x FSDP2: {verdict} ({ratio['zero3_prefetch']:.2f}x)")
    title = (f"ZeRO-3 from scratch vs FSDP2, {args.world_size} ranks, {out['num_params'] / 1e6:.2f} M params\n{where}")
    js, png = write(results_dir(args.out), f"zero_{args.world_size}ranks", result,
                    plot({"median_step_s": med, "throughput_vs": ratio, "memory": out["memory"]}, title, "fsdp2"))
    print(f"wrote {js} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
