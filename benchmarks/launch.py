"""Launch latency: parlab.launch from a Jupyter kernel against torch.multiprocessing.spawn and torchrun.

Every launcher runs the same work: N ranks join a gloo process group and do one all_reduce.
- parlab from a kernel: a fresh Jupyter kernel (jupyter_client) runs one launch per cell, as a learner
  does. The first launch starts the zygote (which imports torch); then ``--repeats`` consecutive warm
  launches, each timed inside its cell (median and maximum: a stall shows in the maximum);
- parlab from a script: the same in a plain Python process;
- parlab's spawn start method (the default on macOS and Windows), from the kernel;
- mp.spawn: torch.multiprocessing.spawn from a Python that has imported torch; every spawn starts fresh
  interpreters, so first and repeated cost the same;
- torchrun: the whole ``torchrun --nproc-per-node N`` command.
Targets, 4 ranks from a kernel: warm median <= 0.15 s, warm maximum <= 0.5 s, first launch no slower
than mp.spawn. Writes benchmarks/results/launch.json, launch.png and launch.md (the README's table).
Usage: python benchmarks/launch.py [--repeats 40] [--slow-repeats 3] [--world-sizes 2 4]
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

from _common import Kernel, describe, machine, results_dir, write  # noqa: E402

TARGETS = {"world_size": 4, "median_s": 0.15, "max_s": 0.5}

WORK = textwrap.dedent("""
    import sys, time, json
    import torch, torch.distributed as dist
    import parlab
    def work():
        t = torch.ones(1)
        dist.all_reduce(t)
""")

LAUNCH_CELL = "_t = time.perf_counter()\nparlab.launch(work, {n}{options})\nprint('TIME', time.perf_counter() - _t)"

PARLAB_SCRIPT = WORK + textwrap.dedent("""
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


def _launch_time(kernel: Kernel, n: int, options: str = "") -> float:
    text = kernel.execute(LAUNCH_CELL.format(n=n, options=options))
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("TIME ")))


def _from_kernel(n: int, repeats: int, slow_repeats: int) -> tuple[list[float], list[float]]:
    """Zygote launches (the first, then ``repeats`` warm ones) and spawn launches, from one fresh kernel."""
    kernel = Kernel()
    try:
        kernel.execute(WORK)
        zygote = [_launch_time(kernel, n) for _ in range(repeats + 1)]
        spawn = [_launch_time(kernel, n, ", start_method='spawn'") for _ in range(slow_repeats)]
    finally:
        kernel.close()
    return zygote, spawn


def _python(code: str, *args) -> list[float]:
    # A file, not -c: spawned children import the parent's main module again by path.
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


def _summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "max_s": max(times), "times_s": times}


def measure(world_sizes=(2, 4), repeats: int = 40, slow_repeats: int = 3) -> dict:
    load_at_start = os.getloadavg()  # other work on the machine shows in every number
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(TORCHRUN_WORKER)
        for n in world_sizes:
            kernel, kernel_spawn = _from_kernel(n, repeats, slow_repeats)
            from_script = _python(PARLAB_SCRIPT, n, repeats)
            row = {
                "world_size": n,
                "parlab_kernel_first_s": kernel[0],
                "parlab_kernel": _summary(kernel[1:]),
                "parlab_script_first_s": from_script[0],
                "parlab_script": _summary(from_script[1:]),
                "parlab_spawn_kernel": _summary(kernel_spawn),
                "mp_spawn": _summary(_python(SPAWN, n, slow_repeats)),
                "torchrun": _summary(_torchrun(n, slow_repeats, script)),
            }
            rows.append(row)
            print(json.dumps({k: v["median_s"] if isinstance(v, dict) else v for k, v in row.items()}))
    return {
        "benchmark": "launch latency, N ranks + one all_reduce (gloo, CPU)",
        "machine": machine("gloo"),
        "repeats": repeats,
        "slow_repeats": slow_repeats,
        "targets": TARGETS,
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
    }


