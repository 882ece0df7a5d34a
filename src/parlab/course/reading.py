"""What a learner reads: a chapter's main path and its "Under the hood" part, and how long each is.

The course's pattern (``docs/course_design.md``): each chapter's main path carries its 2–4 ideas in at
most :data:`LIMITS` (words of markdown, lines of code to read, longest code cell); everything that proves
the instruments right comes after a markdown cell that opens with ``## Under the hood``, still executed
and asserted. Code a chapter shows from the package counts as code to read: the chapter shows it with
:func:`show_source`, and :func:`chapter_sizes` finds those calls and counts the lines they display.
Collapsed solutions (code cells tagged ``solution``) are opened on purpose, so they are counted apart.
:func:`sentence_stats` says how the main path reads: words per sentence and the long bracketed asides, the
density a word limit met by compressing leaves behind.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
from dataclasses import dataclass, field

UNDER_THE_HOOD = re.compile(r"^## Under the hood\b", re.M)
#: The main path's budget: words of markdown, lines of code to read (cells + shown source), longest cell.
LIMITS = {"words": 2500, "code_lines": 300, "longest_cell": 30}
#: Sentences a learner reads at speed (docs/course_design.md, 2): the main path's median sentence and the
#: length its longest tenth reach, in words, at most (:func:`sentence_stats`).
PROSE_LIMITS = {"median_words": 18, "longest_tenth": 30}
#: How fast a learner reads this course: technical prose at 130 words a minute, its code at 8 lines a minute
#: (every line is a collective, a shape or a check, read beside its output and picture). Calibrated on a
#: learner's honest pass through all ten chapters (issue #42: about 17 hours of main paths and exercises;
#: these rates with :data:`EXERCISE_MINUTES` give 17.2 h on the same chapters); 200 words and 10 lines a
#: minute had said 12.7 h. A main path at the limits is about 55 minutes.
READING_RATE = {"words_per_minute": 130, "code_lines_per_minute": 8}
#: The Chinese edition's rate (``parlab.course.edition``): Chinese characters a minute, at the same share of
#: everyday reading speed as :data:`READING_RATE`'s 130 words: 130 / 228 of IReST's 255 characters a minute
#: for Chinese (228 words a minute for English; S. Trauzettel-Klosinski, K. Dietz and the IReST Study Group,
#: "Standardized Assessment of Reading Performance: The New International Reading Speed Texts IReST",
#: IOVS 53(9):5452-5461, 2012). Latin words in Chinese text and code lines go at :data:`READING_RATE`.
CHINESE_CHARACTERS_PER_MINUTE = round(255 * 130 / 228)  # 145
#: One exercise, done honestly: reading it and its hint, then writing and debugging the function, at a
#: rate per line of the chapter's solution (the same calibration; chapter 08's exercise, timed at about 45
#: minutes by that learner, comes out at 47).
EXERCISE_MINUTES = {"each": 5, "per_solution_line": 1.5}


def show_source(obj) -> None:
    """Show the source of a package function, class or method, as the chapter's text discusses it.

    The code worth keeping lives in the package; a chapter shows it before using it. Use this (not
    ``inspect.getsource``) so that the chapter's reading size counts what it shows."""
    from IPython.display import Code, display

    display(Code(source(obj), language="python"))


def source(obj) -> str:
    """``obj``'s source as a chapter shows it: the package's code as written (``inspect.getsource``)."""
    return inspect.getsource(obj)


@dataclass
class Part:
    words: int = 0  # markdown words
    cell_lines: int = 0  # non-blank lines of code cells
    shown_lines: int = 0  # non-blank lines of package source shown with show_source
    longest_cell: int = 0  # non-blank lines of the longest code cell
    shown: list = field(default_factory=list)  # (expression, lines)

    @property
    def code_lines(self) -> int:
        return self.cell_lines + self.shown_lines


