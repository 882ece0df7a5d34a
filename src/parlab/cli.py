"""The ``parlab`` command. ``parlab check``: is this machine ready for the course? (chapter 00)
``parlab run``: run the chapters headless (see :mod:`parlab.course`). ``parlab export``: see :mod:`parlab.export`.

It prints versions, backends, CPUs, GPUs and how the GPUs are connected (``nvidia-smi topo -m``), then
runs a 2-rank all-reduce on each backend this machine can use, through the same launcher the
notebooks use. The exit status is non-zero when a smoke test fails.
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


def check() -> int:
    import torch
    import torch.distributed as dist

    from parlab.launch.plan import cpu_count, max_cpu_ranks, visible_gpus

    print(_table("Versions", [
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"),
        *[(p, _version(p)) for p in ("parlab", "transformers", "jupyterlab", "ipykernel", "cloudpickle")],
    ]))
    gpus = visible_gpus()
    backends = [("gloo", "available" if dist.is_gloo_available() else "missing"),
                ("nccl", "available" if dist.is_nccl_available() else "not in this torch build")]
    print(_table("Backends", backends))
    hw = [("platform", platform.platform()), ("CPU cores usable", str(cpu_count())),
          ("CPU ranks allowed", f"up to {max_cpu_ranks()} (PARLAB_MAX_RANKS)"), ("GPUs visible", str(gpus))]
    for i in range(gpus):
        p = torch.cuda.get_device_properties(i)
        hw.append((f"  cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB"))
    print(_table("Hardware", hw))
    if shutil.which("nvidia-smi") and gpus:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
        print("GPU interconnect (nvidia-smi topo -m)\n-------------------------------------")
        print(topo.stdout or topo.stderr)
        print("NV# = NVLink (fast GPU-to-GPU); PIX/PXB/PHB/NODE/SYS = through PCIe and the CPU (slower).\n")
    else:
        print("GPU interconnect: no GPUs visible (course runs in CPU mode: gloo, one process per rank)\n")
    rows, all_ok = [], True
    gloo_result, ok = _smoke("gloo")
    rows.append(("gloo · CPU", gloo_result))
    all_ok &= ok
    if dist.is_nccl_available() and gpus >= 2:
        nccl_result, ok = _smoke("nccl")
        rows.append(("nccl · GPU", nccl_result))
        all_ok &= ok
    else:
        rows.append(("nccl · GPU", f"skipped: needs 2 GPUs, {gpus} visible"))
    print(_table("Smoke test: all_reduce", rows))
    print("Ready." if all_ok else "Some checks FAILED (see above).")
    return 0 if all_ok else 1


def run_chapters(args) -> int:
    from parlab import course

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
    run.add_argument("--require-gpu", action="store_true", help="fail a chapter none of whose launches ran in "
                                                                "GPU mode (NCCL): for GPU runners")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check()
    if args.command == "run":
        return run_chapters(args)
    if args.command == "export":
        import ast

        from parlab.export import export_function

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
