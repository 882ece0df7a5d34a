"""``parlab run``: run the course's chapters headless, as CI and an instructor checking a machine do.

Each chapter is executed top to bottom by papermill in a fresh kernel, in the chapter's own folder (as
JupyterLab runs it, so a chapter finds the files beside it wherever ``parlab run`` is started), with
either its default parameters or, with ``ci=True``, the smaller ones stored in its metadata
(``metadata.parlab.ci_parameters``). The executed notebook, and an HTML copy, go to an output folder;
a failing chapter's copy shows the failing cell and its traceback. Whatever ``NN_*.ipynb`` files the
notebooks folder holds are the course: a new chapter joins by being there.

The kernel talks to ``parlab run`` over Unix sockets in a private temporary folder, not TCP ports (where
the platform has them: not on Windows). jupyter_client picks a kernel's five TCP ports by binding and
releasing them before the kernel binds them again, so kernels started at the same moment by several
processes (a workshop's learners, CI running chapters side by side) can pick the same port, and one of
them dies before it answers ("Address already in use"); sockets in a folder of their own cannot collide,
and no other user on the machine can connect to them.

``record_asserts=PATH`` makes a run note every check (an ``assert``, a ``torch.testing.assert_close(...)``) it reaches, in cells and in functions
defined in cells, on the ranks too (:func:`record_asserts`): tests/test_notebooks.py runs each chapter
with its defaults and its CI parameters and fails when an assert the defaults reach is skipped by the CI
parameters (docs/course_design.md, "CI parameters keep every check alive").
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from unittest import mock

import nbformat

CHAPTER_GLOB = "[0-9][0-9]_*.ipynb"


def notebooks_dir() -> pathlib.Path:
    """The course's ``notebooks/`` folder: in the current folder when there is one (a checkout's top
    folder), else beside the installed package (an editable install, as ``./lab`` and Binder make)."""
    here = pathlib.Path.cwd() / "notebooks"
    if any(here.glob(CHAPTER_GLOB)):
        return here
    return pathlib.Path(__file__).resolve().parents[3] / "notebooks"


def chapters(selection=None, folder=None) -> list[pathlib.Path]:
    """The chapter notebooks in ``folder``, in order; ``selection`` picks some by number (``"03"``, ``3``)
    or name (``"03_dp_vs_ddp"``, ``"03_dp_vs_ddp.ipynb"``)."""
    folder = pathlib.Path(folder) if folder is not None else notebooks_dir()
    found = sorted(folder.glob(CHAPTER_GLOB))
    if not found:
        raise FileNotFoundError(f"no chapters (files named {CHAPTER_GLOB}) in {folder}")
    if not selection:
        return found
    picked = []
    for want in selection:
        key = str(want)
        key = f"{int(key):02d}" if key.isdigit() else key.removesuffix(".ipynb")
        match = [p for p in found if p.stem == key or p.stem.split("_", 1)[0] == key]
        if not match:
            raise ValueError(f"chapters: no chapter {want!r} in {folder}; there are "
                             f"{', '.join(p.stem for p in found)}")
        picked += [p for p in match if p not in picked]
    return sorted(picked)


def ci_parameters(notebook: nbformat.NotebookNode) -> dict:
    """The smaller parameters CI runs a chapter with (``metadata.parlab.ci_parameters``)."""
    return dict(notebook.metadata.get("parlab", {}).get("ci_parameters", {}))


def world_size(notebook: nbformat.NotebookNode, parameters: dict) -> int | None:
    """The ``world_size`` a chapter runs with: the injected one, else its parameters cell's."""
    if "world_size" in parameters:
        return parameters["world_size"]
    for cell in notebook.cells:
        if "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "world_size" for t in node.targets):
                    return ast.literal_eval(node.value)
    return None


@dataclass
class ChapterResult:
    chapter: str  # the notebook's stem, e.g. "00_welcome"
    passed: bool
    seconds: float
    error: str = ""  # what failed: the cell (In [N] of the executed copy) and its exception's first line
    output: pathlib.Path | None = None  # the executed notebook
    on_cpu: str = ""  # --require-gpu: the launches that ran on CPU and why (reported, not a failure)


