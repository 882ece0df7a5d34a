"""A mechanism that moves in steps, shown whole and then one step at a time: :func:`step_through`.

The course's pattern (``docs/course_design.md``): a section opens with a picture of its mechanism, drawn
from the objects the next cell runs. Where the mechanism moves in steps (a ring all-reduce's 2(n−1)
steps, ZeRO-3's gather and free per block, DDP's buckets firing during backward), the cell's image output
is first one picture of every step, numbered and named (a contact sheet: :meth:`Stepper.sheet`). That PNG
is what a headless run, an HTML export, a notebook reopened without its kernel and a code host's rendering
show: the whole mechanism, not its first step. In a live kernel a slider below it starts at "all steps"
and redraws that same output in place as one step, large.
"""

from __future__ import annotations

import functools
import io
import math
from typing import Callable, Sequence

import matplotlib as mpl
from matplotlib.figure import Figure

ALL = "all steps"   # the slider's first position: the contact sheet
SHEET_WIDTH = 1400  # pixels a contact sheet aims at (a viewer scales it to its column)
SHEET_DPI = 60      # the sheet's frames are drawn at this resolution, or less where many sit side by side
MIN_DPI = 42        # below this a frame's own 9-point text stops being legible
FRAME_DPI = 100     # one step, large (the slider's other positions)
_GAP, _HEAD = 14, 24  # pixels between tiles; height of a tile's name above it
_INK, _EDGE, _MARK = (34, 34, 34), (200, 200, 200), (221, 132, 82)


def png(fig: Figure, dpi: int = FRAME_DPI) -> bytes:
    """``fig`` as PNG bytes (a plain ``Figure``: pyplot never sees it, so it is not shown twice)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def tile(fig: Figure, dpi: float):
    """``fig`` drawn once at ``dpi`` and cropped to its tight bounding box, as a PIL image: what
    ``png(fig, dpi)`` shows. The bounding box is measured before the figure is drawn (its text is laid out,
    nothing rasterized); a figure inside its canvas is drawn once on it and cropped, without
    ``bbox_inches="tight"``'s extra layout pass and the PNG's encoding and decoding; one whose text pokes out
    of its canvas (a wrapped title) is saved once with that box. A figure that pyplot manages goes through
    :func:`png`."""
    from PIL import Image

    if fig.canvas.manager is not None:
        return Image.open(io.BytesIO(png(fig, dpi))).convert("RGB")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    bbox = fig.get_tightbbox(canvas.get_renderer())
    width, height = fig.get_size_inches()
    pad = mpl.rcParams["savefig.pad_inches"]  # white around the bounding box, on the canvas or not
    if not (bbox.x0 >= -1e-6 and bbox.y0 >= -1e-6 and bbox.x1 <= width + 1e-6 and bbox.y1 <= height + 1e-6):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches=bbox.padded(pad))
        return Image.open(buf).convert("RGB")
    canvas.draw()
    left, top = (round(v * dpi) for v in (bbox.x0 - pad, height - bbox.y1 - pad))
    right, bottom = (round(v * dpi) for v in (bbox.x1 + pad, height - bbox.y0 + pad))
    image = Image.frombuffer("RGBA", canvas.get_width_height(physical=True), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    out = Image.new("RGBA", (right - left, bottom - top), "white")  # a row the canvas leaves transparent stays white
    out.alpha_composite(image.crop((max(left, 0), max(top, 0), min(right, image.width), min(bottom, image.height))),
                        (max(-left, 0), max(-top, 0)))
    return out.convert("RGB")


def _font(size: int, bold: bool = False):
    """Matplotlib's own DejaVu Sans, so a tile's name reads like the figures' text."""
    from matplotlib import font_manager
    from PIL import ImageFont

    path = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans",
                                                             weight="bold" if bold else "normal"))
    return ImageFont.truetype(path, size)


