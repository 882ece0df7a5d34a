"""The chapter's dataset (chapter 08): the paragraphs of the course's own notebooks, made into a tokenizer
and rows by ``make_data.py``, the standalone script the chapter runs (its docstring holds the data format).

The tokenizer and the rows are ``make_data``'s functions, re-exported here: one piece of code per idea.
"""

from __future__ import annotations

import glob
import json
import os

from parlab.lab.job.make_data import IGNORE, paragraphs, token_rows, train_tokenizer

__all__ = ["IGNORE", "course_paragraphs", "paragraphs", "token_rows", "train_tokenizer"]


def course_paragraphs(folder: str | None = None) -> list[str]:
    """The paragraphs of every markdown cell of the course's notebooks, in file order: the text the chapter
    writes to ``corpus.txt`` (joined by blank lines, which ``make_data.paragraphs`` splits back into these)."""
    folder = folder or os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "notebooks")
    paths = sorted(glob.glob(os.path.join(folder, "*.ipynb")))
    if not paths:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {os.path.abspath(folder)!r}")
    found = []
    for path in paths:
        with open(path) as f:
            cells = json.load(f)["cells"]
        for cell in cells:
            if cell["cell_type"] == "markdown":
                found += paragraphs("".join(cell["source"]))
    return found
