"""A workshop on one shared GPU machine, simulated on the CPU: many kernels leasing from a faked GPU pool.

Each *kernel* is a process forked from this one that runs a chapter's launches back to back, as a learner
who pressed "Run All" does. Each launch starts as the launcher starts one, through the launcher's own
function for it (``parlab.lab.launch._loop.ranks_then_lease``): first its ranks, which on a kernel's first
launch means starting the zygote (``--zygote`` seconds: it imports torch; a sleep stands in), then the lease
of ``world_size`` GPUs (``parlab.lab.launch.lease.acquire``, the launcher's own call). It holds them for a
launch's duration (a sleep stands in for the ranks' work), releases them, and launches again. Nothing
touches a GPU: the pool is ``PARLAB_GPUS=0,...,G-1`` with a private lock folder. ``--order "lease first"``
runs the launcher's order before issue 51 (the lease, then the ranks), for comparison.

What is checked (:func:`check`): no launch failed, no two holders held one GPU at once (each holder marks
its GPUs with files created ``O_EXCL``, and the holding intervals are compared afterwards), no process or
ticket is left behind, waiters were served first come, first served (at most 1 launch in 20 got its GPUs
after one that had asked for them more than ``slack`` seconds later), and no launch held a GPU while its
ranks were still starting (its zygote importing torch).

Time is scaled: with ``--scale 10`` a 2 s launch sleeps 0.2 s and the queue polls 10 times as often, and
every reported time is multiplied back. ``python benchmarks/workshop.py`` runs the table in
docs/workshop.md ("How many learners"); ``tests/test_workshop.py`` runs one small simulation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

from parlab.lab.launch import LaunchError, lease
from parlab.lab.launch._loop import ranks_then_lease

OVERTAKEN_SHARE = 1 / 20  # at most this share of launches may be served after one that asked later


def lease_first(start_ranks, take_lease):
    """The launcher's order before issue 51: the lease, then the ranks (GPUs held while the zygote starts)."""
    held = take_lease()
    start_ranks()
    return held


ORDERS = {"launcher": ranks_then_lease, "lease first": lease_first}


