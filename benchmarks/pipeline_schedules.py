"""Step time of the course's pipeline executor (``parlab.lab.parallel.pipeline``) against
``torch.distributed.pipelining`` for GPipe, 1F1B and interleaved 1F1B, same model and ranks, in one run
(chapter 06).

Both implementations of each schedule live in the same ranks and train the same residual MLP, cut into
the same stages, and are timed in alternating rounds, so that whatever else the machine does falls on
all of them alike (``parlab.course.bench.pipeline.measure``). Each timed block lasts until the slowest rank is
done. The target: the course's executor reaches at least 0.8× PyTorch's throughput for each schedule.

    python benchmarks/pipeline_schedules.py                  # CPU: 2 gloo ranks
    python benchmarks/pipeline_schedules.py --world-size 4   # GPUs: NCCL when 4 are visible

Writes ``benchmarks/results/pipeline_schedules_<N>ranks.json`` and ``.png``, naming the machine and backend.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import describe, machine, results_dir, timing_parser, timing_setup, write  # noqa: E402

import parlab  # noqa: E402
from parlab.course.bench.pipeline import PRESETS, TORCH_SCHEDULES, measure, plot, summary  # noqa: E402
from parlab.lab.launch import preload  # noqa: E402


def main(argv=None) -> int:
    ap = timing_parser(__doc__.split("\n\n")[0], PRESETS, steps=3, rounds=5, warmup=1)
    ap.add_argument("--micro-batches", type=int, default=None, help="micro-batches per step (default: the preset's)")
    args = ap.parse_args(argv)
    preset, backend = timing_setup(ap, args)
    if args.world_size < 2:
        ap.error(f"--world-size must be at least 2 (a pipeline of one stage has nothing to schedule); got {args.world_size}")
    cfg = dict(PRESETS[preset], steps=args.steps, rounds=args.rounds, warmup=args.warmup)
    if args.micro_batches is not None:
        cfg["m"] = args.micro_batches
    if cfg["m"] % args.world_size or cfg["batch"] % cfg["m"]:
        ap.error(f"micro-batches={cfg['m']} must be a multiple of --world-size={args.world_size} (interleaved "
                 f"1F1B runs whole rounds) and divide the batch of {cfg['batch']}")

    preload("torch._dynamo", "torch.distributed.pipelining")
    times = parlab.launch(measure, world_size=args.world_size, args=(cfg,), backend=backend, timeout=900)[0]
    result = {"benchmark": "pipeline_schedules", "machine": machine(backend), "world_size": args.world_size,
              "preset": preset, "config": cfg, "step_s": times, "schedules": summary(times),
              "target": "course executor >= 0.8x torch.distributed.pipelining throughput, every schedule"}
    result["target_met"] = all(r["throughput_vs_torch"] >= 0.8 for r in result["schedules"].values())

    where = describe(result["machine"])
    print(f"\nresidual MLP: {args.world_size} ranks × {cfg['blocks_per_rank']} blocks of width {cfg['hidden']}, "
          f"batch {cfg['batch']} in {cfg['m']} micro-batches; {where}")
    print(f"{'schedule':<26}{'course (ms)':>12}{'PyTorch (ms)':>14}{'throughput vs PyTorch':>23}")
    for name, r in result["schedules"].items():
        print(f"{TORCH_SCHEDULES[name]:<26}{r['ours_s'] * 1e3:>12.1f}{r['torch_s'] * 1e3:>14.1f}"
              f"{r['throughput_vs_torch']:>22.2f}×")
    print(f"target >= 0.8× for every schedule: {'met' if result['target_met'] else 'NOT met'}")
    title = (f"pipeline schedules, course vs PyTorch, {args.world_size} ranks, m={cfg['m']}\n{where}")
    js, png = write(results_dir(args.out), f"pipeline_schedules_{args.world_size}ranks", result,
                    plot(result["schedules"], title))
    print(f"wrote {js} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
