"""The Chinese edition (:mod:`parlab.course.edition`, issue #53): every translation current and complete, each
built notebook what ``parlab edition zh --build`` writes (code cells byte-identical to the English), the
glossary (``translations/zh/glossary.md``) held in every translated chapter, the typography linted with
autocorrect, README.zh.md's course map computed, and chapter 00 in Chinese run headless like the English.

A planted English edit, a planted rejected term, a term first used without its English and a planted missing
space are each caught (the ``*_catches_*`` tests below).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import autocorrect_py
import nbformat
import pytest

from parlab.course import edition

ROOT = pathlib.Path(__file__).parent.parent
LANG = "zh"
TRANSLATED = sorted(edition.translated(LANG))
GLOSSARY = ROOT / "translations" / LANG / "glossary.md"
EDITORS_NOTE = re.compile(r"^> (?:\*\*)?编者注[:：](?:\*\*)?.*?(?=\n(?!>)|\Z)", re.M | re.S)
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.M | re.S)


def _zh_texts(stem: str) -> dict[str, str]:
    return {b.cell_id: b.translation for b in edition.read(edition.translation(stem, LANG))}


# -- current, complete, and built ---------------------------------------------------------------------

def test_there_is_a_translated_chapter():
    assert "00_welcome" in TRANSLATED


@pytest.mark.parametrize("stem", TRANSLATED)
def test_translation_is_current_and_built(stem):
    problems = edition.stale(stem, LANG)
    assert not problems, (f"{stem}: stale translation cells (fix translations/{LANG}/{stem}.md):\n" + "\n".join(
        f"  {s.cell_id}: {s.why}\n{s.diff}" for s in problems))
    built = edition.output(stem, LANG)
    assert built.exists() and nbformat.read(built, as_version=4) == edition.build(stem, LANG), (
        f"{built.relative_to(ROOT)} is not what the translation builds: run `parlab edition {LANG} --build`")


@pytest.mark.parametrize("stem", TRANSLATED)
def test_same_code_cells_ids_and_tags(stem):
    """Code cells byte-identical to the English; the same cells in the same order, with the same ids, tags
    and metadata; the notebook's metadata the English's plus ``parlab.edition``; committed without outputs."""
    en = nbformat.read(edition.english(stem), as_version=4)
    zh = nbformat.read(edition.output(stem, LANG), as_version=4)
    assert [(c.id, c.cell_type, c.metadata) for c in zh.cells] == [(c.id, c.cell_type, c.metadata) for c in en.cells]
    assert [c.source for c in zh.cells if c.cell_type == "code"] == [c.source for c in en.cells
                                                                    if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in zh.cells if c.cell_type == "code")
    parlab_meta = dict(zh.metadata["parlab"])
    assert parlab_meta.pop("edition") == LANG and parlab_meta == en.metadata["parlab"]
    assert {k: v for k, v in zh.metadata.items() if k != "parlab"} == {k: v for k, v in en.metadata.items()
                                                                       if k != "parlab"}


@pytest.mark.parametrize("stem", TRANSLATED)
def test_links_resolve_from_the_edition_folder(stem):
    from test_notebooks import _broken_links, _markdown  # the English chapters' own link check

    path = edition.output(stem, LANG)
    assert _broken_links(_markdown(nbformat.read(path, as_version=4)), path.parent, path) == []


def test_readme_links_resolve():
    from test_notebooks import _broken_links

    path = ROOT / "README.zh.md"
    assert _broken_links(path.read_text(encoding="utf-8"), ROOT, path) == []


def test_a_planted_english_edit_is_stale_and_refused(tmp_path):
    """An English sentence changed in a copy of chapter 00: that cell, only, is reported with the English
    diff, and the build refuses, naming it. A cell the English lost and one it gained are reported too."""
    english = tmp_path / "00_welcome.ipynb"
    shutil.copy(edition.english("00"), english)
    translations = ROOT / "translations" / LANG
    assert edition.stale(english, LANG, translations) == []
    nb = nbformat.read(english, as_version=4)
    cell = next(c for c in nb.cells if c.id == "26b88f11")
    cell.source = cell.source.replace("does the same.", "does the same, and more.")
    nbformat.write(nb, english)
    [found] = edition.stale(english, LANG, translations)
    assert (found.cell_id, found.why) == ("26b88f11", "changed")
    assert "-two-rank smoke test" in found.diff and "+two-rank smoke test" in found.diff
    assert "does the same, and more." in found.diff
    with pytest.raises(edition.EditionError, match=r"stale cells: 26b88f11 \(changed\)"):
        edition.build(english, LANG, translations)
    nb.cells = [c for c in nb.cells if c.id != "c01"] + [nbformat.v4.new_markdown_cell("## New", id="new1")]
    nbformat.write(nb, english)
    assert {(s.cell_id, s.why) for s in edition.stale(english, LANG, translations)} == {
        ("26b88f11", "changed"), ("new1", "missing"), ("c01", "not in the English")}


def test_the_times_line_does_not_stale_the_overview(tmp_path):
    """``parlab times --write`` rewrites the English Overview's times line: the translation stays current,
    and the edition states its own times."""
    english = tmp_path / "00_welcome.ipynb"
    nb = nbformat.read(edition.english("00"), as_version=4)
    nb.cells[0].source = re.sub(r"(<!-- parlab:times -->).*", r"\1**About 99 min to read**", nb.cells[0].source)
    nbformat.write(nb, english)
    assert edition.stale(english, LANG, ROOT / "translations" / LANG) == []
    assert "分钟阅读" in edition.build(english, LANG, ROOT / "translations" / LANG).cells[0].source


def test_read_write_and_relink(tmp_path):
    blocks = [edition.Block("a1", "# Title\n\ntext", "# 标题\n\n正文"), edition.Block("b2", "x", "")]
    edition.write(tmp_path / "t.md", blocks)
    assert edition.read(tmp_path / "t.md") == blocks
    (tmp_path / "bad.md").write_text("=== cell a1 ===\n--- zh ---\n正文\n")
    with pytest.raises(edition.EditionError, match="cell a1 needs '--- en ---'"):
        edition.read(tmp_path / "bad.md")
    text = "[00](00_welcome.ipynb) [02](02_collectives.ipynb#A) [r](../README.zh.md) [w](https://x.org) [s](#B) `[c](c.md)`"
    assert edition.relink(text, {"00_welcome"}) == ("[00](00_welcome.ipynb) [02](../02_collectives.ipynb#A) "
                                                    "[r](../../README.zh.md) [w](https://x.org) [s](#B) `[c](c.md)`")


# -- the glossary -------------------------------------------------------------------------------------

def _table(text: str, head: str) -> list[list[str]]:
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.replace(" ", "").startswith(head.replace(" ", "")))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def glossary() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(English, 简体中文) of the translated terms, the rejected renderings, and every preferred rendering."""
    text = GLOSSARY.read_text(encoding="utf-8")
    terms = _table(text, "| English | 简体中文 | 保留英文 | 首次讲授 |")
    rejected = [row[0] for row in _table(text, "| 拒用 | 改用 | 原因 |")]
    translated = [(en, zh) for en, zh, keep, _ in terms if keep == "否"]
    return translated, rejected, [zh for _, zh, _, _ in terms] + [row[1] for row in _table(text, "| 拒用 | 改用 | 原因 |")]


