"""Every chapter notebook: committed clean, follows the skeleton, links resolve, runs with its default
parameters, and (where CI runs them) with its CI parameters, which keep every check alive.

``parlab run``'s own code (:mod:`parlab.course.chapters`) runs each chapter with its default parameters, as a
learner does. With ``PARLAB_CI_RUNS=1`` (GitHub's ``cpu-ci-parameters`` job sets it)
it also runs the smaller parameters stored in its metadata (``metadata.parlab.ci_parameters``). Both runs
record which checks (``assert`` statements, ``assert_close``-style calls) they reach, and
``test_ci_parameters_keep_every_assert_alive`` fails when the CI parameters skip one the defaults run
(docs/course_design.md, "CI parameters keep every check alive"). Without the variable the CI-parameter runs
of chapters whose CI parameters differ from their defaults are skipped, with the reason: on the 2-core CPU
machine they mostly repeated the default run at 2 ranks instead of 4, a quarter of the suite's time
(docs/ci.md). nbval still works on its own: ``python -m pytest notebooks/00_welcome.ipynb``
(pyproject.toml's addopts make it ``--nbval-lax``). Whatever ``notebooks/NN_*.ipynb`` exist are checked: a
new chapter joins by being there.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest

from parlab.course import chapters as course, reading
ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob(course.CHAPTER_GLOB))
SKELETON = ("Overview", "Prerequisites", "Parameters", "Exercises", "Summary", "Further reading")
# Markdown files whose relative links must resolve too (the course map, the workshop guide).
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one code cell must be tagged 'parameters'"
    return cells[0]


def _markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _section_at(nb, heading: str) -> int | None:
    """Index of the first markdown cell that opens ``heading`` (``## Heading`` or a bold ``**Heading.**``)."""
    pattern = re.compile(rf"^(#+ {re.escape(heading)}\s*$|\*\*{re.escape(heading)}\.\*\*)", re.M)
    return next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and pattern.search(c.source)),
                None)


def _anchors(path: pathlib.Path) -> set[str]:
    text = _markdown(nbformat.read(path, as_version=4)) if path.suffix == ".ipynb" else path.read_text()
    headings = {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*?)\s*$", text, re.M)}
    return headings | {_slug(m.group(1)) for m in re.finditer(r'<a id="([^"]+)"></a>', text)}  # an edition's


def _slug(text: str) -> str:
    """JupyterLab and GitHub spell a heading's anchor differently; compare letters and digits only."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _without_code(text: str) -> str:
    """Markdown without its fenced code blocks and inline code: a link written there is an example."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


def _broken_links(text: str, base: pathlib.Path, own: pathlib.Path) -> list[str]:
    broken = []
    for m in LINK.finditer(_without_code(text)):
        target = m.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file, _, anchor = target.partition("#")
        path = (base / file).resolve() if file else own
        if not path.exists():
            broken.append(f"{m.group(0)}: no file {path}")
        elif anchor and path.suffix in (".ipynb", ".md") and _slug(anchor) not in _anchors(path):
            broken.append(f"{m.group(0)}: no heading #{anchor} in {path.name}")
    return broken


