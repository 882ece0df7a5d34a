"""A chapter of the Chinese edition runs headless, as the English ones do (``tests/test_notebooks.py``): a scope
of its own under ``./lab test`` (``tests/conftest.py``). The others, chapter 02 among them, run in CI's
``cpu-ci-parameters`` job: the suite's minutes are the limit (``docs/ci.md``)."""

from __future__ import annotations

import pytest

from parlab.course import edition
from test_edition import LANG, ROOT


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["00_welcome"])
def test_chapters_in_chinese_run_headless(stem, tmp_path_factory):
    """``notebooks/zh/00_welcome.ipynb`` runs top to bottom with its CI parameters, in its own folder, as
    tests/test_notebooks.py runs the English chapters (the same helper, recording its asserts), with
    ``PARLAB_LANG=zh``: its exercise checks answer in Chinese."""
    from test_notebooks import _run

    path = edition.output(stem, LANG)
    result, seen = _run(path, True, tmp_path_factory)
    assert result.passed, f"{path.name}: {result.error} (executed copy: {result.output})"
    assert seen, "no assert was reached"
    print(f"{path.relative_to(ROOT)} ran in {result.seconds:.1f} s with its CI parameters")
