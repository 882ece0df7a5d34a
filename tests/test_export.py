"""`parlab export`: a notebook's function becomes a script that runs with python and under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import nbformat
import pytest

from parlab.course.export import export_function

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WELCOME = os.path.join(ROOT, "notebooks", "00_welcome.ipynb")


def _notebook(tmp_path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return str(path)


def test_keeps_exactly_what_the_function_needs(tmp_path):
    path = _notebook(
        tmp_path,
        "import torch\nimport json, inspect as insp\n%load_ext parlab\n!echo hi",
        "scale = 2\nunused = object()",
        "def helper(x):\n    return x * scale",
        "%%ranks -n 2\nprint('magic cell')",
        "scale = 3  # the last definition before use wins",
        "def work():\n    return helper(torch.ones(1)).item()",
        "results = parlab.launch(work, 2)  # running cells are not definitions",
    )
    text = export_function(path, "work", script="w.py")
    assert "scale = 3" in text and "scale = 2" not in text
    assert "def helper" in text and "unused" not in text and "launch(work, 2)" not in text
    assert "import torch" in text and "inspect" not in text  # only the imports the definitions use
    assert "%" not in text.split('"""')[2] and "magic cell" not in text
    out = tmp_path / "w.py"
    out.write_text(text)
    run = subprocess.run([sys.executable, str(out), "--world-size", "2"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[3.0, 3.0]"


def test_unknown_function_lists_the_ones_there(tmp_path):
    path = _notebook(tmp_path, "def a():\n    pass", "b = 1")
    with pytest.raises(ValueError, match="no function named 'b' .* functions there: a"):
        export_function(path, "b")


def test_args_must_be_literals(tmp_path):
    with pytest.raises(ValueError, match="args must be Python literals"):
        export_function(_notebook(tmp_path, "def a(x):\n    pass"), "a", args=(object(),))


@pytest.mark.slow
def test_chapter_function_runs_under_torchrun(tmp_path):
    script = tmp_path / "total.py"
    run = subprocess.run([sys.executable, "-m", "parlab", "export", WELCOME, "total", "-o", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3.0" in run.stdout and "started by torchrun" in run.stdout  # 1 + 2 on 2 ranks
