"""What the chapters' kernel cells decide about GPUs, read from their source (no chapter is run here): they
size from the GPUs a launch may use (``visible_gpus()``: a shared machine's pool), and compare a launch's
or a torchrun job's results with one CPU process at that launch's tolerance (``runtime.TOLERANCE``)."""

from __future__ import annotations

import ast
import pathlib
import re

import nbformat
import pytest

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _kernel_code(path: pathlib.Path):
    """(cell id, source) of each code cell the kernel runs itself: not a %%writefile script (a script runs
    under torchrun and asks torch about its own process)."""
    nb = nbformat.read(path, as_version=4)
    return [(c.get("id"), c.source) for c in nb.cells if c.cell_type == "code" and not c.source.startswith("%%")]


def _outside_functions(source: str) -> list[ast.AST]:
    """The cell's statements outside any def (what the kernel runs; a def's body may run on the ranks)."""
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    nodes, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        nodes.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return nodes


# Kernel cells that ask about the machine itself, not about GPUs to compute on: chapter 02's drawing of
# nvidia-smi's topology (every GPU of the machine), chapter 01's peak-memory cell (not this helper's chapter).
MACHINE_QUESTIONS = {("02", "98c5471f"), ("01", "becab8b0")}


def sizing_from_torch(source: str) -> list[str]:
    """``torch.cuda.device_count()`` / ``is_available()`` asked by the kernel, outside a function."""
    return [ast.unparse(n) for n in _outside_functions(source) if isinstance(n, ast.Call)
            and re.fullmatch(r"torch\.cuda\.(device_count|is_available)", ast.unparse(n.func))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_kernel_cells_size_from_the_gpus_a_launch_may_use(path):
    """On a shared machine a learner's pool (PARLAB_GPUS) is smaller than the machine: a cell that sized
    from ``torch.cuda.device_count()`` launched 2 ranks with a pool of 1, which then ran on the CPU."""
    found = [f"cell {cell}: {call}" for cell, source in _kernel_code(path) for call in sizing_from_torch(source)
             if (path.name[:2], cell) not in MACHINE_QUESTIONS]
    assert not found, (f"{path.name}: ask parlab.lab.launch.plan.visible_gpus() (the lease pool), or the plan "
                       f"(make_plan(n).device_type), not torch:\n  " + "\n  ".join(found))


def test_the_sizing_scan_finds_a_kernel_question_and_not_a_ranks():
    cell = ("def on_rank():\n    return torch.cuda.device_count()\n\n"
            "if torch.cuda.device_count() < 2:\n    print('needs 2')\nok = not torch.cuda.is_available()")
    assert sizing_from_torch(cell) == ["torch.cuda.is_available()", "torch.cuda.device_count()"]


# -- a launch's results against one CPU process: at the launch's tolerance ----------------------------------

# Kernel comparisons in chapters 08 and 09 that are not a launch against one CPU process, and why each keeps
# its own tolerance: both sides computed by the same ranks on the same device.
SAME_DEVICE = {
    ("08", "6a14e0e0"): "compiled and eager FSDP2 losses, both from one launch's rank 0",
    ("08", "compile-gpu"): "compiled and eager on one GPU in the kernel, at Inductor's own tolerance",
}


def comparisons_without_tolerance(source: str) -> list[str]:
    """The kernel's ``assert_close`` calls that pass no ``**`` keywords (the launch's tolerance)."""
    return [ast.unparse(n) for n in _outside_functions(source) if isinstance(n, ast.Call)
            and ast.unparse(n.func).split(".")[-1] == "assert_close" and not any(k.arg is None for k in n.keywords)]


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name[:2] in ("08", "09")], ids=lambda p: p.stem)
def test_launches_are_compared_with_one_process_at_the_launchs_tolerance(path):
    """On GPUs cuBLAS rounds differently from the CPU: a GPU run held to fp32's defaults (or 1e-5) fails for
    no fault. Every kernel comparison passes the launch's tolerance (``make_plan(n).tolerance``, or
    ``torchrun.tolerance(n)`` for torchrun jobs), or is listed in SAME_DEVICE with why it need not."""
    found = [f"cell {cell}: {call}" for cell, source in _kernel_code(path)
             if (path.name[:2], cell) not in SAME_DEVICE for call in comparisons_without_tolerance(source)]
    assert not found, (f"{path.name}: pass the launch's tolerance, e.g. **make_plan(world_size).tolerance or "
                       f"**torchrun.tolerance(world_size):\n  " + "\n  ".join(found))
    listed = {cell for number, cell in SAME_DEVICE if number == path.name[:2]}
    stale = listed - {cell for cell, source in _kernel_code(path) if comparisons_without_tolerance(source)}
    assert not stale, f"{path.name}: SAME_DEVICE lists cells {sorted(stale)} that compare nothing without a tolerance"


def test_the_tolerance_scan_finds_a_comparison_without_one():
    cell = ("tol = make_plan(2).tolerance\nassert_close(a, b, **tol)\nfor n in names:\n"
            "    torch.testing.assert_close(x[n], y[n], msg=n)\ndef on_rank():\n    assert_close(a, b)")
    assert comparisons_without_tolerance(cell) == ["torch.testing.assert_close(x[n], y[n], msg=n)"]


@pytest.mark.parametrize("gpus, nprocs, device", [(0, (2,), "cpu"), (4, (2,), "cuda"), (4, (4, 8), "cuda"),
                                                  (2, (4,), "cpu"), (1, (1,), "cuda")])
def test_a_torchrun_jobs_tolerance_is_its_devices(gpus, nprocs, device):
    """torchrun.tolerance decides as torchrun does: GPU mode when every rank of a job has a GPU; with several
    jobs (a resume at another size), the GPU's where any of them ran on GPUs."""
    from parlab.lab import runtime
    from parlab.lab.job import torchrun

    got = torchrun.tolerance(*nprocs, env={}, device_count=lambda: gpus)
    assert got == runtime.tolerance(device), (gpus, nprocs, got)
    with pytest.raises(ValueError, match="nprocs must be one or more positive ints"):
        torchrun.tolerance(0, env={})
