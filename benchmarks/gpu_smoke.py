"""The GPU smoke check: the paths most likely to break on a first GPU run, most at-risk first, in minutes.

    python benchmarks/gpu_smoke.py                 # on a GPU machine (one GPU is enough); exit 1 on a failure
    python benchmarks/gpu_smoke.py --dry-run       # on CPU: the same checks, expecting CPU mode (tested)

Each check runs under its own time limit and reports what it saw; the first run on GPUs settles what
docs/ci.md lists under "What only a GPU run can settle". In order:

1. ``zygote``: the rank server stays CUDA-free with the kernel's heavy modules preloaded (a rank forked
   from a zygote with a CUDA context could not use CUDA at all);
2. ``nccl``: one rank in GPU mode: the ``cpu:gloo,cuda:nccl`` group, ``parlab.device()`` = ``cuda:0``, an
   all-reduce of a CUDA tensor, a ``DeviceMesh`` of type ``cuda`` from ``parlab.lab.runtime.mesh``;
3. ``memory``: ``measure_memory``'s CUDA peak starts afresh at each measurement; ``peak_memory`` on CUDA;
4. ``cpu_mode``: a launch with more ranks than GPUs runs on CPU, and its ranks see no GPU at all;
5. ``job``: chapter 08's FSDP2 job (``parlab.lab.job.train_fsdp.train``) on the GPUs that fit, equal to one CPU
   process within ``runtime.TOLERANCE`` over 4 steps; it prints the share of the tolerance the worst loss uses,
   which on a GPU is the measured bound that decides the provisional GPU tolerance;
6. ``require_gpu``: ``parlab run --ci --require-gpu --chapters 00`` (on CPU: refused, as it must be).

Writes ``smoke.json`` (each check: ok, seconds, what it saw) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import parlab
from parlab.lab import runtime
def _report_cuda_state():
    return torch.cuda.is_initialized()  # before this rank touched CUDA: what it inherited from the zygote


def check_zygote(gpu: bool) -> str:
    import torch.distributed.fsdp  # noqa: F401  (the kernel's heavy modules: the zygote preloads them)
    import transformers  # noqa: F401

    inherited = parlab.launch(_report_cuda_state, 1, announce=False)
    assert inherited == [False], f"a rank started with CUDA initialised (inherited from the zygote): {inherited}"
    return "ranks start CUDA-free with fsdp and transformers preloaded"


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
    from parlab.lab.job import reference, train_fsdp

    from parlab.course.bench.zero_train import margin
    from parlab.lab.launch import make_plan

    cfg = dict(train_fsdp.CONFIG, steps=4, global_batch=8, accumulation=1)
    ranks = 2 if not gpu or torch.cuda.device_count() >= 2 else 1
    got = parlab.launch(train_fsdp.train, ranks, args=(cfg,), timeout=120, announce=False)[0]
    want = reference.one_process(cfg)
    tol = make_plan(ranks).tolerance  # runtime.TOLERANCE: the course's one tolerance against one CPU process
    worst = margin({"losses": torch.tensor(got["losses"])}, {"losses": torch.tensor(want["losses"])}, **tol)
    assert worst <= 1, f"losses {got['losses']} against one process's {want['losses']}: {worst:.2f}x the tolerance {tol}"
    return (f"FSDP2 job on {ranks} rank(s) = one process over {cfg['steps']} steps: the losses use {worst:.3f} of "
            f"the tolerance {tol or 'assert_close default'} (runtime.TOLERANCE; on a GPU this measures its bound)")



def check_require_gpu(gpu: bool) -> str:
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run([sys.executable, "-m", "parlab", "run", "--ci", "--require-gpu", "--no-html",
                              "--chapters", "00", "--output", out], capture_output=True, text=True, timeout=420)
    text = run.stdout + run.stderr
    if gpu:
        assert run.returncode == 0, text[-2000:]
        return "chapter 00 passed with --require-gpu" + (f" ({line})" if (line := _on_cpu_line(text)) else "")
    assert run.returncode == 1 and "no GPU is visible here" in text, text[-2000:]
    return "refused without a GPU, as it must be"


def _on_cpu_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if "on CPU:" in line), "")


CHECKS = {"zygote": check_zygote, "nccl": check_nccl, "memory": check_memory, "cpu_mode": check_cpu_mode,
          "job": check_job, "require_gpu": check_require_gpu}


def run(names, gpu: bool, echo=print) -> list[dict]:
    results = []
    for name in names:
        start = time.monotonic()
        try:
            detail, ok = CHECKS[name](gpu), True
        except Exception as exc:  # noqa: BLE001 - every failure is reported, and the next check still runs
            detail, ok = f"{type(exc).__name__}: {exc}", False
        results.append({"check": name, "ok": ok, "seconds": round(time.monotonic() - start, 2), "saw": detail})
        echo(f"{'ok  ' if ok else 'FAIL'} {name:<12} {results[-1]['seconds']:6.1f} s  {detail}", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on CPU: run the checks expecting CPU mode")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS), help="these checks only")
    parser.add_argument("--out", default=None, help="folder for smoke.json")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count()
    if not gpus and not args.dry_run:
        print("gpu_smoke: no GPU visible (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); on CPU use --dry-run", file=sys.stderr)
        return 2
    if gpus and args.dry_run:
        print("gpu_smoke: --dry-run expects CPU mode, but GPUs are visible; run without it", file=sys.stderr)
        return 2
    print(f"gpu_smoke: torch {torch.__version__}, {gpus} GPU(s){', dry run (CPU mode)' if args.dry_run else ''}",
          flush=True)
    results = run(args.only, gpu=not args.dry_run)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "smoke.json"), "w") as f:
            json.dump({"gpus": gpus, "dry_run": args.dry_run, "checks": results}, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
