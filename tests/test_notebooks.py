"""Every chapter notebook: committed clean, follows the skeleton, and runs with its CI parameters.

nbval (configured in pyproject.toml) also runs each notebook top to bottom with its default parameters,
as a learner would. Here papermill injects the smaller parameters stored in the notebook's metadata
(``metadata.parlab.ci_parameters``) and runs it again, as CI on a GPU runner would.
"""

from __future__ import annotations

import ast
import pathlib

import nbformat
import papermill
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SKELETON = ("Overview", "Prerequisites", "Parameters", "Exercises", "Summary", "Further reading")


def _parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one code cell must be tagged 'parameters'"
    return cells[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_clean_and_follows_the_skeleton(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} carries outputs"
    names = {t.id for node in ast.parse(_parameters_cell(nb).source).body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    assert "world_size" in names
    ci = nb.metadata.get("parlab", {}).get("ci_parameters")
    assert ci and set(ci) <= names, "metadata.parlab.ci_parameters must set names of the parameters cell"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for heading in SKELETON:
        assert f"## {heading}" in text or f"**{heading}.**" in text, f"{path.name}: no '{heading}' section"


def test_there_are_chapters():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_welcome.ipynb"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_with_ci_parameters(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    papermill.execute_notebook(
        str(path), str(tmp_path / path.name), parameters=nb.metadata["parlab"]["ci_parameters"],
        kernel_name="python3", cwd=str(path.parent), progress_bar=False, execution_timeout=600,
    )