# -- committed clean, and the skeleton --------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, (f"{path.name}: cells {dirty} carry outputs or execution counts; strip them with "
                       f"`jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_and_ci_parameters(path):
    nb = nbformat.read(path, as_version=4)
    cell = _parameters_cell(nb)
    body = ast.parse(cell.source).body
    # papermill injects the CI values as a cell of assignments after this one: anything else here (an
    # import, a computed value) would use the defaults, not the injected values.
    assert all(isinstance(n, ast.Assign) for n in body), f"{path.name}: the parameters cell holds only assignments"
    names = {t.id for n in body for t in n.targets if isinstance(t, ast.Name)}
    assert "world_size" in names, f"{path.name}: the parameters cell sets no world_size"
    ci = course.ci_parameters(nb)
    assert ci, f"{path.name}: no CI parameters in metadata.parlab.ci_parameters"
    assert set(ci) <= names, f"{path.name}: CI parameters {sorted(set(ci) - names)} are not in the parameters cell"
    assert ci.get("world_size", 2) >= 2, f"{path.name}: CI runs with at least 2 ranks (it tests parallelism)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_follows_the_skeleton(path):
    nb = nbformat.read(path, as_version=4)
    at = {h: _section_at(nb, h) for h in SKELETON}
    missing = [h for h, i in at.items() if i is None]
    assert not missing, f"{path.name}: no {', '.join(repr(h) for h in missing)} section"
    order = sorted(SKELETON, key=at.get)
    assert order == list(SKELETON), f"{path.name}: sections in the order {order}, expected {list(SKELETON)}"
    cell = nb.cells.index(_parameters_cell(nb))
    assert at["Parameters"] < cell < at["Exercises"], f"{path.name}: the parameters cell is not under Parameters"
    numbered = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and re.search(r"^## \d", c.source, re.M)]
    assert numbered and at["Parameters"] < numbered[0] and numbered[-1] < at["Exercises"], (
        f"{path.name}: the numbered sections (## 1. ...) belong between Parameters and Exercises")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_solutions_are_collapsed_and_only_define(path):
    """A solution (a code cell tagged ``solution``) is collapsed until the learner opens it, and only
    defines: the chapter's checks run the learner's code, never the solution (docs/course_design.md, 5)."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if "solution" not in cell.metadata.get("tags", []):
            continue
        assert cell.cell_type == "code", f"{path.name}: cell {i} is tagged 'solution' but is not code"
        assert cell.metadata.get("jupyter", {}).get("source_hidden"), (
            f"{path.name}: solution cell {i} is not collapsed; set metadata.jupyter.source_hidden = true")
        doing = [ast.unparse(n).splitlines()[0] for n in ast.parse(cell.source).body
                 if not isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Assign))]
        assert not doing, f"{path.name}: solution cell {i} runs code instead of only defining: {doing}"


def test_there_are_chapters():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_welcome.ipynb"
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert len(set(numbers)) == len(numbers), f"two chapters share a number: {numbers}"


# -- links --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_links_resolve(path):
    nb = nbformat.read(path, as_version=4)
    assert _broken_links(_markdown(nb), path.parent, path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_links_resolve(path):
    assert _broken_links(path.read_text(), path.parent, path) == []


@pytest.mark.parametrize("path", NOTEBOOKS[1:], ids=lambda p: p.stem)
def test_prerequisites_link_the_chapters_they_name(path):
    """A learner who lacks a prerequisite gets there in one click: ``[Chapter 02](02_collectives.ipynb)``."""
    nb = nbformat.read(path, as_version=4)
    start, end = _section_at(nb, "Prerequisites"), _section_at(nb, "Parameters")
    text = "\n".join(c.source for c in nb.cells[start:end + 1] if c.cell_type == "markdown")
    text = text.split("## Prerequisites", 1)[-1].split("## Parameters", 1)[0]  # headings may share a cell
    linked = {m.group("target").split("#")[0] for m in LINK.finditer(text)}
    by_number = {p.name[:2]: p.name for p in NOTEBOOKS}
    for number in sorted(set(re.findall(r"[Cc]hapters? (\d\d)", text))):
        assert number in by_number, f"{path.name} names chapter {number}, which is not in notebooks/"
        assert by_number[number] in linked, (f"{path.name}: Prerequisites names chapter {number}; link it: "
                                             f"[Chapter {number}]({by_number[number]})")


@pytest.mark.parametrize("where", ["README.md", "notebooks/00_welcome.ipynb"])
def test_course_map_links_every_chapter(where):
    """The README's course map and chapter 00's both lead to every chapter there is."""
    path = ROOT / where
    text = _markdown(nbformat.read(path, as_version=4)) if path.suffix == ".ipynb" else path.read_text()
    linked = {(path.parent / m.group("target")).resolve() for m in LINK.finditer(text)}
    missing = [p.name for p in NOTEBOOKS if p.resolve() not in linked and p.resolve() != path.resolve()]
    assert not missing, f"the course map in {where} does not link {missing}"


def test_links_checker_catches_broken_links(tmp_path):
    (tmp_path / "a.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# Title\n## 2. Ranks and the world")])))
    text = ("[ok](a.ipynb) [ok](a.ipynb#2.-Ranks-and-the-world) [web](https://example.org/x) "
            "[gone](b.ipynb) [bad anchor](a.ipynb#3.-Nowhere) `[example](c.ipynb)`\n```\n[example](d.ipynb)\n```")
    broken = _broken_links(text, tmp_path, tmp_path / "c.md")
    assert [b.split(":")[0] for b in broken] == ["[gone](b.ipynb)", "[bad anchor](a.ipynb#3.-Nowhere)"]


# -- running: defaults and CI parameters, and the asserts each run reaches -------------------------------

# Chapters whose CI parameters still skip asserts that their defaults run: reported (xfail, with the asserts),
# not yet held to it. Remove yours when test_ci_parameters_keep_every_assert_alive passes for it (the test
# says so when it does). Measured on 1 Dec 2026 with the chapters as they were: 00–06 pass, 07 does not.
ASSERTS_NOT_YET: set[str] = set()

# The CI-parameter runs: on in GitHub's cpu-ci-parameters job, or when asked.
CI_RUNS = os.environ.get("PARLAB_CI_RUNS", "") == "1"
CI_RUNS_OFF = ("CI-parameter runs are the cpu-ci-parameters job's (PARLAB_CI_RUNS=1 runs them here too); on CPU "
               "they repeated the default run at fewer ranks (docs/ci.md)")

_RUNS: dict[tuple[pathlib.Path, bool], tuple[course.ChapterResult, dict]] = {}
_LEFT_BEHIND: dict[pathlib.Path, list[str]] = {}


def _ci_is_defaults(path: pathlib.Path) -> bool:
    """Whether a chapter's CI parameters are its defaults (chapter 07: most of its run is the planner's
    tables, the same with either set): its CI run would repeat its default run."""
    nb = nbformat.read(path, as_version=4)
    defaults = {}
    for node in ast.parse(_parameters_cell(nb).source).body:
        try:  # a default written as an expression (2**20) is evaluated by the kernel, not here: not comparable
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError):
            return False
        defaults.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    return all(k in defaults and defaults[k] == v for k, v in course.ci_parameters(nb).items())


def _run(path: pathlib.Path, ci: bool, tmp_path_factory) -> tuple[course.ChapterResult, dict]:
    """Each chapter runs once per session with each set of parameters, recording its asserts; the tests
    below share the runs (run alone, the assert test makes both). Where the CI parameters are the
    defaults, the one run serves both. Chapter 00's CI run (its default run where CI runs are off) has its
    kernel working in the repository's top folder, as papermill or nbconvert started there run it
    (``_LEFT_BEHIND``: what it left in the checkout)."""
    if ci and (path, ci) not in _RUNS and _ci_is_defaults(path):
        _RUNS[path, ci] = _run(path, False, tmp_path_factory)
    if ci and (path, ci) not in _RUNS and not CI_RUNS and path in NOTEBOOKS:
        pytest.skip(CI_RUNS_OFF)
    if (path, ci) not in _RUNS:
        out = tmp_path_factory.mktemp(f"{path.stem}-{'ci' if ci else 'defaults'}")
        from_top = (ci or not CI_RUNS) and path == NOTEBOOKS[0]
        before = _checkout_status() if from_top else set()
        result = course.run_chapter(path, out, ci=ci, html=False, record_asserts=out / "asserts.jsonl",
                                    cwd=ROOT if from_top else None)
        if from_top:
            _LEFT_BEHIND[path] = sorted(_checkout_status() - before)
        _RUNS[path, ci] = result, course.recorded_asserts(out / "asserts.jsonl")
        if path in NOTEBOOKS:  # a course chapter, not a test's synthetic one
            _record_run_time(path.stem, "ci" if ci else "defaults", result)
    return _RUNS[path, ci]


def _record_run_time(chapter: str, which: str, result) -> None:
    """What this run took, into ``artifacts/run_times.json``: ``parlab times --measured`` takes it in. Only a
    run with the machine to itself is a learner's time: under ``./lab test``'s two workers a chapter runs
    beside other tests, so nothing is recorded (``./lab test -n 0 -m slow tests/test_notebooks.py`` runs
    the chapters one at a time and records them)."""
    if not result.passed or int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        return
    out = ROOT / "artifacts" / "run_times.json"
    out.parent.mkdir(exist_ok=True)
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault(chapter, {})[which] = round(result.seconds, 1)
    out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_with_default_parameters(path, tmp_path_factory):
    result, _ = _run(path, False, tmp_path_factory)
    assert result.passed, f"{path.name}: {result.error} (executed copy: {result.output})"


# Chapters on the learner's pattern: each numbered section opens with a picture of its mechanism (issue #42;
# tests/test_reading.py holds the same chapters to sentences read at speed).
PICTURED = {"00_welcome", "01_memory_and_strategy", "02_collectives", "03_dp_vs_ddp", "04_zero", "05_tensor_parallel", "06_pipeline_parallel", "08_your_own_job", "10_context_and_expert_parallelism", "07_putting_it_together", "09_trainer_and_debugging"}


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem in PICTURED], ids=lambda p: p.stem)
def test_every_section_opens_with_a_picture(path, tmp_path_factory):
    result, _ = _run(path, False, tmp_path_factory)
    assert result.passed, f"{path.name}: {result.error}"
    missing = reading.sections_without_a_picture(result.output)
    assert not missing, f"{path.name}: no picture among the outputs of the first code cells of {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_with_ci_parameters(path, tmp_path_factory):
    result, _ = _run(path, True, tmp_path_factory)
    assert result.passed, f"{path.name}: {result.error} (executed copy: {result.output})"


def _assert_coverage(path: pathlib.Path, tmp_path_factory) -> list[str]:
    """What is wrong with ``path``'s CI parameters: a failed run, or the asserts they skip."""
    (defaults, seen_defaults), (ci, seen_ci) = _run(path, False, tmp_path_factory), _run(path, True, tmp_path_factory)
    failed = [f"its run with {name} parameters failed ({r.error}), so they cannot be compared"
              for name, r in (("default", defaults), ("CI", ci)) if not r.passed]
    if failed:
        return failed
    nb = nbformat.read(path, as_version=4)
    return course.skipped_asserts(nb, seen_defaults, seen_ci)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_ci_parameters_keep_every_assert_alive(path, tmp_path_factory):
    """No assert that runs with a chapter's default parameters is skipped with its CI parameters: CI
    checks what a learner's run checks (no ``if world_size >= 4:`` around an assert that CI's 2 ranks
    then never reach)."""
    problems = _assert_coverage(path, tmp_path_factory)
    ci = course.ci_parameters(nbformat.read(path, as_version=4))
    message = (f"{path.name}: with its CI parameters {ci}, these asserts that its default parameters run "
               f"are skipped (make the CI parameters reach them):\n  " + "\n  ".join(problems))
    if path.stem in ASSERTS_NOT_YET:
        assert problems, f"{path.name} keeps every assert alive now: remove it from ASSERTS_NOT_YET"
        pytest.xfail(message)
    assert not problems, message


