"""The course in other languages (``parlab edition zh``): each chapter's edition is built from the English one.

The English notebooks stay the source. A translation is a text file, ``translations/<lang>/<chapter>.md``,
with one block per markdown cell of the English chapter, in notebook order::

    === cell <cell id> ===
    --- en ---
    <the English cell's source, exactly>
    --- zh ---
    <its translation>

A block ends at the next ``=== cell`` line or at the end of the file; blank lines around each part are
stripped. The ``en`` part keys the translation to the English it translates: when the English cell changes,
:func:`stale` reports the cell with a diff of the English change, and :func:`build` refuses until the
translation is updated (the ``en`` part copied anew, the translation fixed). Code cells are never
translated: :func:`build` copies the English notebook and replaces only its markdown cells' sources, so
the edition runs the same code, with the same cell ids, tags, parameters cell and metadata, plus
``metadata.parlab.edition``.

An edition's notebooks live in ``notebooks/<lang>/``, one folder down: :func:`build` rewrites each relative
link of a translation, written as from ``notebooks/`` like the English (``../README.zh.md``,
``02_collectives.ipynb``), to work from there (``../../README.zh.md``; ``02_collectives.ipynb`` stays when
chapter 02 has a translation, else it becomes ``../02_collectives.ipynb``, the English chapter). No chapter's
code reads a file beside its notebook except chapter 00's ``export_function("00_welcome.ipynb", ...)``,
which finds the edition's own copy, whose code is the same.

When an English sentence changes: ``parlab edition zh`` names the stale cell and shows the English diff;
in ``translations/zh/<chapter>.md`` make that block's ``en`` part the new English and fix its translation;
``parlab edition zh --build`` writes the notebook (and README.zh.md's course map); ``tests/test_edition.py``
fails until both are done. ``parlab edition zh --new NN`` starts a chapter's translation.

At run time, :func:`language` says which edition a kernel belongs to: ``parlab run`` sets ``PARLAB_LANG`` for
a notebook of an edition (``metadata.parlab.edition``).
"""

from __future__ import annotations

import difflib
import pathlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parlab.lab.language import current

if TYPE_CHECKING:  # each function imports nbformat where it reads or writes a notebook: its schema checks
    import nbformat  # take 1.7 s to import, which `parlab --help` and every other command would pay

ROOT = pathlib.Path(__file__).resolve().parents[3]
#: The editions there are, and the language each translates into.
LANGUAGES = {"zh": "简体中文"}
_HEADER = re.compile(r"^=== cell (\S+) ===[ \t]*$", re.M)
_PARTS = re.compile(r"^--- (en|{langs}) ---[ \t]*$".format(langs="|".join(LANGUAGES)), re.M)


class EditionError(ValueError):
    """A translation that cannot be built: stale or missing cells, or a malformed file."""


@dataclass
class Block:
    cell_id: str
    en: str
    translation: str


@dataclass
class Stale:
    cell_id: str
    why: str  # "missing", "untranslated", "changed", "not in the English"
    diff: str = ""  # the English change, unified diff from the translated English to today's


def language() -> str:
    """The edition this kernel runs, ``"zh"`` or ``"en"``: decided in one place, :func:`parlab.lab.language.current`
    (``PARLAB_LANG``, which ``parlab run`` sets for an edition's notebook; else the notebook's folder)."""
    return current()


def read(path) -> list[Block]:
    """The blocks of a translation file, in order."""
    path = pathlib.Path(path)
    text = path.read_text(encoding="utf-8")
    heads = list(_HEADER.finditer(text))
    if text[:heads[0].start()].strip() if heads else text.strip():
        raise EditionError(f"{path}: text before the first '=== cell <id> ===' line")
    blocks = []
    for head, nxt in zip(heads, heads[1:] + [None]):
        body = text[head.end():nxt.start() if nxt else len(text)]
        parts = list(_PARTS.finditer(body))
        if [p.group(1) for p in parts][:1] != ["en"] or len(parts) != 2 or body[:parts[0].start()].strip():
            raise EditionError(f"{path}: cell {head.group(1)} needs '--- en ---' then one '--- <lang> ---' part")
        en = body[parts[0].end():parts[1].start()].strip("\n")
        blocks.append(Block(head.group(1), en, body[parts[1].end():].strip("\n")))
    return blocks


def write(path, blocks, lang: str = "zh") -> None:
    """Write ``blocks`` as a translation file (what :func:`read` reads back)."""
    text = "\n\n".join(f"=== cell {b.cell_id} ===\n--- en ---\n{b.en.strip(chr(10))}\n--- {lang} ---\n"
                       f"{b.translation.strip(chr(10))}" for b in blocks)
    pathlib.Path(path).write_text(text + "\n", encoding="utf-8")


