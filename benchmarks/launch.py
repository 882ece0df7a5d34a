"""Launch latency: parlab.launch against torch.multiprocessing.spawn and torchrun, in one run.

Every launcher runs the same work: N ranks join a gloo process group and do one all_reduce.
- parlab, first launch: a fresh Python that has imported torch calls parlab.launch once (this starts
  the zygote, which imports torch again);
- parlab, repeated: later launches in the same process (median);
- mp.spawn: torch.multiprocessing.spawn from a Python that has imported torch (median); every spawn
  starts fresh interpreters, so first and repeated cost the same;
- torchrun: the whole ``torchrun --nproc-per-node N`` command (median).
Writes benchmarks/results/launch.json, launch.png and launch.md (the README's table). Usage: python benchmarks/launch.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import describe, machine, results_dir, write  # noqa: E402

PARLAB = textwrap.dedent("""
    import sys, time, json
    import torch, torch.distributed as dist
    import parlab
    def work():
        t = torch.ones(1)
        dist.all_reduce(t)
    n, repeats = int(sys.argv[1]), int(sys.argv[2])
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        parlab.launch(work, n, announce=False)
        times.append(time.perf_counter() - start)
    print(json.dumps(times))
""")

SPAWN = textwrap.dedent("""
    import os, sys, time, json, socket, datetime
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    def work(rank, n, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=n)
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.destroy_process_group()
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if __name__ == "__main__":
        n, repeats = int(sys.argv[1]), int(sys.argv[2])
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            mp.spawn(work, args=(n, free_port()), nprocs=n)
            times.append(time.perf_counter() - start)
        print(json.dumps(times))
""")

TORCHRUN_WORKER = textwrap.dedent("""
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
""")


def _python(code: str, *args) -> list[float]:
    # A file, not -c: spawned children re-import the parent's main module by path.
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        out = subprocess.run([sys.executable, f.name, *map(str, args)], capture_output=True, text=True,
                             check=True, timeout=600)
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _torchrun(n: int, repeats: int, script: str) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                        script], check=True, capture_output=True, timeout=600)
        times.append(time.perf_counter() - start)
    return times


def measure(world_sizes=(2, 4), repeats: int = 5) -> dict:

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(TORCHRUN_WORKER)
        for n in world_sizes:
            parlab_times = _python(PARLAB, n, repeats)
            spawn_times = _python(SPAWN, n, max(2, repeats // 2))
            torchrun_times = _torchrun(n, max(2, repeats // 2), script)
            row = {
                "world_size": n,
                "parlab_first_s": parlab_times[0],
                "parlab_repeated_s": statistics.median(parlab_times[1:]),
                "mp_spawn_s": statistics.median(spawn_times),
                "torchrun_s": statistics.median(torchrun_times),
            }
            row["spawn_over_parlab_repeated"] = row["mp_spawn_s"] / row["parlab_repeated_s"]
            row["parlab_first_over_spawn"] = row["parlab_first_s"] / row["mp_spawn_s"]
            rows.append(row)
            print(json.dumps(row))
    return {
        "benchmark": "launch latency, N ranks + one all_reduce (gloo, CPU)",
        "machine": machine("gloo"),
        "repeats": repeats,
        "rows": rows,
    }


def plot(result: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["parlab (repeated)", "parlab (first)", "mp.spawn", "torchrun"]
    keys = ["parlab_repeated_s", "parlab_first_s", "mp_spawn_s", "torchrun_s"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(result["rows"])
    for i, row in enumerate(result["rows"]):
        xs = [k + i * width for k in range(len(keys))]
        bars = ax.bar(xs, [row[k] for k in keys], width, label=f"{row['world_size']} ranks")
        ax.bar_label(bars, labels=[f"{row[k]:.2f}" for k in keys], fontsize=8, padding=2)
    ax.set_xticks([k + width * (len(result["rows"]) - 1) / 2 for k in range(len(keys))], labels)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per launch (log scale)")
    ax.set_title(f"Launch + one all_reduce · {describe(result['machine'])}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    return fig


def markdown(result: dict) -> str:
    lines = ["| ranks | parlab, repeated | parlab, first | mp.spawn | torchrun | mp.spawn ÷ parlab repeated |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['world_size']} | {r['parlab_repeated_s']:.2f} s | {r['parlab_first_s']:.2f} s | "
                     f"{r['mp_spawn_s']:.2f} s | {r['torchrun_s']:.2f} s | {r['spawn_over_parlab_repeated']:.0f}× |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    result = measure(tuple(args.world_sizes), args.repeats)
    out = results_dir()
    write(out, "launch", result, plot(result))
    with open(os.path.join(out, "launch.md"), "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    print(f"wrote {out}/launch.json, launch.png and launch.md")


if __name__ == "__main__":
    main()
