"""When a job goes wrong: a hang, memory that does not fit, a slow rank (chapter 09).

- :func:`log_on_rank0_loop` is the commonest hang's bug inside a training loop: a data-parallel loop whose
  rank 0 also all-reduces the loss "for the log". Each rank writes a record of every collective before it
  issues it (``rank<r>.jsonl``: sequence number, op, elements, what), as NCCL's flight recorder keeps one;
  :func:`read_records` reads them back, :func:`divergence` finds where the ranks' records first differ.

- :func:`straggler` runs a few steps (load a batch, compute, all-reduce) on every rank, one rank slow to
  load, with a ``Timeline`` of each rank and a profiler trace per rank (``rank<r>.json``, open it in
  ``chrome://tracing`` or https://ui.perfetto.dev). The fast ranks' time goes into waiting inside the
  all-reduce: in a synchronous job every step runs at the pace of the slowest rank.
- :func:`step_memory` runs this chapter's job one step under DDP or FSDP2 and measures what the rank holds
  (``parlab.lab.measure.measure_memory``) and the most bytes the next step adds at once
  (``parlab.lab.measure.peak_memory``): on a CPU, where nothing runs out of memory, the numbers that would
  decide whether a GPU does.
- :func:`collective_timeout` is what ``init_process_group(timeout=...)`` buys: a collective that waits past the
  group's timeout raises on the waiting rank, naming itself, instead of hanging the job;
- :func:`py_spy_dump` shows a rank stuck in a collective from outside, as on a cluster: ``py-spy dump --pid``
  prints a live process's Python stack without stopping it for good (it needs ptrace on that process).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from parlab.lab import runtime
from parlab.lab.job.train_fsdp import CONFIG, build_model, dataset, shard
from parlab.lab.measure import Timeline, measure_memory, peak_memory


def straggler(slow_rank: int = 1, delay: float = 0.3, steps: int = 3, size: int = 128, trace_dir=None) -> dict:
    """On each rank: ``steps`` × (load a batch, compute, all-reduce); ``slow_rank`` takes ``delay`` seconds
    more to load each batch (a slow disk, a busy data worker). Returns the timeline's events and the
    profiler's top operators by self CPU time. Chapter 09, section 5: every other rank waits ``delay`` in each
    all-reduce, and the straggler is the rank that waits least."""
    rank, device = dist.get_rank(), runtime.device()
    a, grad = torch.randn(size, size, device=device), torch.zeros(2**16, device=device)
    timeline = Timeline()  # in GPU mode its spans are CUDA events on the GPU's clock: when the work ran
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with timeline.span("load"):
                time.sleep(delay if rank == slow_rank else 0.0)
            with timeline.span("compute"):
                for _ in range(4):
                    a = torch.tanh(a @ a / size)
            with timeline.span("all-reduce", "comm"):
                dist.all_reduce(grad)
    if trace_dir:
        prof.export_chrome_trace(os.path.join(trace_dir, f"rank{rank}.json"))
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:3]
    return {"events": timeline.events, "top": [(e.key, e.self_cpu_time_total / 1e6) for e in top]}


def collective_timeout(seconds: float = 2.0) -> str | None:
    """A group whose ``timeout`` is ``seconds`` (as ``init_process_group(timeout=...)`` sets the default
    group's); rank 0 all-reduces on it alone. Returns, on rank 0, the error the wait ended with."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
    if dist.get_rank() != 0:
        return None
    try:
        dist.all_reduce(torch.zeros(1), group=group)  # the others never call it
    except RuntimeError as err:
        return str(err)
    raise AssertionError(f"an all-reduce no other rank called returned within a {seconds} s timeout")


def py_spy_exe() -> str | None:
    """The ``py-spy`` program: on ``PATH`` or beside this Python (a virtual environment's ``bin``)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def py_spy_dump(attempts: int = 50) -> str | None:
    """On 2 or more ranks: rank 0 (and any rank above 1) enters an all-reduce that rank 1 has not called;
    rank 1 runs ``py-spy dump --pid <rank 0>`` until the dump shows rank 0 inside ``all_reduce`` (at most
    ``attempts`` dumps), then joins the all-reduce, so nothing hangs. Returns the dump on rank 1, else None;
    where ptrace is refused (a container), ``"refused: <py-spy's message>"``.

    The tensor is on the CPU on every machine: its all-reduce goes through gloo (the course's GPU groups are
    ``cpu:gloo,cuda:nccl``) and blocks the host until every rank has called it. A CUDA tensor's NCCL
    all-reduce returns as soon as it is enqueued, so no dump would find rank 0 inside ``all_reduce``."""
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    t = torch.zeros(1)  # on the host: blocks in all_reduce under gloo and under cpu:gloo,cuda:nccl alike
    if dist.get_rank() != 1:
        dist.all_reduce(t)  # waits here until rank 1 has looked
        return None
    exe = py_spy_exe()
    try:
        if exe is None:
            raise FileNotFoundError("py-spy is not installed (pip install py-spy)")
        for _ in range(attempts):  # until rank 0 is inside the collective, not on its way there
            done = subprocess.run([exe, "dump", "--pid", str(pids[0])], capture_output=True, text=True, timeout=60)
            if done.returncode or "all_reduce" in done.stdout:
                break
        if done.returncode:
            return f"refused: py-spy could not read rank 0 (exit {done.returncode}): {done.stderr.strip()[:300]}"
        return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)  # without the colours it adds under some terminals
    finally:
        dist.all_reduce(t)  # always: the other ranks must not be left waiting


def step_memory(layout: str, cfg: dict | None = None) -> dict:
    """One step of the job under ``layout`` ("ddp" or "fsdp2"), then: the bytes held between steps and the
    most the second step adds at once. ``cfg``: changes to ``train_fsdp.CONFIG``."""
    cfg = dict(CONFIG, **(cfg or {}), accumulation=1)
    device = runtime.device()
    model = build_model(cfg).to(device)
    if layout == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif layout == "fsdp2":
        model = shard(model, cfg)
    else:
        raise ValueError(f"layout must be 'ddp' or 'fsdp2'; got {layout!r}")
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    micro = cfg["global_batch"] // dist.get_world_size()
    x = dataset(cfg)[dist.get_rank() * micro:(dist.get_rank() + 1) * micro].to(device)  # (micro, seq_len)

    def step(measure=None):
        model(input_ids=x, labels=x).loss.backward()
        held = measure(model, opt) if measure else None  # with the gradients: the most model states at once
        opt.step()
        opt.zero_grad()
        return held

    held, peak = held_then_peak(step, measure_memory, device)
    between = held.params + held.optimizer + held.buckets  # what stays from one step to the next
    return {"states": held.as_dict(), "between_steps": between, "step_peak": peak, "total": between + peak,
            "micro_batch": micro, "curve": memory_curve(step, device)}


def memory_curve(fn, device) -> list[tuple[float, int]]:
    """``(milliseconds since start, bytes live beyond the start)`` after each allocation and release
    ``fn()`` makes, from the profiler's memory events (CPU, or the CUDA device ``device``)."""
    from torch.profiler import ProfilerActivity

    device = torch.device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
    kind = torch.autograd.DeviceType.CUDA if device.type == "cuda" else torch.autograd.DeviceType.CPU
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
                     and e.device_type() == kind), key=lambda e: e.start_ns())
    curve, live = [(0.0, 0)], 0
    for e in events:
        live += e.nbytes()
        curve.append(((e.start_ns() - events[0].start_ns()) / 1e6, live))
    return curve