@dataclass
class ChapterSizes:
    chapter: str
    main: Part
    under_the_hood: Part
    solutions: Part
    has_under_the_hood: bool
    unresolved: list  # show_source arguments that are not package objects (a notebook's own code is read already)

    @property
    def minutes(self) -> float:
        """The main path's reading time at :data:`READING_RATE`, unrounded (what one sitting adds up)."""
        return (self.main.words / READING_RATE["words_per_minute"]
                + self.main.code_lines / READING_RATE["code_lines_per_minute"])

    @property
    def read_minutes(self) -> int:
        """:attr:`minutes` to the nearest 5 minutes (at least 5): what a chapter's Overview states ("about 25
        minutes to read"). Nearest, not up: the Overview's two numbers add up to about the sitting that
        ``tests/test_reading.py`` holds to 75 minutes, unrounded."""
        return max(5, 5 * round(self.minutes / 5))

    def over_limits(self) -> list[str]:
        """What the main path exceeds, in words: empty when it meets :data:`LIMITS`."""
        got = {"words": self.main.words, "code_lines": self.main.code_lines, "longest_cell": self.main.longest_cell}
        return [f"{k} {got[k]} > {v}" for k, v in LIMITS.items() if got[k] > v]


def _lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip())


def _namespace(cells) -> dict:
    """The chapter's imports, executed: enough to resolve ``show_source(parlab.x.y)`` arguments."""
    ns: dict = {}
    for cell in cells:
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell magic (%%ranks): no imports of the chapter's own there
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset == 0:
                try:
                    exec(compile(ast.Module([node], []), "<imports>", "exec"), ns)
                except Exception:  # noqa: BLE001 - an optional import (a GPU-only module): not a shown name
                    pass
    return ns


def _shown(cell_source: str):
    try:
        tree = ast.parse(cell_source)
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == "show_source":
                calls.append(ast.unparse(node.args[0]))
    return calls


def chapter_sizes(path) -> ChapterSizes:
    """Count a chapter's reading: its main path, its Under the hood part and its solutions."""
    import nbformat

    path = pathlib.Path(path)
    nb = nbformat.read(path, as_version=4)
    ns = _namespace([c for c in nb.cells if c.cell_type == "code"])
    parts = {"main": Part(), "under_the_hood": Part(), "solutions": Part()}
    where, seen_uth, unresolved = "main", False, []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            if UNDER_THE_HOOD.search(cell.source):
                where, seen_uth = "under_the_hood", True
            parts[where].words += len(cell.source.split())
            continue
        if cell.cell_type != "code":
            continue
        part = parts["solutions" if "solution" in cell.metadata.get("tags", []) else where]
        n = _lines(cell.source)
        part.cell_lines += n
        part.longest_cell = max(part.longest_cell, n)
        for expr in _shown(cell.source):
            try:
                obj = eval(expr, dict(ns))  # noqa: S307 - the chapter's own expression, over its imports
                lines = _lines(source(obj))
            except Exception:  # noqa: BLE001 - a notebook's own object: its cell is counted already
                unresolved.append(expr)
                continue
            part.shown_lines += lines
            part.shown.append((expr, lines))
    return ChapterSizes(path.stem, parts["main"], parts["under_the_hood"], parts["solutions"], seen_uth, unresolved)


def table(sizes: list[ChapterSizes]) -> str:
    """One row per chapter: main path and Under the hood, as a Markdown table."""
    head = ("chapter", "main words", "main code (cells + shown)", "longest cell", "read (min)",
            "under the hood words", "under the hood code", "within limits")
    rows = [(s.chapter, str(s.main.words), f"{s.main.code_lines} ({s.main.cell_lines} + {s.main.shown_lines})",
             str(s.main.longest_cell), str(s.read_minutes), str(s.under_the_hood.words),
             str(s.under_the_hood.code_lines),
             "yes" if not s.over_limits() else "; ".join(s.over_limits())) for s in sizes]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


