"""The GPU smoke check: what only a real GPU can decide, each item its own check, in minutes.

    python benchmarks/gpu_smoke.py                 # on a GPU machine (one GPU is enough); exit 1 on a failure
    python benchmarks/gpu_smoke.py --dry-run       # on CPU: the same checks, expecting CPU mode (tested)
    python benchmarks/gpu_smoke.py --in-process    # every check in this process, no limits (the tests' dry run)

Each check runs in a process of its own under its own time limit (``LIMITS``): a check that hangs (an NCCL
call nobody answers) is killed with everything it started and reported "timed out after N s", and the next
check runs. The checks come in the order of docs/ci.md's "What only a GPU run can settle", each printed with
the item it decides (``DECIDES``); the workflow's own plumbing comes last:

1. ``driver``: torch's CUDA build initialises on this machine's driver (torch 2.13's default wheel is a
   CUDA 13 build; a driver too old for it fails here, with CUDA's words);
2. ``nccl``: one rank in GPU mode: the ``cpu:gloo,cuda:nccl`` group with ``device_id`` (eager NCCL init),
   ``parlab.device()`` = ``cuda:0``, an all-reduce of a CUDA tensor, a ``DeviceMesh`` of type ``cuda``;
3. ``nccl_enqueue``: NCCL returns at enqueue: with 200 ms of work queued, an all-reduce (async, and the
   synchronous call) returns at once and is not complete (gloo's returns complete);
4. ``gpu_clock``: comm records on the GPU's clock: in a span of 2 × 50 ms of queued GPU work, an all-reduce
   issued between them starts about 50 ms in (the host issued it at about 0), and one whose inputs are ready
   only at the end starts after the span, so chapter 04's overlap assert holds for the first and fails for
   the second; a compute stream made to wait for a late all-reduce records the stall as its wait span;
5. ``job``: chapter 08's FSDP2 job (``parlab.lab.job.train_fsdp.train``) on the GPUs that fit against one CPU
   process over 4 steps: the losses and every weight within the plan's tolerance; it prints the share of
   ``runtime.TOLERANCE["cuda"]`` the worst loss and the worst weight use, separately (on a GPU: the measured
   bounds that decide the provisional tolerance);
6. ``memory``: ``measure_memory``'s CUDA peak starts afresh at each measurement; ``peak_memory`` on CUDA;
7. ``compile``: ``torch.compile`` with Inductor on CUDA equals eager (Triton builds its stubs with the C
   compiler and Python's headers: chapter 08's compile cell needs them; on CPU ``aot_eager``, no compiler);
8. ``zygote``: the rank server stays CUDA-free with the kernel's heavy modules preloaded;
9. ``cpu_mode``: a launch with more ranks than GPUs runs on CPU, and its ranks see no GPU at all;
10. ``require_gpu``: ``parlab run --ci --require-gpu --chapters 00`` (on CPU: refused, as it must be).

Writes ``smoke.json`` (each check: ok, seconds, what it saw, the item it decides) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

import parlab
from parlab.lab import runtime

# check -> the item of docs/ci.md "What only a GPU run can settle" it decides
DECIDES = {
    "driver": "the CUDA 13 driver: torch's default CUDA build initialises on the runner's driver",
    "nccl": "init_process_group with device_id and the combined cpu:gloo,cuda:nccl backend (eager NCCL init)",
    "nccl_enqueue": "NCCL returns at enqueue (the forgetful rank, the launcher's wait for queued GPU work)",
    "gpu_clock": "GPU-clock placement of comm records (chapters 03, 04, 06: overlap, ZeRO-3's waits, P2P ends)",
    "job": "the GPU tolerance: losses and every weight against one CPU process (chapters 00, 03, 08, 09)",
    "memory": "measure_memory's CUDA peak after the reset, peak_memory on CUDA",
    "compile": "the C compiler and Python's headers for torch.compile with Inductor (chapter 08)",
    "zygote": "the zygote stays CUDA-free with fsdp and transformers preloaded",
    "cpu_mode": "CPU-mode ranks on a GPU machine see no GPU",
    "require_gpu": "the workflow's chapter step: parlab run --require-gpu",
}
LIMITS = {"driver": 60, "nccl": 120, "nccl_enqueue": 120, "gpu_clock": 120, "job": 300, "memory": 120,
          "compile": 300, "zygote": 120, "cpu_mode": 120, "require_gpu": 480}  # seconds, each check
TERM_GRACE = 10  # seconds between SIGTERM and SIGKILL for a check that ran out of time


def check_driver(gpu: bool) -> str:
    if not gpu:
        assert torch.version.cuda is None, f"a CUDA build of torch ({torch.version.cuda}) without a GPU"
        return "CPU build of torch: no CUDA driver to decide here"
    torch.cuda.init()  # a driver too old for torch's CUDA build raises here, naming both
    found = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30) if _which("nvidia-smi") else None
    driver = found.stdout.split()[0] if found is not None and found.returncode == 0 and found.stdout else "unknown"
    return (f"torch {torch.__version__} built for CUDA {torch.version.cuda}; driver {driver}; "
            f"{torch.cuda.get_device_name(0)}")


def _which(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def _one_rank():
    import torch.distributed as dist

    t = torch.full((4,), 2.0, device=parlab.device())
    dist.all_reduce(t)
    mesh = runtime.mesh()
    return {"backend": str(dist.get_backend()), "device": str(parlab.device()), "value": t.sum().item(),
            "mesh": mesh.device_type, "gpu_mode": runtime.gpu_mode()}


def check_nccl(gpu: bool) -> str:
    got = parlab.launch(_one_rank, 1, announce=False)[0]
    want = ({"backend": "cpu:gloo,cuda:nccl", "device": "cuda:0", "mesh": "cuda", "gpu_mode": True} if gpu else
            {"backend": "gloo", "device": "cpu", "mesh": "cpu", "gpu_mode": False})
    assert {k: got[k] for k in want} == want and got["value"] == 8.0, f"one rank: {got}, expected {want}"
    return f"{got['backend']} on {got['device']}, mesh {got['mesh']}"


def _busy(device):
    """A function that queues about ``ms`` of work on the current stream: the GPU spins (``torch.cuda._sleep``,
    calibrated with events), the host sleeps on a CPU."""
    if device.type != "cuda":
        return lambda ms: time.sleep(ms / 1e3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    cycles_per_ms = 10**7 / start.elapsed_time(end)
    return lambda ms: torch.cuda._sleep(int(ms * cycles_per_ms))


def _enqueue():
    import torch.distributed as dist

    device = parlab.device()
    busy, out = _busy(device), {}
    for how in ("async", "sync"):
        t = torch.ones(4, device=device)
        busy(200)  # on a GPU the stream is busy for 200 ms: an op queued behind it cannot have run
        start = time.perf_counter()
        work = dist.all_reduce(t, async_op=True) if how == "async" else dist.all_reduce(t)
        returned = time.perf_counter() - start
        completed = work.is_completed() if work is not None else None
        if work is not None:
            work.wait()
        out[how] = {"returned_s": returned, "completed": completed, "value": t.sum().item()}
        if device.type == "cuda":
            torch.cuda.synchronize()
    return out


def check_nccl_enqueue(gpu: bool) -> str:
    got = parlab.launch(_enqueue, 1, announce=False)[0]
    a, s = got["async"], got["sync"]
    assert a["value"] == s["value"] == 4.0, f"one rank's all-reduce of four ones: {got}"
    if gpu:  # NCCL: both calls return at once, with the op queued behind 200 ms of work
        assert a["returned_s"] < 0.1 and a["completed"] is False, f"an async NCCL all-reduce: {a}"
        assert s["returned_s"] < 0.1, f"a synchronous NCCL all-reduce waited for the GPU: {s}"
        return (f"NCCL returns at enqueue: async in {a['returned_s'] * 1e3:.1f} ms (not complete), "
                f"sync in {s['returned_s'] * 1e3:.1f} ms, with 200 ms of work queued before them")
    return "gloo in CPU mode: nothing queued on a device; NCCL's return at enqueue is decided on a GPU"


def _placement():
    from parlab.lab.measure import CommLog, Timeline
    from parlab.lab.measure.attach import mark, span_since
    from parlab.lab.measure.gpu_clock import nccl_seconds
    from parlab.lab.parallel import communicate

    device = parlab.device()
    busy = _busy(device)
    timeline = Timeline()
    with timeline, CommLog(timeline=timeline) as log:
        with timeline.span("backward"):  # a reduce-scatter issued halfway: it can run beside the second half
            busy(50)
            work = communicate("all_reduce", torch.ones(1024, device=device), async_op=True, label="beside")
            busy(50)
        work.wait()
        with timeline.span("backward 2"):  # its inputs ready only at the end: it cannot overlap the span
            busy(100)
            late = communicate("all_reduce", torch.ones(1024, device=device), async_op=True, label="after")
        late.wait()
        if device.type == "cuda":  # ZeRO-3's wait: the compute stream stalls for an all-reduce issued late
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                busy(80)
                gather = communicate("all_reduce", torch.ones(1024, device=device), async_op=True, label="gather")
            started = mark()
            gather.wait()  # orders the compute stream after it: the host goes on
            span_since("wait gather", started, "idle")
            torch.cuda.synchronize()  # NCCL's events are complete: its own duration can be read
    timed = nccl_seconds(late) is not None
    return [(e.name, e.kind, e.start, e.end) for e in timeline.events], timed, len(log.records)


def check_gpu_clock(gpu: bool) -> str:
    events, timed, records = parlab.launch(_placement, 1, announce=False)[0]
    at = {name: (start, end) for name, _, start, end in events}
    (b0, b1), (c0, _) = at["backward"], at["all_reduce beside"]
    (_, d1), (e0, _) = at["backward 2"], at["all_reduce after"]

    def overlaps(span_end, comm_start):  # chapter 04's assert: the op started before the span ended
        return comm_start < span_end

    assert overlaps(b1, c0) and c0 - b0 > 0.035, f"the op beside the second half: span {at['backward']}, op {c0}"
    assert not overlaps(d1 - 2e-3, e0), f"the op after the compute overlaps it: span {at['backward 2']}, op {e0}"
    saw = (f"an op issued halfway starts {(c0 - b0) * 1e3:.0f} ms into a {(b1 - b0) * 1e3:.0f} ms span; one "
           f"issued behind the compute {(e0 - d1) * 1e3:+.1f} ms after its span's end")
    if gpu:
        wait = at["wait gather"][1] - at["wait gather"][0]
        assert wait > 0.05, f"the compute stream's wait for an all-reduce queued behind 80 ms read {wait * 1e3:.1f} ms"
        saw += f"; a late gather's wait {wait * 1e3:.0f} ms; NCCL's own timing {'on' if timed else 'off'}"
    return saw + f" ({records} records)"


def _peaks():
    from parlab.lab.measure import measure_memory, peak_memory

    device = parlab.device()
    out = []
    for width, rows in ((1024, 4096), (64, 8)):  # a big step first: the second measurement must not report its peak
        model = torch.nn.Linear(width, width, device=device)
        model(torch.ones(rows, width, device=device)).sum().backward()  # 16 MiB of input, gone after the step
        out.append(measure_memory(model).peak_allocated)
        del model
    _, step_peak = peak_memory(lambda: torch.ones(2**20, device=device) * 2, device=device)
    return out, step_peak


def check_memory(gpu: bool) -> str:
    (big, small), step_peak = parlab.launch(_peaks, 1, announce=False)[0]
    if gpu:
        # the second peak starts from what was allocated at the first measurement (8 MiB), not from its peak
        assert big > 24 * 2**20 and small < big / 2, f"CUDA peaks {big}, {small}: not reset between measurements"
        assert step_peak >= 2 * 4 * 2**20, f"peak_memory on CUDA saw {step_peak} bytes for two 4 MiB tensors"
    else:
        assert big is None and small is None, f"CPU ranks have no CUDA peak; got {big}, {small}"
        assert step_peak >= 4 * 2**20, f"peak_memory on CPU saw {step_peak} bytes"
    return f"peaks {big} then {small} bytes; a step's peak {step_peak} bytes"


def _what_a_cpu_rank_sees():
    from parlab.lab.job import hf
    from parlab.lab.measure import Timeline

    return (os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), str(parlab.device()),
            Timeline(sync=True).sync, hf._on_gpu())


def check_cpu_mode(gpu: bool) -> str:
    from parlab.lab.launch import make_plan

    ranks = torch.cuda.device_count() + 1 if gpu else 2
    plan = make_plan(ranks)
    assert plan.device_type == "cpu", f"{ranks} ranks with {torch.cuda.device_count()} GPU(s): {plan.describe()}"
    seen = parlab.launch(_what_a_cpu_rank_sees, ranks, announce=False)
    assert seen == [("", 0, "cpu", False, False)] * ranks, f"CPU-mode ranks saw {seen}"
    assert not gpu or "NCCL needs one per rank" in plan.note, plan.note
    return f"{ranks} ranks on CPU, each seeing no GPU ({plan.note or 'no GPU here'})"


def check_job(gpu: bool) -> str:
    from parlab.course.bench.zero_train import margin
    from parlab.lab.job import reference, train_fsdp
    from parlab.lab.launch import make_plan

    cfg = dict(train_fsdp.CONFIG, steps=4, global_batch=8, accumulation=1)
    ranks = 2 if not gpu or torch.cuda.device_count() >= 2 else 1
    got = parlab.launch(train_fsdp.train, ranks, args=(cfg,), timeout=120, announce=False)[0]
    want = reference.one_process(cfg)
    tol, cuda_tol = make_plan(ranks).tolerance, runtime.tolerance("cuda")  # the course's one tolerance
    losses = {"losses": torch.tensor(got["losses"])}, {"losses": torch.tensor(want["losses"])}
    assert set(got["params"]) == set(want["params"]), f"weights {sorted(got['params'])} vs {sorted(want['params'])}"
    per_weight = {name: margin({name: got["params"][name]}, {name: w}, **cuda_tol)
                  for name, w in want["params"].items()}
    worst = max(per_weight, key=per_weight.get)
    used = {"losses": margin(*losses, **cuda_tol), "weights": per_weight[worst]}  # shares of TOLERANCE["cuda"]
    held = {"losses": margin(*losses, **tol), "weights": margin(got["params"], want["params"], **tol)}
    for what, share in held.items():
        assert share <= 1, (f"{what}: {share:.2f}x the tolerance {tol or 'assert_close default'} (worst weight "
                            f"{worst}); losses {got['losses']} against one process's {want['losses']}")
    return (f"FSDP2 job on {ranks} rank(s) = one process over {cfg['steps']} steps, losses and all "
            f"{len(per_weight)} weights; of runtime.TOLERANCE['cuda'] {cuda_tol} the losses use "
            f"{used['losses']:.3f}, the weights {used['weights']:.3f} (worst: {worst})"
            + ("" if gpu else f"; held here at {tol or 'assert_close default'}"))


def check_compile(gpu: bool) -> str:
    device, backend = ("cuda", "inductor") if gpu else ("cpu", "aot_eager")

    def f(x):
        return torch.nn.functional.gelu(x @ x.T).sum(-1)

    x = torch.randn(64, 64, device=device)
    torch.testing.assert_close(torch.compile(f, backend=backend)(x), f(x), rtol=1e-4, atol=1e-4)
    cc = os.environ.get("CC", "cc")
    return (f"torch.compile(backend={backend!r}) on {device} = eager; C compiler {cc!r} "
            f"{'found' if _which(cc) else 'not on PATH'}" + ("" if gpu else " (Inductor's needs are decided on a GPU)"))


def _report_cuda_state():
    return torch.cuda.is_initialized()  # before this rank touched CUDA: what it inherited from the zygote


def check_zygote(gpu: bool) -> str:
    import torch.distributed.fsdp  # noqa: F401  (the kernel's heavy modules: the zygote preloads them)
    import transformers  # noqa: F401

    inherited = parlab.launch(_report_cuda_state, 1, announce=False)
    assert inherited == [False], f"a rank started with CUDA initialised (inherited from the zygote): {inherited}"
    return "ranks start CUDA-free with fsdp and transformers preloaded"


def check_require_gpu(gpu: bool) -> str:
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run([sys.executable, "-m", "parlab", "run", "--ci", "--require-gpu", "--no-html",
                              "--chapters", "00", "--output", out], capture_output=True, text=True,
                             timeout=LIMITS["require_gpu"] - 30)
    text = run.stdout + run.stderr
    if gpu:
        assert run.returncode == 0, text[-2000:]
        return "chapter 00 passed with --require-gpu" + (f" ({line})" if (line := _on_cpu_line(text)) else "")
    assert run.returncode == 1 and "no GPU is visible here" in text, text[-2000:]
    return "refused without a GPU, as it must be"


def _on_cpu_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if "on CPU:" in line), "")


CHECKS = {"driver": check_driver, "nccl": check_nccl, "nccl_enqueue": check_nccl_enqueue,
          "gpu_clock": check_gpu_clock, "job": check_job, "memory": check_memory, "compile": check_compile,
          "zygote": check_zygote, "cpu_mode": check_cpu_mode, "require_gpu": check_require_gpu}


def _command(name: str, gpu: bool, result: str) -> list[str]:
    """The command that runs one check in a process of its own and writes its result to ``result``."""
    return [sys.executable, os.path.abspath(__file__), "--one", name, "--result", result,
            *([] if gpu else ["--dry-run"])]


def _check(name: str, gpu: bool) -> tuple[bool, str]:
    try:
        return True, CHECKS[name](gpu)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, and the next check still runs
        return False, f"{type(exc).__name__}: {exc}"


def _run_one(name: str, gpu: bool, result: str) -> int:
    """In the check's own process: run it, write {"ok", "saw"} to ``result``."""
    ok, detail = _check(name, gpu)
    with open(result, "w") as f:
        json.dump({"ok": ok, "saw": detail}, f)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: a launch's leftovers must not hang the check after its verdict


