"""The course's messages in the learner's language (``parlab.lab.language``, issue #53): every template a
learner can meet has its Chinese, with the same placeholders, and the language follows the edition."""

from __future__ import annotations

import ast
import pathlib

import pytest

from parlab.lab import language

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "parlab"


def said_templates(package: pathlib.Path = PACKAGE) -> dict[str, str]:
    """Every literal template passed to ``say(...)`` in the package, with where it is."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "say"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found[node.args[0].value] = f"{path.relative_to(package)}:{node.lineno}"
    return found


def test_every_template_said_has_its_chinese_with_the_same_placeholders():
    zh, said = language.catalog("zh"), said_templates()
    missing = {t: where for t, where in said.items() if t not in zh}
    assert not missing, f"templates said without a Chinese translation (add them to a zh_*.py catalog): {missing}"
    for template, chinese in zh.items():
        assert language.placeholders(chinese) == language.placeholders(template), (template, chinese)


def test_no_translation_is_left_over():
    """A catalog entry whose English is no longer said anywhere is stale: an English edit orphaned it."""
    said = set(said_templates())
    orphans = [t for t in language.catalog("zh") if t not in said]
    assert not orphans, f"translations of templates no longer said: {orphans}"


def test_the_language_follows_the_setting_then_the_notebook(monkeypatch):
    monkeypatch.delenv("PARLAB_LANG", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/learner/parlab/notebooks/zh/02_collectives.ipynb")
    assert language.current() == "zh"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/learner/parlab/notebooks/02_collectives.ipynb")
    assert language.current() == "en"
    monkeypatch.setenv("PARLAB_LANG", "zh")
    assert language.current() == "zh"
    monkeypatch.setenv("PARLAB_LANG", "fr")
    with pytest.raises(ValueError, match="PARLAB_LANG='fr'; choose one of en, zh"):
        language.current()


def test_say_fills_the_chosen_language(monkeypatch):
    template = "rank {rank} of {world_size}"
    monkeypatch.setitem(language.catalog("zh"), template, "第 {rank} 个 rank（共 {world_size} 个）")
    monkeypatch.setenv("PARLAB_LANG", "zh")
    assert language.say(template, rank=1, world_size=4) == "第 1 个 rank（共 4 个）"
    monkeypatch.setenv("PARLAB_LANG", "en")
    assert language.say(template, rank=1, world_size=4) == "rank 1 of 4"


def test_the_chinese_messages_follow_the_glossary_and_its_typography():
    """The hints and the launcher's messages hold to the edition's glossary (no rejected rendering: 排名 for
    rank, 管道并行, ...) and pass the typography linter, as the chapters do (``tests/test_edition.py``)."""
    import autocorrect_py

    from test_edition import glossary

    _, rejected, _ = glossary()
    zh = language.catalog("zh")
    bad = {t: [r for r in rejected if r in t] for t in zh.values() if any(r in t for r in rejected)}
    assert not bad, bad
    untidy = {t: autocorrect_py.format_for(t, "md") for t in zh.values() if autocorrect_py.format_for(t, "md") != t}
    assert not untidy, untidy
