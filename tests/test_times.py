"""One source for each chapter's read, exercise and run times: the Overviews and the README's course map agree
with :mod:`parlab.course.times`, and the check fails when one of them says otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from parlab.course import reading, times
ROOT = Path(__file__).parents[1]


def test_overviews_and_the_course_map_agree_with_the_one_source():
    stale = times.sync(ROOT / "notebooks", ROOT / "README.md", write=False)
    assert stale == [], "run `parlab times --write` (after the suite: `--measured artifacts/run_times.json`):\n" + \
        "\n".join(stale)


def test_the_check_catches_a_stale_overview_and_a_stale_row(tmp_path):
    (tmp_path / "notebooks").mkdir()
    chapter = tmp_path / "notebooks" / "00_welcome.ipynb"
    shutil.copy(ROOT / "notebooks" / "00_welcome.ipynb", chapter)
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    assert times.sync(tmp_path / "notebooks", readme, write=False) == []
    nb = nbformat.read(chapter, as_version=4)
    nb.cells[0].source = nb.cells[0].source.replace("About ", "About 1", 1)  # "About 130 minutes to read"
    nbformat.write(nb, chapter)
    row = next(line for line in readme.read_text().split("\n") if line.startswith("| [00 "))
    readme.write_text(readme.read_text().replace(row, row.replace(" min |", "1 min |", 1)))  # "351 min" to read
    stale = times.sync(tmp_path / "notebooks", readme, write=False)
    assert len(stale) == 2 and "00_welcome.ipynb" in stale[0] and "chapter 00's row" in stale[1]
    times.sync(tmp_path / "notebooks", readme, write=True)
    assert times.sync(tmp_path / "notebooks", readme, write=False) == []


def test_durations_and_exercise_minutes():
    assert [times.duration(s) for s in (3, 22, 61, 99, 100, 150)] == ["5 s", "20 s", "60 s", "100 s", "about 2 min",
                                                                      "about 2 min"]
    chapter = ROOT / "notebooks" / "00_welcome.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    solutions = [sum(1 for line in c.source.splitlines() if line.strip()) for c in nb.cells
                 if c.cell_type == "code" and "solution" in c.metadata.get("tags", [])]
    rate = reading.EXERCISE_MINUTES
    assert solutions and times.exercise_minutes(chapter) >= sum(rate["each"] + rate["per_solution_line"] * n
                                                                for n in solutions)