def _names(english: str) -> list[str]:
    """The English a first use may give: ``data parallelism (DP)`` -> the name; ``collective communication
    (collective)`` -> the name and its short form (an abbreviation alone is not enough)."""
    name, _, alias = english.replace("`", "").partition(" (")
    return [name.lower()] + [a.lower() for a in [alias.rstrip(")")] if a and not a.isupper()]


def _gives(paren: str, name: str) -> bool:
    """Whether the bracket's text gives ``name``, allowing another ending (shard for sharding, state for
    states): the text starts with all of ``name`` but its last few letters."""
    common = len(os.path.commonprefix([paren.lower().strip(), name]))
    return common >= min(len(name), max(4, len(name) - 3))


def glossary_problems(text: str) -> list[str]:
    """What ``text`` (a chapter's translation) does against the glossary: a rejected rendering outside an
    editor's note, or a translated term whose first use (the title and headings included) lacks its English in
    （…） right after it. A term inside a longer one (数据并行 in 完全分片数据并行) is not a use of it."""
    translated, rejected, _ = glossary()
    prose = CODE.sub(" ", text).replace("**", "")
    problems = [f"rejected term {bad!r}" for bad in rejected if bad in EDITORS_NOTE.sub(" ", prose)]
    prose = re.sub(r"^#+ ", "", prose, flags=re.M)  # a heading is read first: the chapter's title may gloss a term
    for en, zh in translated:
        masked = prose
        for _, longer in translated:
            if zh in longer and zh != longer:
                masked = masked.replace(longer, "□" * len(longer))
        at = masked.find(zh)
        after = masked[at + len(zh):].split("）", 1)[0] if at >= 0 else ""
        if at >= 0 and not (after.startswith("（") and any(_gives(after[1:], n) for n in _names(en))):
            problems.append(f"first use of {zh!r} is not {zh}（{_names(en)[0]}…）: …{prose[max(0, at - 10):at + 20]}…")
    return problems