def verdicts(result: dict) -> list[str]:
    """The targets, each with what this run measured."""
    row = next((r for r in result["rows"] if r["world_size"] == TARGETS["world_size"]), None)
    if row is None:
        return []
    k, spawn = row["parlab_kernel"], row["mp_spawn"]["median_s"]
    checks = [(k["median_s"] <= TARGETS["median_s"], f"warm median {k['median_s']:.3f} s <= {TARGETS['median_s']} s"),
              (k["max_s"] <= TARGETS["max_s"], f"warm maximum {k['max_s']:.3f} s <= {TARGETS['max_s']} s"),
              (row["parlab_kernel_first_s"] <= spawn,
               f"first launch {row['parlab_kernel_first_s']:.2f} s <= mp.spawn {spawn:.2f} s")]
    return [f"{'met' if ok else 'MISSED'}: {text}" for ok, text in checks]


def plot(result: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["parlab, kernel\n(warm median)", "parlab, kernel\n(first)", "parlab, script\n(warm median)",
              "parlab spawn,\nkernel", "mp.spawn", "torchrun"]
    values = [lambda r: r["parlab_kernel"]["median_s"], lambda r: r["parlab_kernel_first_s"],
              lambda r: r["parlab_script"]["median_s"], lambda r: r["parlab_spawn_kernel"]["median_s"],
              lambda r: r["mp_spawn"]["median_s"], lambda r: r["torchrun"]["median_s"]]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(result["rows"])
    for i, row in enumerate(result["rows"]):
        xs = [k + i * width for k in range(len(labels))]
        heights = [v(row) for v in values]
        bars = ax.bar(xs, heights, width, label=f"{row['world_size']} ranks")
        ax.bar_label(bars, labels=[f"{h:.2f}" for h in heights], fontsize=7, padding=2)
    ax.set_xticks([k + width * (len(result["rows"]) - 1) / 2 for k in range(len(labels))], labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per launch (log scale)")
    ax.legend(fontsize=8)
    for row in result["rows"]:
        times = row["parlab_kernel"]["times_s"]
        ax2.plot(range(1, len(times) + 1), times, marker=".", label=f"{row['world_size']} ranks")
    ax2.axhline(TARGETS["median_s"], color="grey", ls=":", lw=1, label=f"median target ({TARGETS['median_s']} s)")
    ax2.axhline(TARGETS["max_s"], color="grey", ls="--", lw=1, label=f"maximum target ({TARGETS['max_s']} s)")
    ax2.set_ylim(0, max(TARGETS["max_s"] * 1.2, *(max(r["parlab_kernel"]["times_s"]) * 1.1 for r in result["rows"])))
    ax2.set_xlabel("consecutive warm launch from the kernel")
    ax2.set_ylabel("seconds")
    ax2.legend(fontsize=7)
    fig.suptitle(f"Launch + one all_reduce · {describe(result['machine'])}", fontsize=9)
    fig.tight_layout()
    return fig


def markdown(result: dict) -> str:
    n = result["repeats"]
    lines = [f"| ranks | parlab from a kernel, warm: median / max of {n} | first | parlab from a script, warm: "
             f"median / max | parlab, spawn start method | mp.spawn | torchrun |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        k, s = r["parlab_kernel"], r["parlab_script"]
        lines.append(f"| {r['world_size']} | {k['median_s']:.3f} s / {k['max_s']:.3f} s | "
                     f"{r['parlab_kernel_first_s']:.2f} s | {s['median_s']:.3f} s / {s['max_s']:.3f} s | "
                     f"{r['parlab_spawn_kernel']['median_s']:.2f} s | {r['mp_spawn']['median_s']:.2f} s | "
                     f"{r['torchrun']['median_s']:.2f} s |")
    load = (f"\nLoad average (1 min) at start and end: {result['load_average_at_start'][0]:.1f} and "
            f"{result['load_average_at_end'][0]:.1f} on {result['machine']['cpu_cores']} cores.\n")
    return "\n".join(lines) + "\n" + load + "\n" + "".join(f"- {v}\n" for v in verdicts(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40, help="consecutive warm launches (parlab)")
    parser.add_argument("--slow-repeats", type=int, default=3, help="launches of mp.spawn, torchrun, spawn")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    result = measure(tuple(args.world_sizes), args.repeats, args.slow_repeats)
    out = results_dir(args.out)
    write(out, "launch", result, plot(result))
    with open(os.path.join(out, "launch.md"), "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    print(f"wrote {out}/launch.json, launch.png and launch.md")


if __name__ == "__main__":
    main()