def _mark(marks: str, gpus: list[str]) -> int:
    """Mark these GPUs as held by this process; returns how many were marked by someone else already."""
    clashes = 0
    for gpu in gpus:
        try:
            os.close(os.open(os.path.join(marks, gpu), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            clashes += 1
    return clashes


def _kernel(index: int, spec: dict, out: str) -> None:
    """One learner's kernel: ``spec["launches"]`` launches in a row; what happened goes to ``out`` as JSON."""
    time.sleep(index * spec["stagger"])  # learners press "Run All" one after another
    start = ORDERS[spec["order"]]
    records, lines = [], []
    for k in range(spec["launches"]):
        pressed, seen = time.monotonic(), {}

        def start_ranks():  # a kernel's first launch starts its zygote (torch's import); later ones fork at once
            time.sleep(spec["zygote"] if k == 0 else 0.0)
            seen["ranks_up"] = time.monotonic()

        def take_lease():
            seen["asked"] = time.monotonic()
            return lease.acquire(spec["world_size"], env=spec["env"], wait=spec["wait"], what=f"kernel {index}",
                                 echo=lines.append)

        try:
            held = start(start_ranks, take_lease)
        except (LaunchError, OSError, ValueError) as exc:
            records.append({"kernel": index, "launch": k, "pressed": pressed, "asked": seen.get("asked", pressed),
                            "failed": str(exc)})
            continue
        granted = held.granted_at
        clashes = _mark(spec["marks"], held.gpus)
        time.sleep(spec["duration"])
        for gpu in held.gpus:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(spec["marks"], gpu))
        released = time.monotonic()
        held.release()
        records.append({"kernel": index, "launch": k, "pressed": pressed, "asked": seen["asked"],
                        "granted": granted, "ranks_up": seen["ranks_up"], "released": released, "gpus": held.gpus,
                        "ticket": held.ticket, "clashes": clashes})
        time.sleep(spec["think"])
    with open(out, "w") as f:
        json.dump({"records": records, "lines": lines}, f)
    os._exit(0)  # a forked copy of the caller: leave without its teardown


def simulate(kernels: int, launches: int, world_size: int, gpus: int = 8, duration: float = 0.05,
             think: float = 0.0, stagger: float = 0.01, scale: float = 1.0, wait: float = 600.0,
             timeout: float = 600.0, zygote: float = 0.0, order: str = "launcher") -> dict:
    """Run ``kernels`` forked kernels of ``launches`` launches each on a faked pool of ``gpus`` GPUs.

    ``duration`` (a launch's hold), ``zygote`` (the zygote's start, paid by a kernel's first launch),
    ``think`` (between a kernel's launches), ``stagger`` (between kernels' starts) and ``wait`` are in
    workshop seconds; the processes run ``scale`` times faster. ``order``: a key of :data:`ORDERS`. Returns
    every launch's record (times in workshop seconds from the start), the kernels' exit codes, and what
    was left behind."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}; got {order!r}")
    folder = tempfile.mkdtemp(prefix="parlab-workshop-")
    marks, locks = os.path.join(folder, "marks"), os.path.join(folder, "locks")
    os.makedirs(marks)
    spec = {"env": {"PARLAB_GPUS": "auto", "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))),
                    "PARLAB_GPU_LOCKS": locks},
            "world_size": world_size, "launches": launches, "duration": duration / scale,
            "think": think / scale, "stagger": stagger / scale, "wait": wait / scale, "marks": marks,
            "zygote": zygote / scale, "order": order}
    polls = lease.POLL, getattr(lease, "POLL_QUEUED", lease.POLL), getattr(lease, "TELL_EVERY", 10.0)
    lease.POLL, lease.POLL_QUEUED = polls[0] / scale, polls[1] / scale
    lease.TELL_EVERY = polls[2] / scale
    fork = multiprocessing.get_context("fork")
    start = time.monotonic()
    try:
        procs = [fork.Process(target=_kernel, args=(i, spec, os.path.join(folder, f"kernel{i}.json")))
                 for i in range(kernels)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(1.0, start + timeout - time.monotonic()))
    finally:
        lease.POLL, lease.POLL_QUEUED, lease.TELL_EVERY = polls
    left = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    records, lines = [], []
    for i in range(kernels):
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(folder, f"kernel{i}.json")) as f:
                got = json.load(f)
            records += got["records"]
            lines += got["lines"]
    for r in records:
        for key in ("pressed", "asked", "granted", "ranks_up", "released"):
            if key in r:
                r[key] = (r[key] - start) * scale
    tickets = [n for n in os.listdir(locks) if n.startswith("ticket-")] if os.path.isdir(locks) else []
    held = {g: h for g, h in lease.holders_of(folder=locks).items() if h is not None}
    marks_left = os.listdir(marks)
    shutil.rmtree(folder, ignore_errors=True)  # read above; nothing of a run stays in the temp directory
    return {"records": records, "lines": lines, "exitcodes": [p.exitcode for p in procs], "alive": left,
            "tickets_left": tickets, "held_after": held, "marks_left": marks_left,
            "elapsed": (time.monotonic() - start) * scale, "gpus": gpus, "world_size": world_size,
            "kernels": kernels, "launches": launches, "duration": duration, "zygote": zygote, "order": order}


def overlaps(records: list[dict]) -> list[tuple]:
    """Pairs of launches that held one GPU at overlapping times: ``(gpu, kernel a, kernel b)``."""
    by_gpu: dict[str, list] = {}
    for r in records:
        for gpu in r.get("gpus", []):
            by_gpu.setdefault(gpu, []).append((r["granted"], r["released"], r["kernel"]))
    found = []
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (s1, e1, k1), (s2, _, k2) in zip(spans, spans[1:]):
            if s2 < e1 - 1e-9:
                found.append((gpu, k1, k2))
    return found


def overtakes(records: list[dict], slack: float) -> list[tuple]:
    """Launches served before one that had asked more than ``slack`` seconds earlier (not first come, first
    served): ``(the earlier asker's kernel, the later one's kernel, seconds between their asks)``."""
    served = sorted((r for r in records if "granted" in r), key=lambda r: r["asked"])
    found = []
    for i, a in enumerate(served):
        for b in served[i + 1:]:
            if b["asked"] - a["asked"] > slack and b["granted"] < a["granted"]:
                found.append((a["kernel"], b["kernel"], round(b["asked"] - a["asked"], 3)))
    return found


def idle(record: dict) -> float:
    """Seconds a launch held its GPUs while its ranks were still starting (its zygote importing torch)."""
    return max(0.0, record["ranks_up"] - record["granted"]) if "granted" in record else 0.0


def check(result: dict, slack: float) -> dict[str, list]:
    """Every problem the simulation shows, by kind; all lists empty when the workshop went well.
    "overtaken" lists the overtakings only when more than :data:`OVERTAKEN_SHARE` of the launches were
    overtaken (a loaded machine delays a poll now and then)."""
    records = result["records"]
    served = [r for r in records if "granted" in r]
    by_ticket = sorted((r for r in served if r.get("ticket") is not None), key=lambda r: r["ticket"])
    passed = overtakes(served, slack)
    overtaken = {(a["kernel"], a["launch"]) for a in served for b in served
                 if b["asked"] - a["asked"] > slack and b["granted"] < a["granted"]}
    return {
        "failed": [r["failed"][:200] for r in records if "failed" in r],
        "missing": [] if len(records) == result["kernels"] * result["launches"] else
        [f"{len(records)} of {result['kernels'] * result['launches']} launches reported"],
        "collisions": [r for r in served if r["clashes"]] + overlaps(served),
        "orphans": result["alive"] + [c for c in result["exitcodes"] if c != 0] + result["tickets_left"]
        + list(result["held_after"]) + result["marks_left"],
        "overtaken": passed if len(overtaken) > OVERTAKEN_SHARE * len(served) else [],
        "out_of_ticket_order": [(a["ticket"], b["ticket"]) for a, b in zip(by_ticket, by_ticket[1:])
                                if b["granted"] < a["granted"]],
        "held_idle": [(r["kernel"], r["launch"], round(idle(r), 3)) for r in served if idle(r) > 0],
    }


def summary(result: dict, slack: float = 0.0) -> dict:
    """Waits per launch (workshop seconds), a kernel's first launch and its later ones apart; GPU time
    held, and the part of it held idle while ranks started."""
    served = [r for r in result["records"] if "granted" in r]
    waits = sorted(r["granted"] - r["asked"] for r in served)
    first = sorted(r["granted"] - r["asked"] for r in served if r["launch"] == 0)
    later = sorted(r["granted"] - r["asked"] for r in served if r["launch"] > 0)
    to_work = sorted(r["granted"] + idle(r) - r["pressed"] for r in served if r["launch"] == 0)
    finish = sorted(max(r["released"] for r in served if r["kernel"] == k) for k in {r["kernel"] for r in served})
    held = sum(len(r["gpus"]) * (r["released"] - r["granted"]) for r in served)
    held_idle = sum(len(r["gpus"]) * idle(r) for r in served)
    overtaken = {(a["kernel"], a["launch"]) for a in served for b in served
                 if b["asked"] - a["asked"] > slack and b["granted"] < a["granted"]}

    def q(xs, p):
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 2) if xs else None

    return {"kernels": result["kernels"], "world_size": result["world_size"], "gpus": result["gpus"],
            "launches": result["launches"], "duration": result["duration"], "zygote": result.get("zygote", 0.0),
            "order": result.get("order", "launcher"),
            "wait_median": q(waits, 0.5), "wait_p95": q(waits, 0.95), "wait_max": q(waits, 1.0),
            "first_wait_min": q(first, 0.0), "first_wait_max": q(first, 1.0),
            "later_wait_min": q(later, 0.0), "later_wait_max": q(later, 1.0),
            "first_to_work_median": q(to_work, 0.5),
            "gpu_seconds_held": round(held, 1), "gpu_seconds_idle": round(held_idle, 1),
            "idle_share": round(held_idle / held, 3) if held else None,
            "idle_first_median": q(sorted(idle(r) for r in served if r["launch"] == 0), 0.5),
            "overtaken": len(overtaken), "served": len(served),
            "chapter_alone": round(result["launches"] * result["duration"] + result.get("zygote", 0.0), 1),
            "chapter_last_learner": round(finish[-1], 1) if finish else None,
            "elapsed": round(result["elapsed"], 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--learners", type=int, nargs="+", default=[8, 16, 24, 32, 40])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--launches", type=int, default=15, help="launches per chapter (the chapters have 5-24)")
    ap.add_argument("--duration", type=float, default=2.0,
                    help="seconds one launch holds its GPUs: `parlab check` measures it on the machine")
    ap.add_argument("--zygote", type=float, default=7.7,
                    help="seconds a kernel's first launch takes to start its zygote (torch's import)")
    ap.add_argument("--order", choices=sorted(ORDERS), default="launcher",
                    help="'launcher': the launcher's order (ranks, then lease); 'lease first': the order before")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scale", type=float, default=10.0, help="run this many times faster than the workshop")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                    help="folder for workshop.json (each --order writes its own file)")
    args = ap.parse_args(argv)
    rows = []
    slack = 0.5 * args.scale  # 0.5 s of real time
    for ws in args.world_sizes:
        for n in args.learners:
            result = simulate(n, args.launches, ws, gpus=args.gpus, duration=args.duration, scale=args.scale,
                              stagger=0.1, timeout=3600, zygote=args.zygote, order=args.order)
            problems = {k: v for k, v in check(result, slack=slack).items() if v}
            row = dict(summary(result, slack=slack), problems={k: len(v) for k, v in problems.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    name = "workshop.json" if args.order == "launcher" else f"workshop-{args.order.replace(' ', '-')}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0 if all(not r["problems"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
