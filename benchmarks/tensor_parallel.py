"""Step time and bytes per step of the course's tensor parallelism (``parlab.lab.parallel.tensor``) against
DTensor's ``parallelize_module``, on the same model and tp size, in one run (chapter 05).

Both implementations split the same models the same way (``parlab.course.bench.tensor_parallel``, which chapter
05 runs too): a stack of residual MLP blocks and the decoder blocks of a Llama. They live in the same
ranks and are timed in alternating rounds; each timed block is bracketed by barriers and its time is the
slowest rank's. The targets set in issue 11: the course's step is at least 0.8x DTensor's throughput
(ratio = DTensor step time / course step time), and both send the same bytes per step (the collectives
recorded by ``record_comm``; on CPU also the bytes each rank wrote, from /proc/self/io).

    python benchmarks/tensor_parallel.py                  # CPU: 2 gloo ranks
    python benchmarks/tensor_parallel.py --world-size 4   # GPUs: NCCL when 4 are visible

Writes ``benchmarks/results/tensor_parallel_<N>ranks.json`` and ``.png``, naming the machine and backend.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import describe, machine, results_dir, timing_parser, timing_setup, write  # noqa: E402

import parlab  # noqa: E402
from parlab.course.bench.tensor_parallel import KINDS, LABELS, PRESETS, plot, summary  # noqa: E402


def main(argv=None) -> int:
    ap = timing_parser(__doc__.split("\n\n")[0], PRESETS, steps=5)
    args = ap.parse_args(argv)
    preset, backend = timing_setup(ap, args)
    if args.world_size < 2:
        ap.error("--world-size must be at least 2: tensor parallelism splits layers over several ranks")
    cfg = dict(PRESETS[preset], steps=args.steps, rounds=args.rounds, warmup=args.warmup)

    from parlab.course.bench.tensor_parallel import measure

    raw = parlab.launch(measure, world_size=args.world_size, args=(cfg,), backend=backend, timeout=600)[0]
    result = {"benchmark": "tensor_parallel", "machine": machine(backend), "world_size": args.world_size,
              "preset": preset, "config": cfg, **summary(raw),
              "target": "course >= 0.8x DTensor throughput; equal bytes per step"}
    where = describe(result["machine"])
    print(f"\ntp = {args.world_size} ranks, {preset} preset; {where}")
    print(f"{'model':<7}{'implementation':<30}{'median step (ms)':>18}{'vs DTensor':>12}{'bytes/step':>13}")
    for model, med in result["median_step_s"].items():
        for k in KINDS:
            print(f"{model:<7}{LABELS[k]:<30}{med[k] * 1e3:>18.1f}{result['throughput_vs_dtensor'][model][k]:>11.2f}x"
                  f"{result['bytes_per_step'][model][k]:>13,}")
    verdict = "met" if result["target_met"] else "NOT met"
    print(f"targets (course >= 0.8x DTensor, equal bytes): {verdict}")
    title = f"Tensor parallelism from scratch vs DTensor, tp = {args.world_size}\n{where}"
    js, png = write(results_dir(args.out), f"tensor_parallel_{args.world_size}ranks", result, plot(result, title))
    print(f"wrote {js} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