@pytest.mark.slow
def test_assert_coverage_catches_a_skipped_assert(tmp_path, tmp_path_factory):
    """The test above can fail: a chapter whose CI parameters skip one assert (in a cell, in a function
    run on the ranks, in a function defined in a cell) is caught, and that assert, only, is named. It runs
    where the test above compares runs (PARLAB_CI_RUNS=1)."""
    if not CI_RUNS:
        pytest.skip(CI_RUNS_OFF)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook(metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "parlab": {"ci_parameters": {"world_size": 2}}})
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        "world_size = 4",
        "import parlab, torch\nassert world_size >= 2",
        "def on_rank():\n    if parlab.world_size() >= 4:\n        assert parlab.world_size() % 4 == 0\n"
        "    assert parlab.rank() < parlab.world_size()\n\nparlab.launch(on_rank, world_size)",
        "def check(n):\n    assert n > 0\n    if n >= 4:\n        assert n // 4 >= 1, n\n\ncheck(world_size)",
        "for _ in range(3):\n    assert True\nif world_size >= 4:\n    assert world_size == 4\n"
        "    torch.testing.assert_close(torch.ones(world_size), torch.ones(4))\nprint('done')",
    )]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, folder / "98_guarded.ipynb")
    _RUNS.pop((folder / "98_guarded.ipynb", False), None)
    problems = _assert_coverage(folder / "98_guarded.ipynb", tmp_path_factory)
    assert problems == ["cell 2, line 3: assert parlab.world_size() % 4 == 0",
                        "cell 3, line 4: assert n // 4 >= 1",
                        "cell 4, line 4: assert world_size == 4",
                        "cell 4, line 5: torch.testing.assert_close(torch.ones(world_size), torch.ones(4))"], problems
    seen = _RUNS[folder / "98_guarded.ipynb", True][1]
    # every other check was recorded in the CI run, the rank's included (world_size 2 there)
    assert sorted((r["check"] for r in seen.values())) == sorted([
        "assert world_size >= 2", "assert parlab.rank() < parlab.world_size()", "assert n > 0", "assert True"])