def english(chapter, notebooks=None) -> pathlib.Path:
    """The English notebook of ``chapter`` (``"00"``, ``"00_welcome"`` or a path)."""
    from parlab.course.chapters import chapters

    if isinstance(chapter, pathlib.Path) or str(chapter).endswith(".ipynb"):
        return pathlib.Path(chapter)
    return chapters([chapter], notebooks if notebooks is not None else ROOT / "notebooks")[0]


def translation(chapter, lang: str = "zh", translations=None) -> pathlib.Path:
    """``translations/<lang>/<chapter stem>.md`` (it may not exist yet)."""
    _check_lang(lang)
    folder = pathlib.Path(translations) if translations is not None else ROOT / "translations" / lang
    return folder / f"{english(chapter).stem}.md"


def _check_lang(lang: str) -> None:
    if lang not in LANGUAGES:
        raise ValueError(f"lang={lang!r}: no such edition; there are {', '.join(LANGUAGES)}")


def stale(chapter, lang: str = "zh", translations=None) -> list[Stale]:
    """The markdown cells of ``chapter`` whose translation is missing, empty, or keyed to English that has
    changed since (with the diff), and blocks of cells the English no longer has. Empty: current."""
    import nbformat
    nb = nbformat.read(english(chapter), as_version=4)
    path = translation(chapter, lang, translations)
    blocks = {b.cell_id: b for b in read(path)} if path.exists() else {}
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        block, now = blocks.pop(cell.id, None), cell.source.rstrip("\n")
        if block is None:
            found.append(Stale(cell.id, "missing"))
        elif _keyed(block.en) != _keyed(now):
            diff = difflib.unified_diff(block.en.splitlines(), now.splitlines(), "translated English",
                                        "English now", lineterm="")
            found.append(Stale(cell.id, "changed", "\n".join(diff)))
        elif not block.translation.strip():
            found.append(Stale(cell.id, "untranslated"))
    return found + [Stale(cell_id, "not in the English") for cell_id in blocks]


def translated(lang: str = "zh", translations=None) -> set[str]:
    """The stems of the chapters that have a translation file."""
    _check_lang(lang)
    folder = pathlib.Path(translations) if translations is not None else ROOT / "translations" / lang
    return {p.stem for p in folder.glob("[0-9][0-9]_*.md")}


def _keyed(text: str) -> str:
    """``text`` as a translation is keyed to it: the Overview's times line (``parlab times --write`` rewrites
    it) counts as its mark only; :func:`build` writes the edition's own (:func:`overview_line`)."""
    from parlab.course.times import MARK

    return "\n".join(MARK if line.startswith(MARK) else line for line in text.split("\n"))


def read_minutes(chapter, texts: dict) -> float:
    """Minutes to read the main path of ``chapter`` in Chinese, ``texts`` being its markdown cells' translations
    by cell id: Chinese characters at :data:`~parlab.course.reading.CHINESE_CHARACTERS_PER_MINUTE`, Latin words
    and the code (the English chapter's, unchanged) at :data:`~parlab.course.reading.READING_RATE`. The main
    path ends where the English one does (its ``## Under the hood`` cell)."""
    import nbformat
    from parlab.course import reading

    path = english(chapter)
    nb, chars, words = nbformat.read(path, as_version=4), 0, 0
    for cell in nb.cells:
        if cell.cell_type == "markdown" and reading.UNDER_THE_HOOD.search(cell.source):
            break
        if cell.cell_type == "markdown":
            text = texts[cell.id]
            chars += len(_HAN.findall(text))
            words += len(_HAN.sub(" ", text).split())
    return (chars / reading.CHINESE_CHARACTERS_PER_MINUTE + words / reading.READING_RATE["words_per_minute"]
            + reading.chapter_sizes(path).main.code_lines / reading.READING_RATE["code_lines_per_minute"])


def overview_line(chapter, texts: dict) -> str:
    """The Chinese edition's times line: its own reading time; exercises and run as the English chapter's."""
    from parlab.course import times

    t = times.chapter_times(english(chapter))
    minutes = read_minutes(chapter, texts)
    run = "" if t.run_seconds is None else f"，运行{_duration(t.run_seconds)}"
    return (f"{times.MARK}**约 {max(5, 5 * round(minutes / 5))} 分钟阅读，{t.exercise_minutes} 分钟练习{run}**"
            f"（在课程的 2 核测试机上）。")


def _duration(seconds: float) -> str:
    return f" {max(5, 5 * round(seconds / 5))} 秒" if seconds < 100 else f"约 {round(seconds / 60)} 分钟"