#: A parenthetical of at least this many words is "long": a clause the reader must hold while the sentence
#: waits (a proof or a detour belongs under the hood, linked, rather than inside the sentence). A link
#: "(under the hood, A)" or "(chapter 03)" is short.
LONG_PARENTHETICAL = 5
# Full stops that do not end a sentence: abbreviations, initials ("P. Patarasuk"), and the number that
# opens an exercise ("1. Recursive doubling").
_ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|et al|vs|cf|approx|[Ff]ig|[Ee]q|[Ss]ec)\.|\b[A-Z]\.|^\d+\.")
# A sentence ends at . ! or ? (and any closing bracket or quote after it) followed by space; "0.46" and
# "parlab.launch" have no space after the stop.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][)\"'”’]))\s+")
_CODE, _MATH = "CODE", "MATH"  # inline code and math read as one word each: their dots and brackets are not prose


@dataclass
class SentenceStats:
    """How a chapter's main path reads, sentence by sentence (:func:`sentence_stats`)."""

    chapter: str
    sentences: list  # (words, sentence), in reading order
    parentheticals: list  # (words, text) of every bracketed aside in the prose

    @property
    def median_words(self) -> float:
        import statistics

        return statistics.median(w for w, _ in self.sentences) if self.sentences else 0.0

    @property
    def longest_tenth(self) -> float:
        """Words of the shortest sentence among the longest tenth: a tenth of the sentences are this long or
        longer (the 90th percentile)."""
        import statistics

        words = sorted(w for w, _ in self.sentences)
        return statistics.quantiles(words, n=10, method="inclusive")[-1] if len(words) > 1 else float(sum(words))

    @property
    def long_parentheticals(self) -> int:
        """Bracketed asides of :data:`LONG_PARENTHETICAL` words or more."""
        return sum(w >= LONG_PARENTHETICAL for w, _ in self.parentheticals)

    def over_limits(self) -> list[str]:
        """What the main path's sentences exceed (:data:`PROSE_LIMITS`): empty when it reads at speed."""
        got = {"median_words": self.median_words, "longest_tenth": self.longest_tenth}
        return [f"{k} {got[k]:g} > {v}" for k, v in PROSE_LIMITS.items() if got[k] > v]

    def longest(self, k: int = 10) -> list:
        """The ``k`` longest sentences, longest first: where to cut."""
        return sorted(self.sentences, key=lambda s: -s[0])[:k]

    def summary(self) -> str:
        return (f"{self.chapter}: {len(self.sentences)} sentences, median {self.median_words:g} words, "
                f"longest tenth ≥ {self.longest_tenth:g} words, {self.long_parentheticals} parentheticals of "
                f"≥ {LONG_PARENTHETICAL} words")


def _plain(tokens) -> str:
    """The prose of mistune's inline tokens: emphasis and link text kept, code and math one word each."""
    out = []
    for tok in tokens:
        kind = tok["type"]
        if kind == "codespan":
            out.append(_CODE)
        elif kind == "inline_math":
            out.append(_MATH)
        elif kind in ("softbreak", "linebreak"):
            out.append(" ")
        elif kind == "inline_html":
            continue
        elif "children" in tok:
            out.append(_plain(tok["children"]))
        else:
            out.append(tok.get("raw", tok.get("text", "")))
    return "".join(out)


def _prose_blocks(tokens):
    """The paragraphs and list items of a markdown AST, as plain text; headings, tables, code blocks and
    display math are not sentences."""
    for tok in tokens:
        if tok["type"] in ("paragraph", "block_text"):
            yield _plain(tok.get("children", []))
        elif tok["type"] in ("list", "list_item", "block_quote"):
            yield from _prose_blocks(tok.get("children", []))


def _parentheticals(text: str) -> list[str]:
    """The outermost (…) asides of ``text``."""
    found, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth, start = depth + 1, (i if depth == 0 else start)
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                found.append(text[start + 1:i])
    return found


def split_sentences(text: str) -> list[str]:
    """``text`` (plain prose, one paragraph) cut into sentences."""
    protected = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "\0"), text)
    return [s.replace("\0", ".").strip() for s in _SENTENCE_END.split(protected) if s.strip()]