def grid(count: int, width_in: float, height_in: float) -> tuple[int, int]:
    """``(columns, dpi)`` for ``count`` frames of ``width_in × height_in`` inches on a sheet about
    :data:`SHEET_WIDTH` pixels wide: as many columns as fit at :data:`SHEET_DPI`, more (down to
    :data:`MIN_DPI`) where the sheet would be taller than 1.4 times its width; rows as even as they go."""
    def per_inch(cols: int) -> float:
        return min(SHEET_DPI, SHEET_WIDTH / (cols * width_in))

    cols = max(1, min(count, int(SHEET_WIDTH // (width_in * SHEET_DPI))))
    while (cols < count and per_inch(cols + 1) >= MIN_DPI
           and math.ceil(count / cols) * height_in * per_inch(cols) > 1.4 * SHEET_WIDTH):
        cols += 1
    cols = math.ceil(count / math.ceil(count / cols))  # 7 frames in 3 rows of 3, 3, 1 -> 3 columns
    return cols, int(per_inch(cols))


def contact_sheet(frames: Sequence, names: Sequence[str], columns: int, mark: int | None = None) -> bytes:
    """The pictures ``frames`` (PNG bytes or PIL images) tiled in rows of ``columns``, each under its number
    and name (``"3. all-gather 1"``) and outlined; frame ``mark`` (if any) outlined in an accent colour. One PNG."""
    from PIL import Image, ImageDraw

    images = [Image.open(io.BytesIO(f)).convert("RGB") if isinstance(f, bytes) else f for f in frames]
    width = max(im.width for im in images)
    rows = [images[r:r + columns] for r in range(0, len(images), columns)]
    heights = [_HEAD + max(im.height for im in row) for row in rows]
    cols = min(columns, len(images))
    sheet = Image.new("RGB", (cols * width + (cols + 1) * _GAP, sum(heights) + (len(rows) + 1) * _GAP), "white")
    draw, font, bold = ImageDraw.Draw(sheet), _font(15), _font(15, bold=True)
    y = _GAP
    for r, (row, height) in enumerate(zip(rows, heights)):
        for c, im in enumerate(row):
            i, x = r * columns + c, _GAP + c * (width + _GAP)
            number = f"{i + 1}."
            draw.text((x + 2, y + 2), number, fill=_INK, font=bold)
            draw.text((x + 8 + draw.textlength(number, font=bold), y + 2), names[i], fill=_INK, font=font)
            sheet.paste(im, (x + (width - im.width) // 2, y + _HEAD))
            edge = (_MARK, 3) if i == mark else (_EDGE, 1)
            draw.rectangle((x - 4, y - 3, x + width + 3, y + height + 3), outline=edge[0], width=edge[1])
        y += height + _GAP
    buf = io.BytesIO()
    paletted = sheet.quantize(256, method=Image.Quantize.FASTOCTREE)  # a third of the bytes
    palette = paletted.getpalette()
    for k in range(0, len(palette), 3):  # the quantizer's near-white (253) back to the page's white
        if min(palette[k:k + 3]) >= 248:
            palette[k:k + 3] = [255, 255, 255]
    paletted.putpalette(palette)
    paletted.save(buf, format="png")
    return buf.getvalue()


class Stepper:
    """The steps of a stepped picture: :meth:`sheet` all of them on one PNG, ``frame(i)`` step ``i`` alone
    (PNG bytes, each drawn once when first asked for)."""

    def __init__(self, draw: Callable[[int], Figure], steps: int | Sequence[str], label: str = "step"):
        labels = [str(s) for s in range(int(steps))] if isinstance(steps, int) else [str(s) for s in steps]
        if not labels:
            raise ValueError(f"step_through: steps={steps!r} has no step; give a count >= 1 or a list of labels")
        if not callable(draw):
            raise TypeError(f"step_through: draw={draw!r} is not callable; give a function step -> Figure")
        self.draw, self.labels, self.label = draw, labels, label
        self._figures: dict[int, Figure] = {}  # drawn for the sheet, kept until their large frame is made
        self.frame = functools.lru_cache(maxsize=None)(self._frame)
        self.sheet = functools.lru_cache(maxsize=None)(self._sheet)

    def __len__(self) -> int:
        return len(self.labels)

    def _check(self, i: int) -> None:
        if not isinstance(i, int) or not 0 <= i < len(self):
            raise ValueError(f"step_through: step {i!r} is outside 0..{len(self) - 1}")

    def figure(self, i: int) -> Figure:
        """Step ``i``'s figure, drawn by ``draw(i)``."""
        self._check(i)
        fig = self.draw(i)
        if not isinstance(fig, Figure):
            raise TypeError(f"step_through: draw({i}) returned {type(fig).__name__}, not a matplotlib Figure")
        return fig

    def _frame(self, i: int) -> bytes:
        self._check(i)
        fig = self._figures.pop(i) if i in self._figures else self.figure(i)
        return png(fig, FRAME_DPI)

    def _sheet(self, mark: int | None = None) -> bytes:
        """Every step on one PNG (:func:`contact_sheet`), each drawn at :func:`grid`'s resolution."""
        if mark is not None:
            self._check(mark)
        for i in range(len(self)):
            if i not in self._figures:
                self._figures[i] = self.figure(i)
        cols, dpi = grid(len(self), *self._figures[0].get_size_inches())
        frames = [tile(self._figures[i], dpi) for i in range(len(self))]
        names = [name if any(c.isalpha() for c in name) else f"{self.label} {name}" for name in self.labels]
        return contact_sheet(frames, names, cols, mark)  # "1. time 0", not "1. 0"

    def show(self, start: int | None = None):
        """Display every step on one picture (:meth:`sheet`; step ``start``, if given and not 0, outlined as
        the one to look at first), and below it a slider whose first position, "all steps", is that picture and
        whose others redraw the same output in place as one step, large. Returns the slider (``None``
        where there is one step only: then the output is that step)."""
        from IPython.display import Image, display

        if len(self) == 1:
            display(Image(data=self.frame(0)))
            return None
        import ipywidgets as widgets

        mark = start or None  # a later step to look at first; step 0 is where a reader starts anyway
        handle = display(Image(data=self.sheet(mark)), display_id=True)
        slider = widgets.SelectionSlider(options=[(ALL, -1)] + [(name, i) for i, name in enumerate(self.labels)],
                                         value=-1, description=self.label,
                                         layout=widgets.Layout(width="min(100%, 640px)"),
                                         style={"description_width": "initial"})
        slider.observe(lambda change: handle.update(Image(data=self.sheet(mark) if change["new"] < 0
                                                          else self.frame(change["new"]))), names="value")
        display(slider)
        return slider


def step_through(draw: Callable[[int], Figure], steps: int | Sequence[str], label: str = "step",
                 start: int | None = None) -> None:
    """Show a mechanism step by step: ``draw(i)`` returns a plain ``matplotlib.figure.Figure`` for step
    ``i``; ``steps`` is their number or their labels ("reduce-scatter 1", …). The cell's image output is
    every step on one picture (so any viewer shows the whole mechanism; ``start``, if given and not 0, is
    outlined as the step to look at first); a slider labelled ``label`` starts at "all steps" and redraws the
    output as one step (chapters 01–07, 10)."""
    Stepper(draw, steps, label).show(start)