_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.M | re.S)
_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)")


def relink(text: str, chapters_here: set[str]) -> str:
    """``text``'s relative links, written as from ``notebooks/``, rewritten for ``notebooks/<lang>/``: a
    chapter in ``chapters_here`` stays beside it; any other relative target goes one folder up. Links in
    code (fenced or inline) and web or in-page links are left as they are."""
    def fix(m):
        target = m.group(2)
        if target.startswith(("#", "/")) or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            return m.group(0)
        file = target.split("#")[0]
        if re.fullmatch(r"\d\d_\w+\.ipynb", file) and file[:-len(".ipynb")] in chapters_here:
            return m.group(0)
        return m.group(1) + "../" + target

    out, last = [], 0
    for code in _CODE.finditer(text):
        out += [_LINK.sub(fix, text[last:code.start()]), code.group(0)]
        last = code.end()
    return "".join(out + [_LINK.sub(fix, text[last:])])


_HEADING = re.compile(r"^(#+)[ \t]+(.*?)[ \t]*$", re.M)


def english_anchors(english_text: str, text: str) -> str:
    """``text`` (a translated cell) with the anchor each English heading had, ``<a id="A.-How-it-works"></a>``
    (JupyterLab's id: the heading's words joined by hyphens), before each heading the translation changed, so
    that the English chapter's in-page links (``#A.-How-it-works``), kept as they are in translation, still
    land on it. Headings pair in order; a cell whose heading count differs is left alone."""
    english_headings, headings = _HEADING.findall(english_text), list(_HEADING.finditer(text))
    if len(english_headings) != len(headings):
        return text
    out, last = [], 0
    for (_, words), m in zip(english_headings, headings):
        if m.group(2) != words:
            out += [text[last:m.start()], f'<a id="{"-".join(words.split())}"></a>\n\n']
            last = m.start()
    return "".join(out + [text[last:]])


def build(chapter, lang: str = "zh", translations=None) -> nbformat.NotebookNode:
    """The ``lang`` edition of ``chapter``: the English notebook with each markdown cell's source replaced
    by its translation (links rewritten by :func:`relink`), and ``metadata.parlab.edition = lang``; nothing
    else changes. Raises :class:`EditionError` naming the stale cells."""
    import nbformat
    problems = stale(chapter, lang, translations)
    path = translation(chapter, lang, translations)
    if problems:
        cells = ", ".join(f"{s.cell_id} ({s.why})" for s in problems)
        raise EditionError(f"{path}: the {lang} edition of {english(chapter).stem} is not current; stale cells: "
                           f"{cells}. `parlab edition {lang}` shows each English change.")
    from parlab.course.times import MARK

    nb = nbformat.read(english(chapter), as_version=4)
    texts = {b.cell_id: b.translation for b in read(path)}
    here, line = translated(lang, translations), overview_line(chapter, texts)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text = "\n".join(line if t.startswith(MARK) else t for t in texts[cell.id].split("\n"))
            cell.source = relink(english_anchors(cell.source, text), here)
    nb.metadata.setdefault("parlab", {})["edition"] = lang
    return nb


def output(chapter, lang: str = "zh", notebooks=None) -> pathlib.Path:
    """Where the edition of ``chapter`` is written: ``notebooks/<lang>/<stem>.ipynb``."""
    folder = pathlib.Path(notebooks) if notebooks is not None else ROOT / "notebooks"
    return folder / lang / f"{english(chapter).stem}.ipynb"


def new(chapter, lang: str = "zh", translations=None) -> pathlib.Path:
    """Start a translation of ``chapter``: every markdown cell's ``en`` filled, its translation empty."""
    import nbformat
    path = translation(chapter, lang, translations)
    if path.exists():
        raise FileExistsError(f"{path} exists: edit it (`parlab edition {lang}` says which cells are stale)")
    nb = nbformat.read(english(chapter), as_version=4)
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, [Block(c.id, c.source, "") for c in nb.cells if c.cell_type == "markdown"], lang)
    return path


def status(lang: str = "zh") -> list[str]:
    """One line per chapter: translated and current, its stale cells (with the English diffs), or not
    translated; and whether its built notebook is out of date."""
    import nbformat
    from parlab.course.chapters import chapters

    lines, have = [], translated(lang)
    for path in chapters(folder=ROOT / "notebooks"):
        if path.stem not in have:
            lines.append(f"{path.stem}: not translated (parlab edition {lang} --new {path.stem[:2]})")
            continue
        problems = stale(path, lang)
        if problems:
            lines.append(f"{path.stem}: {len(problems)} stale cell(s) in {translation(path, lang).relative_to(ROOT)}")
            lines += [f"  cell {s.cell_id}: {s.why}" + "".join(f"\n    {d}" for d in s.diff.splitlines())
                      for s in problems]
            continue
        built = output(path, lang)
        current = built.exists() and nbformat.read(built, as_version=4) == build(path, lang)
        lines.append(f"{path.stem}: translated and current"
                     + ("" if current else f"; {built.relative_to(ROOT)} needs `parlab edition {lang} --build`"))
    return lines


