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
    assert run.stdout.strip().splitlines()[-1] == "3.0"  # rank 0's value
    assert "parlab" not in text.split('"""')[2]  # torch alone: nothing of the course


def test_a_function_using_only_the_rank_helpers_exports_to_plain_pytorch(tmp_path):
    """parlab.rank(), world_size(), local_rank() and device() are written out; the script runs with the course's
    package hidden (a parlab that cannot be imported stands first on the path)."""
    path = _notebook(
        tmp_path,
        "import parlab\nimport torch\nimport torch.distributed as dist",
        "def work():\n    t = torch.tensor([parlab.rank() + 1.0], device=parlab.device())\n    dist.all_reduce(t)\n"
        "    return (t.item(), parlab.world_size(), parlab.local_rank())",
    )
    text = export_function(path, "work", script="w.py")
    assert "import parlab" not in text and "parlab." not in text.split('"""')[2], text
    assert "nothing of the course" in text.split('"""')[1]
    hidden = tmp_path / "hidden" / "parlab"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('the course is not installed here')\n")
    (tmp_path / "w.py").write_text(text)
    env = dict(os.environ, PYTHONPATH=str(hidden.parent))
    run = subprocess.run([sys.executable, str(tmp_path / "w.py"), "--world-size", "2"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "(3.0, 2, 0)"


def test_a_function_using_more_of_the_course_says_what_the_cluster_needs(tmp_path):
    path = _notebook(
        tmp_path,
        "import parlab\nfrom parlab.lab.models import token_batch",
        "def work():\n    return token_batch(2, 4).shape[0] * parlab.world_size()",
    )
    text = export_function(path, "work", script="w.py")
    doc = text.split('"""')[1]
    assert "Needs the course's package `parlab` on every node" in doc and "pip install -e ." in doc
    assert "parlab.world_size" in doc and "parlab.lab.models" in doc  # what it uses, by name
    (tmp_path / "w.py").write_text(text)
    run = subprocess.run([sys.executable, str(tmp_path / "w.py"), "--world-size", "2"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[4, 4]"
    hidden = tmp_path / "hidden" / "parlab"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('the course is not installed here')\n")
    run = subprocess.run([sys.executable, str(tmp_path / "w.py")], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(hidden.parent)))
    assert run.returncode == 1 and "needs the course's package parlab: pip install -e ." in run.stderr, run.stderr


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
    assert run.stdout.strip().splitlines()[-1] == "3.0"  # 1 + 2 on 2 ranks, printed by rank 0
    assert "import parlab" not in script.read_text()  # chapter 00's total needs torch alone
