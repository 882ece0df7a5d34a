"""A stepped picture (:func:`parlab.lab.plots.step_through`) holds its whole mechanism in the notebook it is
executed in: the cell's stored image is every step on one picture, so a headless run, an HTML export and a
notebook reopened without its kernel show all of it; in a live kernel the slider's "all steps" position is that
picture and each other position redraws the same output as one step."""

import base64
import io
import os
import pathlib

import nbformat
import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from parlab.lab.plots import steps

ROOT = pathlib.Path(__file__).parent.parent
#: one colour per step: a stored picture holds step i when it holds COLOURS[i]
COLOURS = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180)]


def coloured(i: int) -> Figure:
    """Step ``i``: a square of its own colour, its name as a title."""
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.add_patch(Rectangle((0, 0), 1, 1, color=[c / 255 for c in COLOURS[i]]))
    ax.set_title(f"step {i}")
    ax.set_axis_off()
    return fig


def colours_in(png: bytes) -> list[int]:
    """The steps whose colour covers a patch of the picture (at least 100 pixels)."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    return [i for i, c in enumerate(COLOURS) if (np.abs(pixels.astype(int) - c).sum(axis=1) < 12).sum() >= 100]


def test_the_sheet_holds_every_step_and_a_frame_one():
    stepper = steps.Stepper(coloured, [f"s{i}" for i in range(5)])
    assert colours_in(stepper.sheet()) == [0, 1, 2, 3, 4]
    for i in range(5):
        assert colours_in(stepper.frame(i)) == [i]
    big, small = Image.open(io.BytesIO(stepper.frame(0))), steps.tile(coloured(0), steps.grid(5, 3, 2)[1])
    assert big.width > 1.5 * small.width  # one step drawn large, not a tile


def test_tiles_are_the_tight_pictures_png_makes():
    a = Image.open(io.BytesIO(steps.png(coloured(1), 60)))
    b = steps.tile(coloured(1), 60)
    assert abs(a.width - b.width) <= 1 and abs(a.height - b.height) <= 1


@pytest.mark.parametrize("count, width, expected", [(7, 7.6, (3, 60)), (2, 10, (2, 60)), (22, 12, (2, 58)),
                                                    (1, 10, (1, 60)), (40, 3, (7, 60))])
def test_grid_fits_the_sheet_width(count, width, expected):
    cols, dpi = steps.grid(count, width, 4)
    assert (cols, dpi) == expected
    assert cols * width * dpi <= steps.SHEET_WIDTH and dpi >= steps.MIN_DPI


def test_bad_steps_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"steps=\[\] has no step"):
        steps.Stepper(coloured, [])
    with pytest.raises(TypeError, match="draw=3 is not callable"):
        steps.Stepper(3, 2)
    with pytest.raises(ValueError, match=r"step 5 is outside 0..4"):
        steps.Stepper(coloured, 5).frame(5)
    with pytest.raises(TypeError, match=r"draw\(0\) returned str, not a matplotlib Figure"):
        steps.Stepper(lambda i: "no", 2).sheet()


def _image(output) -> bytes:
    return base64.b64decode(output["data"]["image/png"])


@pytest.mark.slow
def test_an_executed_step_through_stores_every_step_and_its_slider_redraws_in_place(tmp_path):
    """Executed headless (nbclient, as ``parlab run`` and the chapters' tests do): the stored image is the sheet
    of all five steps; moving the slider stores step 3 alone in the same output; "all steps" brings the sheet
    back."""
    from nbclient import NotebookClient

    code = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        code(f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
             "from test_steps import coloured\nfrom parlab.lab.plots import step_through\n"
             "step_through(coloured, [f's{i}' for i in range(5)], label='step')"),
        code("from parlab.lab.plots.steps import Stepper\nstepper = Stepper(coloured, 5)\n"
             "slider = stepper.show(start=1)\n"
             "print(list(slider.options)[:2], slider.value)"),
        code("slider.value = 3"),
        code("slider.value = -1"),
    ])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    snapshots = []

    class Client(NotebookClient):  # the stored outputs after each cell, as a viewer would find them then
        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            result = await super().async_execute_cell(cell, cell_index, *args, **kwargs)
            snapshots.append([_image(o) for o in self.nb.cells[1].outputs if "image/png" in o.get("data", {})])
            return result

    Client(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    first = [o for o in nb.cells[0].outputs if "image/png" in o.get("data", {})]
    assert len(first) == 1 and colours_in(_image(first[0])) == [0, 1, 2, 3, 4], "the stored picture misses steps"
    assert "[('all steps', -1), ('0', 0)] -1" in "".join(o.get("text", "") for o in nb.cells[1].outputs)
    every = [0, 1, 2, 3, 4]
    assert [[colours_in(png) for png in shown] for shown in snapshots[1:]] == [[every], [[3]], [every]]
