"""The ``parlab`` command. ``parlab check``: is this machine ready for the course? (chapter 00)
``parlab run``: run the chapters headless (see :mod:`parlab.course.chapters`). ``parlab export``: see :mod:`parlab.course.export`.
``parlab edition zh``: the Chinese edition's status, ``--build``, ``--new NN`` (see :mod:`parlab.course.edition`).

It prints versions, backends, CPUs, GPUs and how the GPUs are connected (``nvidia-smi topo -m``), the CUDA
this torch was built for beside the CUDA the driver supports, and the C compiler and Python headers a GPU's
``torch.compile`` builds with (:mod:`parlab.course.toolchain`), then runs a 2-rank all-reduce on each
backend this machine can use, through the same launcher the notebooks use. The exit status is non-zero
when a smoke test fails, or when the driver is too old for the build or the compiler or headers are
missing on a GPU machine, each saying what to install.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
import subprocess
import sys
import time


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _table(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [title, "-" * len(title)]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines) + "\n"


def _smoke(backend: str, world_size: int = 2) -> tuple[str, bool]:
    import torch
    import torch.distributed as dist

    import parlab

    def all_reduce():
        t = torch.ones(4, device=parlab.device()) * (parlab.rank() + 1)
        dist.all_reduce(t)
        return t.sum().item()

    start = time.perf_counter()
    try:
        values = parlab.launch(all_reduce, world_size, backend=backend, timeout=60, announce=False)
    except Exception as exc:  # noqa: BLE001 - the check reports every failure as a row
        return f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}", False
    expected = 4.0 * world_size * (world_size + 1) / 2
    ok = values == [expected] * world_size
    verdict = "ok" if ok else f"WRONG: got {values}, expected {expected} on every rank"
    return f"{verdict} ({world_size} ranks, {time.perf_counter() - start:.2f} s incl. start-up)", ok


def _gpu_rows(gpus: int) -> list[tuple[str, str]]:
    """Name and memory of each visible GPU. Asked of nvidia-smi where it exists: torch would create a CUDA
    context on every GPU in this process (hundreds of MiB each), on GPUs other learners may be using."""
    if not gpus:
        return []
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
        if query.returncode == 0:
            return [(f"  GPU {line.split(',')[0].strip()}", ",".join(line.split(",")[1:]).strip())
                    for line in query.stdout.strip().splitlines()]
    import torch

    return [(f"  cuda:{i}", f"{torch.cuda.get_device_properties(i).name}, "
                            f"{torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB") for i in range(gpus)]


def _toolchain(build: str | None, gpus: int) -> list[tuple[str, object]]:
    """The driver against this torch's CUDA, and what chapter 08's torch.compile cell builds with
    (:mod:`parlab.course.toolchain`): rows of (name, Verdict)."""
    from parlab.course import toolchain

    driver = toolchain.driver_cuda_version()  # also beside a CPU build: a GPU machine with the wrong torch
    return [("CUDA", toolchain.cuda_verdict(build, driver, gpus)),
            ("torch.compile", toolchain.compiler_verdict(toolchain.c_compiler(), toolchain.python_headers(), gpus))]


def leases() -> tuple[str, int | None]:
    """Workshop mode: this session's GPU pool, and who holds each GPU of the machine now (launch/lease.py).
    Also returns how many GPUs a launch may use, or None when PARLAB_GPUS is invalid."""
    from parlab.lab.launch import lease

    requested = lease.requested()
    try:
        pool = lease.pool()
    except ValueError as exc:
        return _table("GPU leases", [("PARLAB_GPUS", f"INVALID: {exc}")]), None
    held = lease.holders_of(lease.sort_gpus([*(pool or []), *lease.holders_of()]))
    rows = [("PARLAB_GPUS", f"{requested!r}: launches lease GPUs from {', '.join(pool) or 'none'}" if requested
             else "unset: launches use every visible GPU, without leasing"),
            ("lock folder", lease.lock_dir())]
    rows += [(f"GPU {gpu}", f"held by {lease.describe_holder(h)}" if h else "free") for gpu, h in held.items()]
    queue = lease.waiting()
    rows.append(("queue", f"{len(queue)} launch(es) waiting, first come first served: "
                 + "; ".join(lease.describe_holder(w) for w in queue) if queue else "nobody waiting"))
    return _table("GPU leases", rows), lease.pool_size()


def launch_hold(usable: int | None, launches: int = 3) -> str:
    """Workshop sizing: how long one small launch holds its GPUs here, from its lease to its release (the
    median of ``launches``); docs/workshop.md sizes a shared machine's queue from it. Where fewer than 2 GPUs
    are usable, it times the CPU launch instead and says so: that number is no GPU's."""
    import torch
    import torch.distributed as dist

    import parlab
    from parlab.lab.launch import _pickling
    from parlab.lab.launch._loop import _Launch
    from parlab.lab.launch.launcher import default_start_method
    from parlab.lab.launch.plan import make_plan

    def steps():  # a chapter's launch in small: a model, a few steps, its gradients all-reduced
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
        model = model.to(parlab.device())
        x = torch.randn(64, 256, device=parlab.device())
        for _ in range(5):
            model(x).square().mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        return model[0].weight.grad.sum().item()

    gpu = dist.is_nccl_available() and (usable or 0) >= 2
    where = "2 ranks, nccl on 2 GPUs" if gpu else "2 ranks, gloo on the CPU: fewer than 2 GPUs usable here"
    holds = []
    for _ in range(launches):
        run = _Launch(make_plan(2, "nccl" if gpu else "gloo", timeout=60), _pickling.dumps((steps, (), {})), "none",
                      default_start_method(), announce=False)
        try:
            run.start()
            run.run()
        except Exception as exc:  # noqa: BLE001 - reported as a row; the smoke test above decides Ready
            return _table("Workshop: a launch's hold", [("hold", f"FAILED: {type(exc).__name__}: "
                                                                 f"{str(exc).splitlines()[0]}")])
        finally:
            run.close()
        holds.append(run.gpus.released_at - run.gpus.granted_at)
    hold = sorted(holds)[len(holds) // 2]
    return _table("Workshop: a launch's hold", [
        ("hold", f"{hold:.2f} s from lease to release, median of {launches} small launches ({where})"),
        ("sizing", f"python benchmarks/workshop.py --duration {hold:.2f} (docs/workshop.md, How many learners)")])


def check() -> int:
    import torch
    import torch.distributed as dist

    from parlab.lab.launch.plan import cpu_count, max_cpu_ranks

    print(_table("Versions", [
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"),
        *[(p, _version(p)) for p in ("parlab", "transformers", "jupyterlab", "ipykernel", "cloudpickle")],
    ]))
    gpus = torch.cuda.device_count()
    backends = [("gloo", "available" if dist.is_gloo_available() else "missing"),
                ("nccl", "available" if dist.is_nccl_available() else "not in this torch build")]
    print(_table("Backends", backends))
    hw = [("platform", platform.platform()), ("CPU cores usable", str(cpu_count())),
          ("CPU ranks allowed", f"up to {max_cpu_ranks()} (PARLAB_MAX_RANKS)"), ("GPUs visible", str(gpus))]
    hw += _gpu_rows(gpus)
    print(_table("Hardware", hw))
    tools = _toolchain(torch.version.cuda, gpus)
    print(_table("GPU toolchain", [(name, v.text) for name, v in tools]))
    if shutil.which("nvidia-smi") and gpus:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
        print("GPU interconnect (nvidia-smi topo -m)\n-------------------------------------")
        print(topo.stdout or topo.stderr)
        print("NV# = NVLink (fast GPU-to-GPU); PIX/PXB/PHB/NODE/SYS = through PCIe and the CPU (slower).\n")
    else:
        print("GPU interconnect: no GPUs visible (course runs in CPU mode: gloo, one process per rank)\n")
    lease_table, usable = leases()
    print(lease_table)
    rows, all_ok = [], usable is not None and all(v.ok for _, v in tools)
    gloo_result, ok = _smoke("gloo")
    rows.append(("gloo · CPU", gloo_result))
    all_ok &= ok
    if dist.is_nccl_available() and (usable or 0) >= 2:
        nccl_result, ok = _smoke("nccl")
        rows.append(("nccl · GPU", nccl_result))
        all_ok &= ok
    else:
        rows.append(("nccl · GPU", f"skipped: needs 2 GPUs, {usable if usable is not None else 'none'} usable"))
    print(_table("Smoke test: all_reduce", rows))
    print(launch_hold(usable))
    print("Ready." if all_ok else "Some checks FAILED (see above).")
    return 0 if all_ok else 1


def run_chapters(args) -> int:
    from parlab.course import chapters as course
    try:
        paths = course.chapters(args.chapters, args.notebooks)
    except (ValueError, FileNotFoundError) as exc:
        print(f"parlab run: {exc}", file=sys.stderr)
        return 2
    print(f"parlab run: {len(paths)} chapter(s) from {paths[0].parent}, "
          f"{'CI' if args.ci else 'default'} parameters, output in {args.output}/", flush=True)
    results = course.run_course(paths, args.output, ci=args.ci, html=not args.no_html,
                                cell_timeout=args.cell_timeout, require_gpu=args.require_gpu)
    course.write_summary(results, args.output)
    print()
    print(course.table(results))
    return 0 if all(r.passed for r in results) else 1


def times_command(args) -> int:
    """``parlab times``: what disagrees with the one source of the chapters' times; with --write, fix it."""
    import json

    from parlab.course import times
    if args.measured:
        with open(args.measured) as f:
            times.take_measured(json.load(f))
    stale = times.sync(times.ROOT / "notebooks", times.ROOT / "README.md", write=args.write)
    for line in stale:
        print(("fixed: " if args.write else "stale: ") + line)
    if not stale:
        print("parlab times: every Overview and the README's course map agree with parlab.course.times")
    return 0 if args.write or not stale else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parlab", description="Parallelism Lab: the course's command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="versions, backends, CPUs, GPUs and interconnect, and a 2-rank smoke test")
    export = sub.add_parser("export", help="write a script that runs a notebook's function on N ranks "
                                           "(with python, or under torchrun); save the notebook first")
    export.add_argument("notebook")
    export.add_argument("function", help="name of a function defined in the notebook")
    export.add_argument("-o", "--output", help="script to write (default: print it)")
    export.add_argument("--world-size", type=int, default=4, help="default number of ranks (default 4)")
    export.add_argument("--args", default="[]", help="positional arguments as a Python list, e.g. '[1000]'")
    run = sub.add_parser("run", help="run every chapter (or some) top to bottom in a fresh kernel, each in its "
                                     "own folder; executed notebooks and HTML go to --output")
    run.add_argument("--chapters", nargs="+", metavar="NN", help="chapters to run, by number or name "
                                                                  "(default: every NN_*.ipynb)")
    run.add_argument("--ci", action="store_true", help="use each chapter's CI parameters "
                                                       "(metadata.parlab.ci_parameters) instead of its defaults")
    run.add_argument("--output", default="parlab-run", help="folder for executed notebooks, HTML and "
                                                            "summary.json (default: parlab-run)")
    run.add_argument("--notebooks", default=None, help="folder holding the chapters (default: the course's "
                                                       "notebooks/)")
    run.add_argument("--no-html", action="store_true", help="do not write HTML copies")
    run.add_argument("--cell-timeout", type=float, default=600, help="seconds one cell may run (default 600)")
    run.add_argument("--require-gpu", action="store_true", help="for GPU runners: fail a chapter with a launch that "
                     "fits this machine's GPUs but ran on CPU; report the launches too large for them (they run on CPU)")
    times = sub.add_parser("times", help="check (or --write) each chapter's read, exercise and run times in its "
                                         "Overview and the README's course map, from one source (parlab.course.times)")
    times.add_argument("--write", action="store_true", help="rewrite the Overviews and the README's map")
    times.add_argument("--measured", default=None, help="a run_times.json the test suite wrote "
                                                        "(artifacts/run_times.json): take its run times in first")
    from parlab.course.edition import add_command  # parlab edition LANG [--build | --new NN]

    add_command(sub)
    args = parser.parse_args(argv)
    if args.command == "edition":
        return args.edition(args)
    if args.command == "times":
        return times_command(args)
    if args.command == "check":
        return check()
    if args.command == "run":
        return run_chapters(args)
    if args.command == "export":
        import ast

        from parlab.course.export import export_function

        text = export_function(args.notebook, args.function, ast.literal_eval(args.args), args.world_size,
                               args.output or "script.py")
        if args.output:
            with open(args.output, "w") as f:
                f.write(text)
            print(f"wrote {args.output}: python {args.output} --world-size {args.world_size}, or "
                  f"torchrun --nproc-per-node {args.world_size} {args.output}")
        else:
            print(text)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
