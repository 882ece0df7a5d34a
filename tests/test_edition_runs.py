"""Chapters of the Chinese edition run headless, as the English ones do (``tests/test_notebooks.py``): each
run is a scope of its own under ``./lab test`` (``tests/conftest.py``), so that the two share the workers."""

from __future__ import annotations

import pytest

from parlab.course import edition
from test_edition import LANG, ROOT


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["00_welcome", "02_collectives"])
def test_chapters_in_chinese_run_headless(stem, tmp_path_factory):
    """``notebooks/zh/00_welcome.ipynb`` and ``02_collectives.ipynb`` run top to bottom with their CI parameters,
    in their own folder, as tests/test_notebooks.py runs the English chapters (the same helper, recording its
    asserts), with ``PARLAB_LANG=zh``: their exercise checks answer in Chinese. Two short chapters: the suite's
    minutes are the limit (the others run in CI's ``zh`` job)."""
    from test_notebooks import _run

    path = edition.output(stem, LANG)
    result, seen = _run(path, True, tmp_path_factory)
    assert result.passed, f"{path.name}: {result.error} (executed copy: {result.output})"
    assert seen, "no assert was reached"
    print(f"{path.relative_to(ROOT)} ran in {result.seconds:.1f} s with its CI parameters")
