"""A learner with one GPU sets ``world_size = 1``: every chapter refuses it in the first code cell after its
parameters, with one sentence that says why and what to set (``parlab.course.parameters.check_world_size``),
instead of a gloo "pair is not connected" or a ``ZeroDivisionError`` later on.

Each chapter's parameters cell and that first cell run in an IPython shell as the kernel runs them (magics
included), with ``world_size = 1`` injected between them as papermill injects parameters; the shell is one
subprocess for all chapters, so torch and the course are imported once (about 10 s for the eleven)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from parlab.course.parameters import WorldSizeError, check_world_size

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

RUN_UP_TO_THE_REFUSAL = r"""
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
shell.enable_gui = lambda gui=None: None  # %matplotlib inline: no GUI event loop to start in a plain shell
shell.showtraceback = lambda *args, **kwargs: None  # the error is reported below, not drawn
found = {}
for path in sys.argv[1:]:
    cells = json.load(open(path))["cells"]  # (nbformat's schema check would take longer than the cells)
    source = lambda cell: "".join(cell["source"])
    at = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
    first = next(c for c in cells[at + 1:] if c["cell_type"] == "code")
    shell.reset(new_session=False)
    start = time.perf_counter()
    shell.run_cell(source(cells[at]))
    shell.run_cell("world_size = 1")  # as papermill injects it, after the parameters cell
    result = shell.run_cell(source(first), silent=True)
    error = result.error_in_exec or result.error_before_exec
    found[path] = {"cell": first.get("id"), "error": type(error).__name__ if error else None,
                   "message": str(error) if error else None, "seconds": round(time.perf_counter() - start, 2)}
print("RESULT " + json.dumps(found), flush=True)
import os
os._exit(0)  # skip the interpreter's teardown (seconds, with torch and transformers loaded)
"""


@pytest.fixture(scope="module")
def refusals():
    done = subprocess.run([sys.executable, "-c", RUN_UP_TO_THE_REFUSAL, *map(str, NOTEBOOKS)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT / "notebooks")
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line, done.stdout[-3000:] + done.stderr[-3000:]
    return {pathlib.Path(p).stem: r for p, r in json.loads(line[len("RESULT "):]).items()}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chapter_refuses_one_rank_in_its_first_cell(refusals, path):
    got = refusals[path.stem]
    assert got["error"] == "WorldSizeError", (
        f"{path.name}: with world_size = 1 its first code cell after the parameters (cell {got['cell']}) raised "
        f"{got['error']}: {got['message']}; call parlab.course.parameters.check_world_size(world_size) there")
    assert got["message"].startswith("world_size=1 has no second rank") and "set world_size = 2" in got["message"]
    assert got["seconds"] < 10, f"{path.name}: {got['seconds']} s to refuse (imports before the check?)"


def test_the_refusal_is_one_sentence_that_says_what_to_set():
    with pytest.raises(WorldSizeError) as refused:
        check_world_size(1)
    message = str(refused.value)
    assert message.count(". ") == 0 and not message.endswith(".")  # one sentence, as the error's line
    assert message == ("world_size=1 has no second rank to share the work or compare with, and this chapter needs 2 "
                       "or more; set world_size = 2 in the Parameters cell: with one GPU, or none, the ranks run on "
                       "the CPU, one process each")
    assert check_world_size(2) == 2 and check_world_size(8) == 8
    with pytest.raises(WorldSizeError, match=r"world_size=0 has no ranks"):
        check_world_size(0)
    for wrong in (2.0, "2", True):
        with pytest.raises(TypeError, match=r"world_size must be an int"):
            check_world_size(wrong)