def sentence_stats(path) -> SentenceStats:
    """The sentences and bracketed asides of a chapter's main path: the markdown cells before its
    ``## Under the hood`` heading (the part :func:`chapter_sizes` counts as ``main``), parsed with mistune
    (nbconvert's markdown parser). Inline code and math count as one word; a list item is a sentence of
    its own even without a full stop."""
    import mistune
    import nbformat

    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sentence_stats: no notebook at {str(path)!r}")
    nb = nbformat.read(path, as_version=4)
    # mistune 3 gives its syntax tree with renderer=None, mistune 2 (which nbconvert also allows) with "ast"
    ast_renderer = None if int(mistune.__version__.split(".")[0]) >= 3 else "ast"
    parse = mistune.create_markdown(renderer=ast_renderer, plugins=["table", "math"])
    sentences, asides = [], []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        if UNDER_THE_HOOD.search(cell.source):
            break
        for block in _prose_blocks(parse(cell.source)):
            sentences += [(len(s.split()), s) for s in split_sentences(block)]
            asides += [(len(a.split()), a) for a in _parentheticals(block)]
    return SentenceStats(path.stem, sentences, asides)


#: What counts as a picture among a cell's outputs (a stepped picture's sheet of every step is a PNG too).
PICTURE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")
NUMBERED_SECTION = re.compile(r"^## (\d+)\.", re.M)


def sections_without_a_picture(executed, first_cells: int = 2) -> list[str]:
    """The numbered main-path sections (``## N.``) of an *executed* chapter that do not open with a picture:
    none among the outputs of the section's first ``first_cells`` code cells. The pattern
    (docs/course_design.md, 1): a section is a question, a picture of its mechanism, then the run."""
    import nbformat

    nb = executed if isinstance(executed, nbformat.NotebookNode) else nbformat.read(executed, as_version=4)
    missing, heading, seen, pictured = [], None, 0, False

    def close():
        if heading is not None and not pictured:
            missing.append(heading)

    for cell in nb.cells:
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.M):
            close()
            m = NUMBERED_SECTION.search(cell.source)
            heading = cell.source[m.start():].splitlines()[0] if m else None
            seen, pictured = 0, False
            continue
        if heading is None or cell.cell_type != "code" or seen >= first_cells:
            continue
        seen += 1
        pictured = pictured or any(t in out.get("data", {}) for out in cell.get("outputs", []) for t in PICTURE_TYPES)
    close()
    return missing


#: A markdown link ``[text](target)`` (an image's ``![..](..)`` too, told apart by its ``!``).
MARKDOWN_LINK = re.compile(r"(?P<image>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: The most links a main path may make into its own Under the hood part (issue 50: a learner follows links,
#: so keep the few that matter).
MAX_UNDER_THE_HOOD_LINKS = 8


def _slug(text: str) -> str:
    """A heading's anchor as letters and digits only (JupyterLab and GitHub spell anchors differently)."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def links_under_the_hood(path) -> list[str]:
    """The main path's links into its own Under the hood part, as written (``[F](#F.-The-script's-rules)``):
    markdown links before the ``## Under the hood`` cell to an anchor in this notebook that is a heading from
    that cell on, or whose text says "under the hood". Links to other chapters, images, and links in code
    (fenced or inline) are not counted."""
    import nbformat

    nb = nbformat.read(pathlib.Path(path), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    start = next((i for i, text in enumerate(cells) if UNDER_THE_HOOD.search(text)), len(cells))
    if start == len(cells):
        return []  # no Under the hood part: nothing to link into
    hood = "\n".join(cells[start:])
    hood = hood[UNDER_THE_HOOD.search(hood).start():]
    anchors = {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*?)\s*$", hood, re.M)}
    main = re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", "\n".join(cells[:start]), flags=re.M | re.S))
    found = []
    for m in MARKDOWN_LINK.finditer(main):
        local, anchor = m.group("target").startswith("#"), m.group("target").partition("#")[2]
        if m.group("image"):
            continue
        if local and (_slug(anchor) in anchors or "under the hood" in m.group("text").lower()):
            found.append(m.group(0))
    return found