def test_glossary_prefers_no_rejected_term():
    _, rejected, preferred = glossary()
    assert rejected and preferred
    assert not [(bad, good) for bad in rejected for good in preferred if bad in good]


@pytest.mark.parametrize("stem", TRANSLATED)
def test_chapter_follows_the_glossary(stem):
    text = "\n\n".join(_zh_texts(stem).values())
    assert glossary_problems(text) == []


def test_glossary_check_catches_a_rejected_term_and_a_bare_first_use():
    text = "\n\n".join(_zh_texts("00_welcome").values())
    assert glossary_problems(text.replace("：流水线并行及其气泡", "：管道并行及其气泡", 1)) == ["rejected term '管道并行'"]
    assert glossary_problems(text + "\n\n排名 0 先开始。") == ["rejected term '排名 0'", "rejected term '排名'"]
    assert glossary_problems("> **编者注：** 原译“管道并行”。\n\n流水线并行（pipeline parallelism，PP）") == []
    [bare] = glossary_problems(text.replace("集合通信（collective communication）", "集合通信", 1))
    assert bare.startswith("first use of '集合通信'")
    assert glossary_problems("分片（shard）与集合通信（collective）") == []  # another ending, the short form
    assert len(glossary_problems("数据并行（DP）")) == 1  # an abbreviation alone is not the English


# -- typography ---------------------------------------------------------------------------------------

def typography_problems(text: str) -> str:
    """autocorrect's fix for ``text`` as a unified diff ("" when it has none): spaces between Chinese and
    Latin letters or digits, full-width punctuation in Chinese sentences."""
    import difflib

    fixed = autocorrect_py.format_for(text, "md")
    return "\n".join(difflib.unified_diff(text.splitlines(), fixed.splitlines(), lineterm="", n=0))


@pytest.mark.parametrize("stem", TRANSLATED)
def test_typography(stem):
    nb = nbformat.read(edition.output(stem, LANG), as_version=4)
    problems = {c.id: typography_problems(c.source) for c in nb.cells if c.cell_type == "markdown"}
    assert not {k: v for k, v in problems.items() if v}


def test_typography_check_catches_a_missing_space():
    assert typography_problems("每个 rank 的编号是 `rank`。") == ""
    assert "每个 rank 的编号" in typography_problems("每个rank 的编号是 `rank`。")


# -- README.zh.md -----------------------------------------------------------------------------------

def test_readme_course_map_times_are_computed():
    stale = edition.sync_readme(LANG)
    assert not stale, "\n".join(stale) + f"\nrun `parlab edition {LANG} --build`"


# -- at run time ----------------------------------------------------------------------------------------

def test_language(monkeypatch, tmp_path):
    monkeypatch.delenv("PARLAB_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert edition.language() == "en"
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "notebooks" / "zh")  # where JupyterLab starts a kernel for notebooks/zh/
    assert edition.language() == "zh"
    monkeypatch.setenv("PARLAB_LANG", "en")
    assert edition.language() == "en"


def test_parlab_run_tells_the_kernel_its_edition(tmp_path, monkeypatch):
    """``parlab run`` on an edition's notebook (``metadata.parlab.edition``) sets ``PARLAB_LANG`` while its kernel
    starts (the kernel inherits it), and not for an English one; no kernel is started here."""
    from parlab.course import chapters

    seen = []
    monkeypatch.delenv("PARLAB_LANG", raising=False)
    monkeypatch.setattr(chapters, "_execute", lambda *args: seen.append(os.environ.get("PARLAB_LANG")) or "")
    nb = nbformat.v4.new_notebook(metadata={"parlab": {"edition": "zh"}})
    for name, meta in (("zh.ipynb", {"edition": "zh"}), ("en.ipynb", {})):
        nb.metadata["parlab"] = meta
        nbformat.write(nb, tmp_path / name)
        assert chapters.run_chapter(tmp_path / name, tmp_path / "out", html=False).passed
    assert seen == ["zh", None] and "PARLAB_LANG" not in os.environ