def run_chapter(path, output_dir, *, ci: bool = False, html: bool = True, cell_timeout: float = 600,
                progress: bool | dict = False, require_gpu: bool = False, record_asserts=None,
                cwd=None) -> ChapterResult:
    """Execute one chapter in its own folder, or with ``cwd`` as the kernel's working folder (as papermill or
    nbconvert run from the top folder do); write the executed notebook (and HTML) to ``output_dir``.

    Never raises for a failing chapter: the result says what failed. ``require_gpu`` (GPU runners): every
    launch the chapter makes (``parlab.launch`` and its ``torchrun`` cells, each world size, resumes too)
    is recorded; one that fits this machine's GPUs (world_size <= GPUs) but ran on CPU fails the chapter,
    so a GPU runner cannot pass by quietly falling back to CPU; one that does not fit runs on CPU and is
    reported in ``on_cpu``, with why. With no GPU visible at all the chapter fails without running.
    ``record_asserts``: a file that the run fills
    with the asserts it reaches (:func:`record_asserts`; a first cell, tagged ``parlab-record-asserts``,
    turns the recording on, so the executed copy shows it).
    """
    path = pathlib.Path(path).resolve()
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / path.name
    notebook = nbformat.read(path, as_version=4)
    parameters = ci_parameters(notebook) if ci else {}
    start = time.monotonic()
    launch_log = None
    if require_gpu:
        from parlab.lab.launch.plan import LAUNCH_LOG, visible_gpus

        gpus = visible_gpus()
        if not gpus:
            return ChapterResult(path.stem, False, 0.0, "not run: --require-gpu, but no GPU is visible here "
                                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        launch_log = output_dir / f"{path.stem}.launches.jsonl"
        launch_log.write_text("")
        os.environ[LAUNCH_LOG] = str(launch_log.resolve())  # the kernel inherits it
    source = _recording_asserts(notebook, record_asserts) if record_asserts is not None else str(path)
    lang = notebook.metadata.get("parlab", {}).get("edition")  # an edition's kernel knows it (edition.language)
    try:
        with mock.patch.dict(os.environ, {"PARLAB_LANG": lang} if lang else {}):
            error = _execute(source, out, parameters, pathlib.Path(cwd).resolve() if cwd is not None else path.parent,
                             progress, cell_timeout)
    finally:
        if launch_log is not None:
            os.environ.pop(LAUNCH_LOG, None)
    seconds = time.monotonic() - start
    if html and out.exists():
        _write_html(out)
    on_cpu = ""
    if launch_log is not None:
        wrong, on_cpu = gpu_launches(launch_log, gpus)
        error = error or wrong
    if not error and out.exists():
        on_cpu = "; ".join(filter(None, (on_cpu, needs_real_gpu(out))))
    return ChapterResult(path.stem, not error, seconds, error, out if out.exists() else None, on_cpu)


def _recording_asserts(notebook, record_asserts):
    """``notebook`` with a first cell, tagged ``parlab-record-asserts``, that records the asserts it reaches
    into the file ``record_asserts`` (emptied now)."""
    record_path = pathlib.Path(record_asserts).resolve()
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text("")
    cell = nbformat.v4.new_code_cell(
        f"import parlab.course.chapters\nparlab.course.chapters.record_asserts(get_ipython(), {str(record_path)!r})")
    cell.metadata["tags"] = [RECORD_TAG]
    notebook.cells.insert(0, cell)
    return notebook


def _execute(source, out: pathlib.Path, parameters: dict, cwd: pathlib.Path, progress, cell_timeout: float) -> str:
    """Run ``source`` (a path or a notebook) with papermill into ``out``; "" or what failed, in one line."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from parlab.lab.launch import simgpu

    # Simulated GPUs: a cell that asks what only a real GPU answers stops there, and the run goes on.
    allowed = {"allow_error_names": ["NeedsRealGPU"]} if simgpu.active() else {}
    try:
        with _kernel_sockets() as channels:
            papermill.execute_notebook(
                source, str(out), parameters=parameters, kernel_name="python3", cwd=str(cwd),
                progress_bar=progress, execution_timeout=cell_timeout, **channels, **allowed,
            )
    except PapermillExecutionError as exc:
        if allowed and not _errors_other_than(out, "NeedsRealGPU"):
            return ""
        # In [N] as the executed copy shows it (papermill's injected parameters are a cell there too)
        return f"In [{exc.exec_count}]: {exc.ename}: {_first_line(exc.evalue)}"
    except Exception as exc:  # noqa: BLE001 - a dead kernel, a cell timeout: reported as the chapter's failure
        return f"{type(exc).__name__}: {_first_line(str(exc))}"
    return ""


def _errors_other_than(notebook_path, name: str) -> list[str]:
    """The names of the errors an executed notebook shows, other than ``name``."""
    cells = nbformat.read(notebook_path, as_version=4).cells
    return [o.ename for c in cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type == "error" and o.ename != name]


def needs_real_gpu(notebook_path) -> str:
    """Simulated GPUs: the cells that stopped where only a real GPU answers, as ``In [N]``s ("" for none)."""
    cells = nbformat.read(notebook_path, as_version=4).cells
    stops = [f"In [{c.execution_count}]" for c in cells if c.cell_type == "code"
             for o in c.get("outputs", []) if o.output_type == "error" and o.ename == "NeedsRealGPU"]
    return f"needs a real GPU: {', '.join(stops)}" if stops else ""


def gpu_launches(log, gpus: int) -> tuple[str, str]:
    """From a chapter's launch records (``parlab.lab.launch.plan.record_launch``) on a machine with ``gpus``
    GPUs: (the failure: launches that fit but ran on CPU, or ""; the report: those that ran on CPU, and why)."""
    records = [json.loads(line) for line in pathlib.Path(log).read_text().splitlines() if line.strip()]
    wrong, cpu = [], {}
    for r in records:
        if r["device_type"] == "cuda":
            continue
        if r["world_size"] <= gpus and r["backend"] == "auto":
            why = r["note"] or f"the kernel saw {r['gpus']} GPU(s)"
            wrong.append(f"{r['via']} of {r['world_size']} rank(s) ran on CPU, though {gpus} GPU(s) are here ({why})")
        else:
            why = f"backend={r['backend']!r} asked" if r["backend"] != "auto" else f"needs {r['world_size']} GPUs"
            key = f"{r['via']} of {r['world_size']} ranks ({why})"
            cpu[key] = cpu.get(key, 0) + 1
    report = "; ".join(f"{k} ×{n}" if n > 1 else k for k, n in cpu.items())
    return ("; ".join(wrong), f"on CPU: {report}" if report else "")


# -- which asserts a run reaches ------------------------------------------------------------------------

RECORD_TAG = "parlab-record-asserts"
_SEEN = "__parlab_assert_seen__"  # the notebook global the rewritten asserts call


def cell_key(source: str) -> str:
    """A code cell's name in an assert record: a hash of its source (cell numbers move when papermill
    injects parameters, the sources do not)."""
    return hashlib.sha1(source.encode()).hexdigest()[:12]


def _is_check(node: ast.AST) -> bool:
    """An ``assert`` statement, or a call statement of a function named ``assert…``
    (``torch.testing.assert_close(...)``, ``np.testing.assert_allclose(...)``): the course's checks."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        f = node.value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name.startswith("assert")
    return False