def held_then_peak(step, measure, device) -> tuple[object, int]:
    """The states a step holds at most, and the most bytes a step adds at once: ``step()`` once (it creates
    the optimizer's state), ``step(measure)`` (``measure(model, opt)`` after backward), then ``step()``
    alone under ``peak_memory``. ``measure_memory`` resets CUDA's peak statistic, so it must not run inside
    ``peak_memory``'s window: the peak would then lose the forward and the backward before it."""
    step()
    held = step(measure)
    _, peak = peak_memory(step, device=device)
    return held, peak


def log_on_rank0_loop(record_dir: str, steps: int = 3, seconds: float | None = None) -> str:
    """A data-parallel loop (chapter 03's: one all-reduce of the flat gradient per step) whose rank 0 also
    all-reduces the loss for the log. Before each collective a rank appends its record to
    ``record_dir/rank<r>.jsonl``. ``seconds``: a group of its own with that timeout. Returns "finished" or the
    error this rank caught (a rank that gloo aborts returns nothing: its process is gone)."""
    rank = dist.get_rank()
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds)) if seconds else None
    os.makedirs(record_dir, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path, seq = os.path.join(record_dir, f"rank{rank}.jsonl"), 0

    def all_reduce(t, what):
        nonlocal seq
        with open(path, "a") as f:
            f.write(json.dumps({"rank": rank, "seq": seq, "op": "all_reduce", "numel": t.numel(), "what": what}) + "\n")
        seq += 1
        dist.all_reduce(t, group=group)

    try:
        for _ in range(steps):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            all_reduce(torch.cat([p.grad.flatten() for p in model.parameters()]), "gradients")
            opt.step()
            opt.zero_grad()
            if rank == 0:
                all_reduce(loss.detach(), "loss for the log")  # the bug: the other ranks never call it
    except RuntimeError as err:
        return f"{type(err).__name__}: {err}"
    return "finished"


#: Seconds between a hang demo's group timeout and the launcher's: NCCL's watchdog must fire, and its flight
#: recorder dump, before the launcher stops the ranks. Launch :func:`nccl_hang` with ``timeout=seconds + this``.
FLIGHT_RECORDER_MARGIN = 30


def nccl_hang(seconds: float = 5.0) -> None:
    """GPU only: on an NCCL group of its own whose timeout is ``seconds``, every rank all-reduces once (the
    communicator is made), then rank 0 all-reduces alone and waits for the GPU. NCCL's watchdog ends rank 0
    after ``seconds``, dumping the flight recorder when ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``. The other ranks wait
    past that, so that the dump can reach them too. Launch it with ``timeout=seconds + FLIGHT_RECORDER_MARGIN``:
    the group's timeout strictly shorter than the launcher's, so the watchdog, not the launcher, fires first."""
    group = dist.new_group(backend="nccl", timeout=datetime.timedelta(seconds=seconds))
    t = torch.ones(1, device=runtime.device())
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    if dist.get_rank() == 0:
        dist.all_reduce(t, group=group)  # the others never call it
        torch.cuda.synchronize()  # waits on the GPU until the watchdog ends the process
    time.sleep(seconds + FLIGHT_RECORDER_MARGIN / 2)


def read_records(record_dir: str, world_size: int) -> list[list[dict]]:
    """Every rank's records, in the order it issued them (``[]`` for a rank that wrote none)."""
    out = []
    for rank in range(world_size):
        path = os.path.join(record_dir, f"rank{rank}.jsonl")
        with open(path) if os.path.exists(path) else open(os.devnull) as f:
            out.append([json.loads(line) for line in f if line.strip()])
    return out


def divergence(records: list[list[dict]]) -> int | None:
    """The first sequence number at which the ranks' records differ (op, elements or what), or where some
    rank's record ends while another's goes on; None when all are the same."""
    def key(r):
        return (r["op"], r["numel"], r["what"])

    for seq in range(max(len(r) for r in records)):
        if len({key(r[seq]) if seq < len(r) else None for r in records}) > 1:
            return seq
    return None


def cuda_out_of_memory(cfg: dict, snapshot_path: str, micro_batch: int = 2) -> dict:
    """GPU only, on one rank: cap this process's CUDA memory at what ``estimate_memory`` predicts for one step
    at ``micro_batch`` (plus a quarter for the allocator's rounding), run that step (it fits), then one at 8
    times the micro-batch (it must not), recording every allocation; dump the snapshot to ``snapshot_path``
    (for https://pytorch.org/memory_viz) and return the largest live blocks at the failure."""
    from parlab.lab.measure import estimate_memory

    cfg = dict(CONFIG, **cfg)
    device = torch.device("cuda", torch.cuda.current_device())
    model = build_model(cfg).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    predicted = estimate_memory(model, precision="fp32", optimizer="momentum", micro_batch=micro_batch,
                                seq_len=cfg["seq_len"], device="cuda").total
    cap = 1.25 * predicted + torch.cuda.memory_allocated(device)
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(device).total_memory, device)
    data = dataset(dict(cfg, global_batch=8 * micro_batch, steps=1)).to(device)

    def step(rows):
        x = data[:rows]
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()

    step(micro_batch)  # fits
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        step(8 * micro_batch)
        out_of_memory = False
    except torch.OutOfMemoryError:
        out_of_memory = True
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._dump_snapshot(snapshot_path)
    torch.cuda.memory._record_memory_history(enabled=None)
    blocks = [b["size"] for seg in snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    return {"out_of_memory": out_of_memory, "cap": cap, "predicted": predicted,
            "largest": [f"{b / 1e6:.1f} MB" for b in sorted(blocks, reverse=True)[:3]]}
