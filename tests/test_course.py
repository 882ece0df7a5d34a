"""`parlab run`: chapters run headless in their own folder, with CI or default parameters; a table at the end,
executed notebooks and HTML in --output, and a non-zero exit when a chapter fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import nbformat
import pytest

from parlab.course import chapters as course
from parlab.course.export import export_function
from parlab.lab.launch import lease


def _chapter(folder, name, *cells, ci=None):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}")]
    for source in cells:
        cell = nbformat.v4.new_code_cell(source)
        if source.startswith("world_size ="):
            cell.metadata["tags"] = ["parameters"]
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if ci is not None:
        nb.metadata["parlab"] = {"ci_parameters": ci}
    nbformat.write(nb, folder / f"{name}.ipynb")


@pytest.fixture
def small_course(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "beside.txt").write_text("found")
    _chapter(folder, "00_here", "world_size = 4",
             # JupyterLab runs a notebook in its own folder; so must the runner, wherever it was started.
             f"import os\nassert os.getcwd() == {str(folder)!r}, os.getcwd()\nassert open('beside.txt').read() == 'found'",
             "print('ranks', world_size)", ci={"world_size": 2})
    _chapter(folder, "01_broken", "world_size = 4", "x = 1", "1 / 0", "print('never')", ci={"world_size": 2})
    _chapter(folder, "02_fine", "world_size = 4", "assert world_size == 2, world_size", ci={"world_size": 2})
    return folder


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "parlab", "run", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.slow
def test_runs_every_chapter_reports_a_table_and_fails_on_a_failure(small_course, tmp_path):
    elsewhere = tmp_path / "elsewhere"  # not the notebooks' folder: each chapter still runs in its own
    elsewhere.mkdir()
    out = tmp_path / "out"
    run = _run("--notebooks", str(small_course), "--ci", "--output", str(out), cwd=elsewhere)
    assert run.returncode == 1, run.stdout + run.stderr
    rows = [line.split("|")[1:3] for line in run.stdout.splitlines() if line.startswith("| 0")]
    assert [(c.strip(), s.strip()) for c, s in rows] == [("00_here", "passed"), ("01_broken", "FAILED"),
                                                         ("02_fine", "passed")]
    assert "01_broken: In [4]: ZeroDivisionError: division by zero" in run.stdout
    assert "| total" in run.stdout and "2/3 passed" in run.stdout
    for name in ("00_here", "01_broken", "02_fine"):
        assert (out / f"{name}.ipynb").exists() and (out / f"{name}.html").exists()
    executed = nbformat.read(out / "00_here.ipynb", as_version=4)
    assert "ranks 2" in "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    broken = nbformat.read(out / "01_broken.ipynb", as_version=4)  # the failing cell, with its traceback
    assert any(o.get("ename") == "ZeroDivisionError" for c in broken.cells for o in c.get("outputs", []))
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["chapter"], s["passed"]) for s in summary] == [("00_here", True), ("01_broken", False),
                                                              ("02_fine", True)]


@pytest.mark.slow
def test_default_parameters_and_a_selection(small_course, tmp_path):
    out = tmp_path / "out"
    run = _run("--notebooks", str(small_course), "--chapters", "2", "00", "--no-html", "--output", str(out),
               cwd=tmp_path)
    # without --ci, chapter 02 runs with its default world_size = 4 and its assert fails
    assert run.returncode == 1, run.stdout + run.stderr
    assert "02_fine: In [2]: AssertionError: 4" in run.stdout
    assert sorted(p.name for p in out.iterdir()) == ["00_here.ipynb", "02_fine.ipynb", "summary.json"]


def test_an_unknown_chapter_is_named_with_the_ones_there(small_course, tmp_path):
    with pytest.raises(ValueError, match=r"chapters: no chapter '7' in .*; there are 00_here, 01_broken, 02_fine"):
        course.chapters(["7"], small_course)
    assert [p.stem for p in course.chapters(["01_broken.ipynb", "0"], small_course)] == ["00_here", "01_broken"]
    run = _run("--notebooks", str(small_course), "--chapters", "9", cwd=tmp_path)
    assert run.returncode == 2 and "no chapter '9'" in run.stderr


def test_an_empty_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no chapters"):
        course.chapters(None, tmp_path)


def test_the_course_folder_is_found_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (course.notebooks_dir() / "00_welcome.ipynb").exists()
    assert course.chapters()[0].name == "00_welcome.ipynb"


def test_require_gpu_reads_every_launch_of_a_chapter(tmp_path):
    """Every launch counts, not only the parameters cell's world_size: a 4-GPU runner runs the 2- and 4-rank
    launches on GPUs and reports the 8-rank ones; a launch that fits but ran on CPU fails the chapter."""
    log = tmp_path / "launches.jsonl"
    rows = [(2, "auto", "cuda", "", 4, "parlab.launch"), (4, "auto", "cuda", "", 4, "parlab.launch"),
            (8, "auto", "cpu", "4 GPU(s) visible, NCCL needs one per rank: running on CPU instead", 4, "parlab.launch"),
            (8, "auto", "cpu", "4 GPU(s) visible, NCCL needs one per rank: running on CPU instead", 4, "parlab.launch"),
            (2, "gloo", "cpu", "", 4, "parlab.launch"), (3, "auto", "cuda", "", 4, "torchrun")]
    log.write_text("".join(json.dumps(dict(zip(("world_size", "backend", "device_type", "note", "gpus", "via"), r)))
                           + "\n" for r in rows))
    assert course.gpu_launches(log, 4) == ("", "on CPU: parlab.launch of 8 ranks (needs 8 GPUs) ×2; "
                                               "parlab.launch of 2 ranks (backend='gloo' asked)")
    with log.open("a") as f:  # a torchrun cell whose kernel saw no GPU
        f.write(json.dumps({"world_size": 3, "backend": "auto", "device_type": "cpu", "note": "", "gpus": 0,
                            "via": "torchrun"}) + "\n")
    wrong, _ = course.gpu_launches(log, 4)
    assert wrong == "torchrun of 3 rank(s) ran on CPU, though 4 GPU(s) are here (the kernel saw 0 GPU(s))"


@pytest.mark.slow
def test_require_gpu_runs_a_chapter_and_checks_its_launches(small_course, tmp_path, monkeypatch):
    _chapter(small_course, "03_launches", "world_size = 4",
             "import parlab\nparlab.launch(lambda: 0, world_size, announce=False)\n"
             "parlab.launch(lambda: 0, 1, backend='gloo', announce=False)", ci={"world_size": 2})
    chapter = small_course / "03_launches.ipynb"
    result = course.run_chapter(chapter, tmp_path, ci=True, html=False, require_gpu=True)
    assert not result.passed and result.seconds == 0.0
    assert result.error.startswith("not run: --require-gpu, but no GPU is visible here")
    monkeypatch.delenv("PARLAB_GPUS", raising=False)
    monkeypatch.setattr(lease, "_torch_device_count", lambda: 1)  # a 1-GPU runner, as far as the course can tell
    result = course.run_chapter(chapter, tmp_path, ci=True, html=False, require_gpu=True)
    assert result.passed, result.error  # 2 ranks do not fit one GPU: reported, not failed
    assert result.on_cpu == "on CPU: parlab.launch of 2 ranks (needs 2 GPUs); parlab.launch of 1 ranks (backend='gloo' asked)"
    monkeypatch.setattr(lease, "_torch_device_count", lambda: 4)  # the kernel still sees none: that is wrong
    result = course.run_chapter(chapter, tmp_path, ci=True, html=False, require_gpu=True)
    assert not result.passed
    assert result.error == "parlab.launch of 2 rank(s) ran on CPU, though 4 GPU(s) are here (the kernel saw 0 GPU(s))"


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no Unix sockets for the kernel: TCP there")
def test_the_kernel_listens_on_no_tcp_port(tmp_path):
    """jupyter_client picks a kernel's TCP ports by binding and releasing them, so kernels started together
    by several processes can pick the same port and one dies. The runner's kernel has no port to pick: its
    channels are Unix sockets in a private folder, removed when the chapter ends."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _chapter(folder, "00_sockets", "world_size = 2",
             "import json, os, stat\nfrom ipykernel import get_connection_info\n"
             "info = json.loads(get_connection_info())\n"
             "assert info['transport'] == 'ipc', info\n"
             "assert stat.S_IMODE(os.stat(os.path.dirname(info['ip'])).st_mode) == 0o700\n"
             "print(info['ip'])")
    result = course.run_chapter(folder / "00_sockets.ipynb", tmp_path / "out", html=False)
    assert result.passed, result.error
    printed = nbformat.read(result.output, as_version=4).cells[-1].outputs[0]["text"].strip()
    assert printed.startswith(tempfile.gettempdir()) and not os.path.exists(os.path.dirname(printed))


