"""How long each chapter takes, from one source: stated once per chapter in its Overview and once in the README's
course map, both written by ``parlab times --write`` and checked by the tests (``parlab times --check``).

- *read*: the main path at :data:`parlab.course.reading.READING_RATE` (:func:`parlab.course.reading.chapter_sizes`);
- *exercises*: for each exercise, :data:`parlab.course.reading.EXERCISE_MINUTES` (a fixed part, then a rate per
  line of its solution: reading, writing and debugging the function), plus reading the Exercises section;
- *run*: the whole chapter top to bottom, with its default and with its CI parameters, as the test suite
  measured it on the course's 2-core test machine (``docs/run_times.json``; the suite writes what it
  measured to ``artifacts/run_times.json``, and ``parlab times --measured artifacts/run_times.json --write``
  takes it in).
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass

from parlab.course.reading import EXERCISE_MINUTES, READING_RATE, chapter_sizes

ROOT = pathlib.Path(__file__).resolve().parents[3]
RUN_TIMES = ROOT / "docs" / "run_times.json"
MARK = "<!-- parlab:times -->"  # the Overview's line that this module writes (the comment is invisible when rendered)
EXERCISES = re.compile(r"^## Exercises\b", re.M)
SECTION = re.compile(r"^## ", re.M)


@dataclass(frozen=True)
class ChapterTimes:
    chapter: str
    read_minutes: int
    exercise_minutes: int
    run_seconds: float | None  # default parameters
    ci_seconds: float | None  # CI parameters

    def overview_line(self) -> str:
        run = "" if self.run_seconds is None else f", {duration(self.run_seconds)} to run"
        return (f"{MARK}**About {self.read_minutes} min to read, {self.exercise_minutes} min of exercises{run}** "
                f"(on the course's 2-core test machine).")


def duration(seconds: float) -> str:
    """``35 s``, ``about 2 min``: run times are measured on a shared machine, so they are rounded."""
    return f"{max(5, 5 * round(seconds / 5))} s" if seconds < 100 else f"about {round(seconds / 60)} min"


def exercise_minutes(path) -> int:
    """:func:`exercise_minutes_exact` to the nearest 5 minutes: what the Overview and the README state."""
    minutes = exercise_minutes_exact(path)
    return max(5, 5 * round(minutes / 5)) if minutes else 0


def exercise_minutes_exact(path) -> float:
    """The Exercises section done honestly: :data:`EXERCISE_MINUTES` per exercise (each has a collapsed
    solution cell, whose length sets how much the learner writes), plus reading the section."""
    import nbformat

    cells, inside = nbformat.read(path, as_version=4).cells, False
    minutes = 0.0
    for cell in cells:
        if cell.cell_type == "markdown" and SECTION.search(cell.source):
            inside = bool(EXERCISES.search(cell.source))
        if not inside:
            continue
        if cell.cell_type == "markdown":
            minutes += len(cell.source.split()) / READING_RATE["words_per_minute"]
        elif "solution" in cell.metadata.get("tags", []):
            lines = sum(1 for line in cell.source.splitlines() if line.strip())
            minutes += EXERCISE_MINUTES["each"] + EXERCISE_MINUTES["per_solution_line"] * lines
    return minutes


#: One sitting (docs/course_design.md, 2): a chapter's main path, its exercises done honestly, and the waiting
#: for its cells on a busy machine, at most this many minutes (``tests/test_reading.py``).
ONE_SITTING = 75
#: How much slower a chapter's cells run on a busy shared or Binder machine than on the course's test machine:
#: the low end of the 4–11× measured on a busy 2-core machine (README, "Course map").
BUSY = 4


def sitting_minutes(path, run_times: dict | None = None) -> dict:
    """One sitting of chapter ``path``, unrounded, in minutes: ``read`` (the main path), ``exercises``,
    ``waiting`` (its default run at :data:`BUSY` times the measured seconds) and their ``total``."""
    path = pathlib.Path(path)
    runs = (run_times if run_times is not None else load_run_times()).get(path.stem, {})
    parts = {"read": chapter_sizes(path).minutes, "exercises": exercise_minutes_exact(path),
             "waiting": BUSY * runs.get("defaults", 0.0) / 60}
    return {**parts, "total": sum(parts.values())}


def chapter_times(path, run_times: dict | None = None) -> ChapterTimes:
    path = pathlib.Path(path)
    runs = (run_times if run_times is not None else load_run_times()).get(path.stem, {})
    return ChapterTimes(path.stem, chapter_sizes(path).read_minutes, exercise_minutes(path),
                        runs.get("defaults"), runs.get("ci"))


def load_run_times(path=RUN_TIMES) -> dict:
    path = pathlib.Path(path)
    return json.loads(path.read_text())["chapters"] if path.exists() else {}


def take_measured(measured: dict, path=RUN_TIMES) -> None:
    """Merge ``{chapter: {"defaults": s, "ci": s}}`` (what the suite measured) into ``docs/run_times.json``."""
    path = pathlib.Path(path)
    data = json.loads(path.read_text()) if path.exists() else {"chapters": {}}
    chapters = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for chapter, runs in measured.items():
        if chapter not in chapters:
            raise ValueError(f"{chapter!r} in the measured run times is no chapter of notebooks/")
        data["chapters"].setdefault(chapter, {}).update({k: round(v, 1) for k, v in runs.items()})
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _with_overview_line(source: str, line: str) -> str | None:
    """The Overview cell with its times line replaced, or None if it has no such line."""
    lines = source.split("\n")
    at = [i for i, text in enumerate(lines) if text.startswith(MARK)]
    if len(at) != 1:
        return None
    lines[at[0]] = line
    return "\n".join(lines)


def _readme_row(row: str, t: ChapterTimes) -> str:
    cells = row.split(" | ")  # | [NN title](link) | you will | read | exercises | run | run (CI) |
    run = duration(t.run_seconds) if t.run_seconds is not None else "–"
    ci = duration(t.ci_seconds) if t.ci_seconds is not None else "–"
    return " | ".join([*cells[:2], f"{t.read_minutes} min", f"{t.exercise_minutes} min", run, ci]) + " |"


def sync(notebooks, readme, write: bool) -> list[str]:
    """What disagrees with the one source (each chapter's Overview line, the README's map rows); with
    ``write``, fix it in place. Returns one message per place that was (or is) stale."""
    import nbformat

    stale, run_times = [], load_run_times()
    readme = pathlib.Path(readme)
    text = readme.read_text()
    out_lines = text.split("\n")
    for path in sorted(pathlib.Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        t = chapter_times(path, run_times)
        nb = nbformat.read(path, as_version=4)
        new = _with_overview_line(nb.cells[0].source, t.overview_line())
        if new is None:
            stale.append(f"{path.name}: its Overview has no line starting with {MARK}")
        elif new != nb.cells[0].source:
            stale.append(f"{path.name}: Overview says otherwise; should be: {t.overview_line()[len(MARK):]}")
            if write:
                nb.cells[0].source = new
                nbformat.write(nb, path)
        rows = [i for i, line in enumerate(out_lines) if line.startswith(f"| [{path.stem[:2]} ")]
        if len(rows) != 1:
            stale.append(f"{readme.name}: no course-map row for chapter {path.stem[:2]}")
            continue
        row = _readme_row(out_lines[rows[0]], t)
        if row != out_lines[rows[0]]:
            stale.append(f"{readme.name}: chapter {path.stem[:2]}'s row should be: {row}")
            out_lines[rows[0]] = row
    if write and "\n".join(out_lines) != text:
        readme.write_text("\n".join(out_lines))
    return stale