def numbered_asserts(tree: ast.AST) -> list[ast.stmt]:
    """The checks of a parsed cell (:func:`_is_check`), in source order: the ``n`` of a check's record."""
    return sorted((n for n in ast.walk(tree) if _is_check(n)), key=lambda n: (n.lineno, n.col_offset))


def _check_text(node: ast.stmt, limit: int = 160) -> str:
    text = f"assert {ast.unparse(node.test)}" if isinstance(node, ast.Assert) else ast.unparse(node.value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


class _AssertSeen:
    """Appends ``{"cell", "n", "check", "line"}`` (JSON, one line) to ``path`` the first time this process
    reaches a check. A file, not a set in the kernel: checks in functions that run on ranks are reached
    in the rank processes (cloudpickle sends this object along with the function that calls it)."""

    def __init__(self, path: str):
        self.path, self.seen = path, set()

    def __call__(self, cell: str, n: int, check: str, line: int) -> None:
        if (cell, n) not in self.seen:
            self.seen.add((cell, n))
            with open(self.path, "a") as f:
                f.write(json.dumps({"cell": cell, "n": n, "check": check, "line": line}) + "\n")


class _RecordAsserts(ast.NodeTransformer):
    """IPython AST transformer: each check (``assert test, msg``; ``torch.testing.assert_close(a, b)``)
    becomes ``__parlab_assert_seen__(cell, n, text, line); <the check>``, at any depth (in functions,
    classes, loops); the cell is the one ``pre_run_cell`` announced."""

    def __init__(self):
        self.cell, self.numbers = "?", {}

    def pre_run_cell(self, info) -> None:
        self.cell = cell_key(info.raw_cell or "")

    def visit_Module(self, node):
        self.numbers = {id(a): n for n, a in enumerate(numbered_asserts(node), 1)}
        return self.generic_visit(node)

    def _record(self, node):
        self.generic_visit(node)
        n = self.numbers.get(id(node))
        if n is None:  # not a check, or one built by another transformer (not in the cell's source)
            return node
        call = ast.Expr(ast.Call(ast.Name(_SEEN, ast.Load()), [ast.Constant(self.cell), ast.Constant(n),
                                 ast.Constant(_check_text(node)), ast.Constant(node.lineno)], []))
        return [ast.fix_missing_locations(ast.copy_location(call, node)), node]

    visit_Assert = visit_Expr = _record


def record_asserts(shell, path) -> None:
    """From now on, every check (:func:`_is_check`) this IPython ``shell`` runs, in cells and in functions
    defined in them, wherever they run, is noted in ``path`` when reached. Not seen: checks in the
    package's own code (``parlab.course.exercises``' checks included), in ``%%ranks`` cells (the magic compiles
    the cell on the ranks) and in code built from strings."""
    transformer = _RecordAsserts()
    shell.user_ns[_SEEN] = _AssertSeen(str(path))
    shell.user_ns_hidden[_SEEN] = shell.user_ns[_SEEN]
    shell.events.register("pre_run_cell", transformer.pre_run_cell)
    shell.ast_transformers.append(transformer)


def recorded_asserts(path) -> dict[tuple[str, int], dict]:
    """The checks a run recorded in ``path``: ``{(cell, n): {"cell", "n", "check", "line"}}``."""
    records = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    return {(r["cell"], r["n"]): r for r in records}


def skipped_asserts(notebook: nbformat.NotebookNode, defaults: dict, ci: dict) -> list[str]:
    """The checks ``defaults`` (a default run's :func:`recorded_asserts`) reached and ``ci`` did not, each
    as ``cell N, line L: CHECK`` (N counts the chapter's cells from 0, as nbformat does)."""
    where = {cell_key(c.source): i for i, c in enumerate(notebook.cells) if c.cell_type == "code"}
    return [f"cell {where.get(r['cell'], '?')}, line {r['line']}: {r['check']}"
            for key, r in sorted(defaults.items(), key=lambda kv: (where.get(kv[0][0], -1), kv[0][1]))
            if key not in ci]


def run_course(paths, output_dir, *, ci: bool = False, html: bool = True, cell_timeout: float = 600,
               require_gpu: bool = False, show_progress: bool = True, echo=print) -> list[ChapterResult]:
    """Run the chapters one after another (each fills the machine's cores on its own), saying how each went."""
    results = []
    for i, path in enumerate(paths, 1):
        label = f"[{i}/{len(paths)}] {path.stem}"
        # tqdm turns itself off (disable=None) when stderr is not a terminal, e.g. in CI logs; the lines
        # echoed below carry the progress there.
        progress = {"desc": label, "disable": None, "leave": False} if show_progress else False
        started = time.monotonic()
        try:  # from the announcement on: an interrupt may arrive as soon as the line is out
            echo(f"{label} ...", flush=True)
            result = run_chapter(path, output_dir, ci=ci, html=html, cell_timeout=cell_timeout,
                                 progress=progress, require_gpu=require_gpu)
        except KeyboardInterrupt:  # stop here, but still show what ran
            results.append(ChapterResult(path.stem, False, time.monotonic() - started, "interrupted"))
            break
        echo(f"{label} {'passed' if result.passed else 'FAILED'} in {result.seconds:.1f} s"
             + (f": {result.error}" if result.error else "") + (f" ({result.on_cpu})" if result.on_cpu else ""),
             flush=True)
        results.append(result)
    return results


def table(results: list[ChapterResult]) -> str:
    """chapter | status | time, and the total, as a Markdown table (readable in a terminal too)."""
    rows = [(r.chapter, "passed" if r.passed else "FAILED", f"{r.seconds:.1f} s") for r in results]
    rows.append(("total", f"{sum(r.passed for r in results)}/{len(results)} passed",
                 f"{sum(r.seconds for r in results):.1f} s"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(("chapter", "status", "time"))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(("chapter", "status", "time")), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    failures = [f"{r.chapter}: {r.error}" for r in results if not r.passed]
    return "\n".join(out + ([""] + failures if failures else []))


def write_summary(results: list[ChapterResult], output_dir) -> pathlib.Path:
    """``summary.json`` beside the executed notebooks, for CI to read or keep."""
    pathlib.Path(output_dir).mkdir(parents=True, exist_ok=True)
    path = pathlib.Path(output_dir) / "summary.json"
    path.write_text(json.dumps([{"chapter": r.chapter, "passed": r.passed, "seconds": round(r.seconds, 2),
                                 "error": r.error, "on_cpu": r.on_cpu} for r in results], indent=1) + "\n")
    return path


@contextlib.contextmanager
def _kernel_sockets():
    """papermill's keyword arguments that put the kernel's channels on Unix sockets in a folder only
    this run uses (none on Windows, which keeps TCP); the folder is removed afterwards."""
    if sys.platform == "win32":
        yield {}
        return
    from traitlets.config import Config

    folder = tempfile.mkdtemp(prefix="parlab-kernel-")  # mode 0700: this user's only
    try:
        yield {"config": Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "k")}})}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write_html(notebook_path: pathlib.Path) -> None:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(notebook_path))
    notebook_path.with_suffix(".html").write_text(body, encoding="utf-8")


def _first_line(text: str) -> str:
    return (str(text).strip().splitlines() or [""])[0][:300]