def test_export_finds_a_chapter_from_any_folder(tmp_path, monkeypatch):
    # Chapter 00 exports one of its own functions by file name; that works wherever its kernel started.
    monkeypatch.chdir(tmp_path)
    assert "def total():" in export_function("00_welcome.ipynb", "total", script="total.py")
    with pytest.raises(FileNotFoundError, match=r"'nowhere.ipynb': no such file in the working folder .*--cwd"):
        export_function("nowhere.ipynb", "total")
    assert os.getcwd() == str(tmp_path)


@pytest.mark.slow
def test_an_interrupt_stops_the_run_and_still_shows_the_table(tmp_path):
    _chapter(tmp_path, "00_slow", "world_size = 2", "import time\ntime.sleep(600)")
    _chapter(tmp_path, "01_after", "world_size = 2")
    run = subprocess.Popen([sys.executable, "-m", "parlab", "run", "--notebooks", str(tmp_path), "--no-html",
                            "--output", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, cwd=tmp_path)
    assert run.stdout.readline().startswith("parlab run: 2 chapter(s)")
    assert run.stdout.readline().strip() == "[1/2] 00_slow ..."  # it has begun the chapter
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 1
    assert "| 00_slow | FAILED |" in out.replace("  ", "") and "00_slow: interrupted" in out
    assert "01_after" not in out