def _end_group(group: int, grace: float) -> None:
    """End every process left in ``group`` (a check's session: its ranks, its zygote): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def run(names, gpu: bool, echo=print, isolate: bool = True) -> list[dict]:
    """Run each check in a process of its own, at most ``LIMITS[name]`` seconds; report each as it ends.
    ``isolate=False``: all in this process, with no limit (``--in-process``: the tests' fast dry run)."""
    results = []
    for name in names:
        start, limit = time.monotonic(), LIMITS[name]
        if not isolate:
            ok, detail = _check(name, gpu)
        else:
            ok, detail = _isolated(name, gpu, limit)
        results.append({"check": name, "ok": ok, "seconds": round(time.monotonic() - start, 2), "saw": detail,
                        "decides": DECIDES[name]})
        echo(f"{'ok  ' if ok else 'FAIL'} {name:<13}{results[-1]['seconds']:6.1f} s  {detail}\n"
             f"{'':18}decides: {DECIDES[name]}", flush=True)
    return results


def _isolated(name: str, gpu: bool, limit: float) -> tuple[bool, str]:
    """One check in a process (and session) of its own, stopped with all it started after ``limit`` seconds;
    whatever it leaves running after its verdict is ended too."""
    with tempfile.TemporaryDirectory() as folder:
        result, log = os.path.join(folder, "result.json"), os.path.join(folder, "output.txt")
        with open(log, "w") as out:  # a file, not a pipe: a leftover holding it cannot keep us waiting
            process = subprocess.Popen(_command(name, gpu, result), start_new_session=True, stdout=out,
                                       stderr=subprocess.STDOUT)
            try:
                process.wait(timeout=limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _end_group(process.pid, TERM_GRACE)
            process.wait()
        if timed_out:
            return False, f"timed out after {limit} s"
        if os.path.exists(result):
            with open(result) as f:
                got = json.load(f)
            return got["ok"], got["saw"]
        with open(log) as f:
            tail = " | ".join(f.read().strip().splitlines()[-3:])
        return False, f"the check's process ended with status {process.returncode}: {tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on CPU: run the checks expecting CPU mode")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS), help="these checks only")
    parser.add_argument("--out", default=None, help="folder for smoke.json")
    parser.add_argument("--in-process", action="store_true",
                        help="every check in this process, with no time limit (faster; a hang hangs the run)")
    parser.add_argument("--one", choices=list(CHECKS), help=argparse.SUPPRESS)  # a check's own process
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return _run_one(args.one, not args.dry_run, args.result)
    gpus = torch.cuda.device_count()
    if not gpus and not args.dry_run:
        print("gpu_smoke: no GPU visible (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); on CPU use --dry-run", file=sys.stderr)
        return 2
    if gpus and args.dry_run:
        print("gpu_smoke: --dry-run expects CPU mode, but GPUs are visible; run without it", file=sys.stderr)
        return 2
    print(f"gpu_smoke: torch {torch.__version__}, {gpus} GPU(s){', dry run (CPU mode)' if args.dry_run else ''}; "
          + ("every check in this process, no time limits" if args.in_process else
             "each check in its own process, under its own time limit"), flush=True)
    results = run(args.only, gpu=not args.dry_run, isolate=not args.in_process)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "smoke.json"), "w") as f:
            json.dump({"gpus": gpus, "dry_run": args.dry_run, "checks": results}, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