# What every chapter does with what a machine shares (its kernel's channels, the launcher's rendezvous, a
# rank that fails): a workshop's learners meet these at the same moment, whatever chapter each runs.
WORKSHOP_CELLS = [
    "import parlab\n%load_ext parlab",
    "def total(x):\n    import torch, torch.distributed as dist\n    t = torch.tensor([float(x + parlab.rank())])\n"
    "    dist.all_reduce(t)\n    return t.item()\n\nassert parlab.launch(total, 2, args=(1,), announce=False) == [3.0, 3.0]",
    "%%ranks -n 2\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(parlab.rank(), t.item())",
    "def fails():\n    if parlab.rank() == 1:\n        raise ValueError('rank 1 fails')\n\ntry:\n"
    "    parlab.launch(fails, 2, announce=False)\nexcept Exception as exc:\n    assert 'rank 1' in str(exc), exc\n"
    "else:\n    raise AssertionError('no error')",
]


@pytest.mark.slow
def test_eight_headless_chapters_at_once(tmp_path):
    """A workshop box: 8 learners run a chapter (2 ranks each) at the same moment. No fixed port and no
    shared state, so none collides with another (the kernels' channels are Unix sockets: with TCP, one
    kernel in a few such runs died on a port another had just picked). Each runs a small chapter of what
    every chapter does with what the machine shares: a launch with a collective, a ``%%ranks`` cell, a rank
    that fails (the whole chapter 00 eight times took about 1.5 minutes of the suite for the same
    collisions)."""
    chapters = tmp_path / "notebooks"
    chapters.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in WORKSHOP_CELLS])
    nb.cells.insert(0, nbformat.v4.new_code_cell("world_size = 2"))
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["parlab"] = {"ci_parameters": {"world_size": 2}}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, chapters / "00_workshop.ipynb")
    logs = [open(tmp_path / f"learner{i}.log", "w") for i in range(8)]
    runs = [subprocess.Popen([sys.executable, "-m", "parlab", "run", "--ci", "--notebooks", str(chapters),
                              "--no-html", "--output", str(tmp_path / f"learner{i}")], cwd=tmp_path, stdout=log,
                             stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
    for run, log in zip(runs, logs):
        run.wait(timeout=800)
        log.close()
    for i, run in enumerate(runs):
        out = (tmp_path / f"learner{i}.log").read_text()
        assert run.returncode == 0, f"learner {i}:\n{out[-3000:]}"
        assert "| 00_workshop | passed " in out and (tmp_path / f"learner{i}" / "00_workshop.ipynb").exists()
        executed = nbformat.read(tmp_path / f"learner{i}" / "00_workshop.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in executed.cells if c.source.startswith("%%ranks")
                          for o in c.outputs)
        assert "[rank 0] 0 2.0" in printed and "[rank 1] 1 2.0" in printed, f"learner {i}: the %%ranks cell printed {printed!r}"


def _checkout_status() -> set[str]:
    """``git status --porcelain`` of the checkout, one line per changed or new (not ignored) file."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return set(out.splitlines())


def _library_warnings(nb) -> list[str]:
    """Every stderr output of an executed notebook that carries a ``…Warning`` (a library's warnings.warn)."""
    return [f"cell {i}: {out.text.strip()[:300]}" for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("name") == "stderr" and "Warning" in out.get("text", "")]


@pytest.mark.slow
# named by the chapter: under ./lab test it goes to the worker that has chapter 00's run (tests/conftest.py)
@pytest.mark.parametrize("chapter", NOTEBOOKS[:1], ids=lambda p: p.stem)
def test_a_chapter_run_from_the_top_folder_leaves_nothing_behind(chapter, tmp_path_factory):
    """Chapter 00, its kernel working in the repository's top folder (as papermill or nbconvert started there
    run it, not in notebooks/): it leaves no new file in the checkout (a ``%%writefile`` into the working
    folder would) and prints no library warning. It is the suite's own run of chapter 00 (``_run``: the CI
    run where CI runs are on, else the default run), not one more."""
    result, _ = _run(chapter, CI_RUNS, tmp_path_factory)
    assert result.passed, f"{chapter.name} from {ROOT}: {result.error} (executed copy: {result.output})"
    left = _LEFT_BEHIND[chapter]
    assert not left, f"{chapter.name}, run from the top folder, left in the checkout:\n  " + "\n  ".join(left)
    warnings = _library_warnings(nbformat.read(result.output, as_version=4))
    assert not warnings, f"{chapter.name} printed library warnings:\n  " + "\n  ".join(warnings)


def test_library_warnings_are_found_in_stderr():
    """The check above can fail: a FutureWarning in a stderr output is found, a stdout line naming one is not."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="a Warning, printed\n"),
                           nbformat.v4.new_output("stream", name="stderr",
                                                  text="ch04.py:32: FutureWarning: reduce_scatter_tensor\n")]
    assert _library_warnings(nb) == ["cell 0: ch04.py:32: FutureWarning: reduce_scatter_tensor"]
