"""A mechanism that moves in steps, shown one step at a time: :func:`step_through`.

The course's pattern (``docs/course_design.md``): a section opens with a picture of its mechanism, drawn
from the objects the next cell runs. Where the mechanism moves in steps (a ring all-reduce's 2(n−1)
steps, ZeRO-3's gather and free per block, DDP's buckets firing during backward), the learner steps
through it with a slider. The first frame is a plain PNG output of the cell, so it stands alone in a
headless run and in a static export; the slider redraws that same output in place.
"""

from __future__ import annotations

import functools
import io
from typing import Callable, Sequence

from matplotlib.figure import Figure


def png(fig: Figure, dpi: int = 100) -> bytes:
    """``fig`` as PNG bytes (a plain ``Figure``: pyplot never sees it, so it is not shown twice)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


class Stepper:
    """The frames of a stepped picture, each drawn once when first asked for (``frame(i)``: PNG bytes)."""

    def __init__(self, draw: Callable[[int], Figure], steps: int | Sequence[str], label: str = "step"):
        labels = [str(s) for s in range(int(steps))] if isinstance(steps, int) else [str(s) for s in steps]
        if not labels:
            raise ValueError(f"step_through: steps={steps!r} has no step; give a count >= 1 or a list of labels")
        if not callable(draw):
            raise TypeError(f"step_through: draw={draw!r} is not callable; give a function step -> Figure")
        self.draw, self.labels, self.label = draw, labels, label
        self.frame = functools.lru_cache(maxsize=None)(self._frame)

    def __len__(self) -> int:
        return len(self.labels)

    def _frame(self, i: int) -> bytes:
        if not 0 <= i < len(self):
            raise ValueError(f"step_through: step {i} is outside 0..{len(self) - 1}")
        fig = self.draw(i)
        if not isinstance(fig, Figure):
            raise TypeError(f"step_through: draw({i}) returned {type(fig).__name__}, not a matplotlib Figure")
        return png(fig)

    def show(self, start: int = 0):
        """Display frame ``start`` as an image, and below it a slider that redraws it in place. Returns the
        slider (``None`` where there is one step only)."""
        from IPython.display import Image, display

        handle = display(Image(data=self.frame(start)), display_id=True)
        if len(self) == 1:
            return None
        import ipywidgets as widgets

        slider = widgets.SelectionSlider(options=[(name, i) for i, name in enumerate(self.labels)],
                                         value=start, description=self.label,
                                         layout=widgets.Layout(width="min(100%, 640px)"),
                                         style={"description_width": "initial"})
        slider.observe(lambda change: handle.update(Image(data=self.frame(change["new"]))), names="value")
        display(slider)
        return slider


def step_through(draw: Callable[[int], Figure], steps: int | Sequence[str], label: str = "step",
                 start: int = 0) -> None:
    """Show a mechanism step by step: ``draw(i)`` returns a plain ``matplotlib.figure.Figure`` for step
    ``i``; ``steps`` is their number or their labels ("reduce-scatter 1", …). The first frame is the cell's
    image output; a slider labelled ``label`` redraws it (chapters 02–04)."""
    Stepper(draw, steps, label).show(start)
