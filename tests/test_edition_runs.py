"""A chapter of the Chinese edition runs headless, as the English ones do (``tests/test_notebooks.py``), with
``PARLAB_CI_RUNS=1`` (a scope of its own, ``tests/conftest.py``). CI's ``cpu-ci-parameters`` job runs every
Chinese chapter; under ``./lab test`` the suite's minutes are the limit (``docs/ci.md``), and what this run adds
to the English chapter 00's is checked there more cheaply: the code cells are byte-identical to the English
(``test_edition.py``), the kernel is told its edition (``test_parlab_run_tells_the_kernel_its_edition``) and
the exercise checks answer in Chinese (``tests/test_language_exercises_a.py``, chapters 00-05)."""

from __future__ import annotations

import pytest

from parlab.course import edition
from test_edition import LANG, ROOT
from test_notebooks import CI_RUNS


@pytest.mark.slow
@pytest.mark.skipif(not CI_RUNS, reason="the Chinese chapters' runs are the cpu-ci-parameters job's "
                    "(PARLAB_CI_RUNS=1 runs chapter 00 here too; docs/ci.md)")
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