def build_all(lang: str = "zh") -> list[pathlib.Path]:
    """Write ``notebooks/<lang>/<stem>.ipynb`` for every translated chapter (no outputs)."""
    import nbformat
    written = []
    for stem in sorted(translated(lang)):
        out = output(stem, lang)
        out.parent.mkdir(exist_ok=True)
        nbformat.write(build(stem, lang), out)
        written.append(out)
    return written


def readme_row(row: str, path: pathlib.Path, lang: str = "zh") -> str:
    """A row of ``README.<lang>.md``'s course map (``| [NN 标题](link) | 你将 | 阅读 | 练习 | 运行 | 运行（CI） |``)
    with its link and times from one source: a translated chapter links its edition and states its own
    reading time (:func:`read_minutes`); another links the English chapter and says it is not translated.
    Exercises and runs are the English chapter's (:mod:`parlab.course.times`)."""
    from parlab.course import times

    cells = row.split(" | ")
    runs = times.load_run_times().get(path.stem, {})
    done = path.stem in translated(lang)
    link = f"notebooks/{lang}/{path.name}" if done else f"notebooks/{path.name}"
    cells[0] = re.sub(r"\]\([^)]*\)(（英文）)?", f"]({link})" + ("" if done else "（英文）"), cells[0], count=1)
    read_time = "尚未翻译"  # the English chapter's times need not be counted here: the README states them
    if done:
        texts = {b.cell_id: b.translation for b in read(translation(path, lang))}
        read_time = f"{max(5, 5 * round(read_minutes(path, texts) / 5))} 分钟"
    run = [_duration(runs[k]).strip() if k in runs else "–" for k in ("defaults", "ci")]
    return " | ".join([*cells[:2], read_time, f"{times.exercise_minutes(path)} 分钟", *run]) + " |"


def sync_readme(lang: str = "zh", write: bool = False) -> list[str]:
    """What ``README.<lang>.md``'s course map says otherwise than :func:`readme_row`; with ``write``, fix it."""
    from parlab.course.chapters import chapters

    readme = ROOT / f"README.{lang}.md"
    lines, stale = readme.read_text(encoding="utf-8").split("\n"), []
    for path in chapters(folder=ROOT / "notebooks"):
        at = [i for i, line in enumerate(lines) if line.startswith(f"| [{path.stem[:2]} ")]
        if len(at) != 1:
            stale.append(f"{readme.name}: no course-map row for chapter {path.stem[:2]}")
            continue
        row = readme_row(lines[at[0]], path, lang)
        if row != lines[at[0]]:
            stale.append(f"{readme.name}: chapter {path.stem[:2]}'s row should be: {row}")
            lines[at[0]] = row
    if write:
        readme.write_text("\n".join(lines), encoding="utf-8")
    return stale


def add_command(sub) -> None:
    """``parlab edition``, on the ``parlab`` command's subparsers (:mod:`parlab.course.cli`)."""
    edition = sub.add_parser("edition", help="the course in another language, built from the English "
                                             "(parlab.course.edition): each chapter's status, --build, --new NN")
    edition.add_argument("lang", choices=sorted(LANGUAGES), help="the edition")
    edition.add_argument("--build", action="store_true", help="write notebooks/LANG/NN_*.ipynb for every "
                                                              "translated chapter, and README.LANG.md's course map")
    edition.add_argument("--new", metavar="NN", help="start translations/LANG/NN_*.md: every English cell, "
                                                     "its translation empty")
    edition.set_defaults(edition=command)


def command(args) -> int:
    """``parlab edition LANG [--build | --new NN]``."""
    try:
        if args.new:
            print(f"wrote {new(args.new, args.lang)}: translate each '--- {args.lang} ---' part")
            return 0
        if args.build:
            for path in build_all(args.lang):
                print(f"wrote {path.relative_to(ROOT)}")
            for line in sync_readme(args.lang, write=True):
                print(f"fixed: {line}")
            return 0
        lines = status(args.lang) + sync_readme(args.lang)
    except (EditionError, FileExistsError, ValueError) as exc:
        print(f"parlab edition: {exc}")
        return 1
    print("\n".join(lines))
    return 0 if all(": not translated" in line or line.endswith("translated and current") for line in lines
                    if not line.startswith(" ")) else 1
