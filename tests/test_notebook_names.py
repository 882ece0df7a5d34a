"""No chapter uses a name that no cell defines, in any branch: a GPU-only branch (``if not cpu_mode:``) never
runs on the CPU machines that test the course, so only reading the code can catch its undefined names
(chapter 04's GPU branch once called a factory with names no cell of the chapter defined; issue #44).

Every code cell of a chapter is turned into plain Python as IPython would run it, the cells are joined in
order, and pyflakes reports each name read that nothing assigns, imports or defines. Cell magics that
define names are read as the course's own do: ``%%ranks ... --out NAME`` binds NAME in the kernel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from pyflakes import checker, messages

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KERNEL_NAMES = {"get_ipython", "display", "In", "Out"}  # what an IPython kernel adds to the builtins
OUT = re.compile(r"^%%ranks\b.*--out[ =](\w+)", re.M)


def undefined_names(nb: nbformat.NotebookNode) -> list[str]:
    """``"cell N, line L: NAME"`` for each name read in ``nb``'s code that no cell defines."""
    transform = TransformerManager().transform_cell
    lines, starts, magic_defined = [], [], set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        magic_defined.update(OUT.findall(cell.source))
        starts.append((len(lines) + 1, index))
        python = transform(cell.source)
        try:
            ast.parse(python)
        except SyntaxError as error:
            return [f"cell {index}: does not parse ({error.msg}, line {error.lineno})"]
        lines.extend(python.splitlines() + [""])
    tree = ast.parse("\n".join(lines))
    found = checker.Checker(tree, builtins=KERNEL_NAMES | magic_defined).messages
    out = []
    for message in found:
        if isinstance(message, messages.UndefinedName):
            start, index = max(s for s in starts if s[0] <= message.lineno)
            out.append(f"cell {index}, line {message.lineno - start + 1}: {message.message_args[0]}")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_chapter_uses_a_name_no_cell_defines(path):
    missing = undefined_names(nbformat.read(path, as_version=4))
    assert not missing, f"{path.name} reads names that no cell defines:\n  " + "\n  ".join(missing)


def test_the_check_finds_an_undefined_name_in_a_gpu_only_branch():
    cells = [nbformat.v4.new_code_cell("import torch\ncpu_mode = True\nworld_size = 2"),
             nbformat.v4.new_code_cell("%%ranks -n $world_size --out gathered\nx = 1"),
             nbformat.v4.new_code_cell("%%writefile train.py\nprint(undefined_in_a_file)"),
             nbformat.v4.new_code_cell("assert gathered\nif not cpu_mode:\n    run(global_batch, shard)\n")]
    nb = nbformat.v4.new_notebook(cells=cells)
    assert undefined_names(nb) == ["cell 3, line 3: run", "cell 3, line 3: global_batch", "cell 3, line 3: shard"]
    cells[3].source = "assert gathered\ndef run(*a): pass\nglobal_batch = shard = 1\nif not cpu_mode:\n    run(global_batch, shard)\n"
    assert undefined_names(nb) == []
