"""Do the course's torchrun jobs ever abort? Each one run many times in a row, from a shell and from a kernel.

The jobs, exactly as the chapters run them:
- ``ch03``: chapter 03's plain DDP script (read from the notebook's ``%%writefile`` cell), 4 ranks;
- ``ch08``: chapter 08's ``train_fsdp.py`` (FSDP2), 2 steps then a DCP checkpoint, 2 ranks;
- ``trainer``: chapter 08's Trainer job, ``python -m parlab.lab.job.hf``, 2 ranks.
Modes: ``shell`` starts ``torchrun`` as a shell does, from a process that has launched nothing; ``kernel``
starts it with the chapters' helper from a fresh Jupyter kernel that first ran ``parlab.launch`` (as a
chapter's kernel has). ``--unfixed`` removes the scripts' last line (``os._exit(0)`` after
``destroy_process_group``) to show what they did before: an abort at interpreter exit now and then
("terminate called without an active exception"; why: ``parlab.lab.launch.cluster.exit_without_teardown``).
Writes ``results/torchrun_aborts.json`` (``..._unfixed.json``). Not part of the tests: 100 runs of each job
take about an hour on 2 cores.
Usage: python benchmarks/torchrun_aborts.py [--runs 100] [--jobs ch03 ch08 trainer] [--modes shell kernel] [--unfixed]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import Kernel, machine, results_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = "os._exit(0)"
ABORT = "terminate called without an active exception"


def _scripts(work: str, unfixed: bool) -> dict[str, tuple[int, list[str]]]:
    """Each job: its rank count and its torchrun arguments (target first), with files under ``work``."""
    import nbformat

    from parlab.lab.job import train_fsdp

    nb = nbformat.read(os.path.join(ROOT, "notebooks", "03_dp_vs_ddp.ipynb"), as_version=4)
    ddp = next(c.source for c in nb.cells if c.source.startswith("%%writefile") and "ddp_train.py" in c.source)
    ddp = ddp.split("\n", 1)[1]
    with open(train_fsdp.__file__) as f:
        fsdp = f.read()
    for text in (ddp, fsdp):
        assert text.count(FIX) == 1, "each script leaves through os._exit(0) once"
    if unfixed:
        ddp, fsdp = ddp.replace(FIX, "pass"), fsdp.replace(FIX, "pass")
    for name, text in (("ddp_train.py", ddp), ("train_fsdp.py", fsdp)):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    sizes = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)  # chapter 03's defaults
    cfg = dict(sizes=sizes, batch=4, seq_len=32, vocab=128, steps=3, out=os.path.join(work, "losses"))
    jobs = {
        "ch03": (4, [os.path.join(work, "ddp_train.py"), json.dumps(cfg)]),
        "ch08": (2, [os.path.join(work, "train_fsdp.py"), "--steps", "2", "--save", os.path.join(work, "ckpt"),
                     "--out", os.path.join(work, "out.json"), "--config", json.dumps({"steps": 4})]),
    }
    if not unfixed:  # the Trainer job leaves through parlab's exit_without_teardown: no unfixed copy
        jobs["trainer"] = (2, ["-m", "parlab.lab.job.hf", "--config", '{"steps": 2}', "--out",
                               os.path.join(work, "r.pt")])
    return jobs


def _shell(nproc: int, argv: list[str], runs: int) -> list[tuple[float, str | None]]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *argv]
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=600)
        out.append((time.perf_counter() - start, None if done.returncode == 0 else done.stdout + done.stderr))
    return out


KERNEL_SETUP = """
import json, time, torch
import parlab
from parlab.lab.job.torchrun import torchrun
parlab.launch(lambda: float(torch.ones(1).sum()), {nproc}, announce=False)  # what a chapter's kernel has done
"""

# One cell per run, as a learner reruns a cell (and no cell outlasts the kernel driver's 600 s timeout)
KERNEL_RUN = """
_t = time.perf_counter()
try:
    torchrun({target!r}, {nproc}, *{args!r}, module={module!r})
    _run = (time.perf_counter() - _t, None)
except RuntimeError as e:
    _run = (time.perf_counter() - _t, str(e))
print("RUN", json.dumps(_run))
"""


def _kernel(nproc: int, argv: list[str], runs: int) -> list[tuple[float, str | None]]:
    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    kernel, out = Kernel(), []
    try:
        kernel.execute(KERNEL_SETUP.format(nproc=nproc))
        cell = KERNEL_RUN.format(nproc=nproc, target=target, args=args, module=module)
        for _ in range(runs):
            text = kernel.execute(cell)
            out.append(tuple(json.loads(next(line[4:] for line in text.splitlines() if line.startswith("RUN ")))))
    finally:
        kernel.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--jobs", nargs="+", default=["ch03", "ch08", "trainer"])
    parser.add_argument("--modes", nargs="+", default=["shell", "kernel"], choices=["shell", "kernel"])
    parser.add_argument("--unfixed", action="store_true", help="without the scripts' os._exit(0)")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="parlab-aborts-")
    jobs = _scripts(work, args.unfixed)
    unknown = set(args.jobs) - set(jobs)
    if unknown:
        raise SystemExit(f"--jobs: unknown {sorted(unknown)}; allowed {sorted(jobs)}")
    results = {"machine": machine("gloo"), "unfixed": args.unfixed, "runs": args.runs, "jobs": {}}
    try:
        for job in args.jobs:
            nproc, argv = jobs[job]
            for mode in args.modes:
                runs = (_shell if mode == "shell" else _kernel)(nproc, argv, args.runs)
                failures = [text for _, text in runs if text is not None]
                seconds = [s for s, _ in runs]
                row = {"ranks": nproc, "runs": len(runs), "failed": len(failures),
                       "aborted": sum(ABORT in text for text in failures),
                       "median_s": round(statistics.median(seconds), 2), "max_s": round(max(seconds), 2),
                       "first_failure": failures[0][-3000:] if failures else None}
                results["jobs"][f"{job}/{mode}"] = row
                print(f"{job:8s} {mode:6s} {nproc} ranks: {row['failed']}/{row['runs']} failed "
                      f"({row['aborted']} aborts), median {row['median_s']} s, max {row['max_s']} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name = "torchrun_aborts_unfixed.json" if args.unfixed else "torchrun_aborts.json"
    with open(os.path.join(results_dir(args.out), name), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
