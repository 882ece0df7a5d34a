"""The language a learner reads the course's messages in: English, or the Chinese edition's (issue #53).

The messages a learner acts on (an exercise check's hint, a rank's error, a hang report, the GPU queue's
place) are written in English as ``say("template {name}", name=value)``: the template is the key, and a
catalog (:data:`CATALOGS`, one module per area in ``parlab/lab/language/``) holds its translation with the same
``{placeholders}``. Names of APIs, arguments and printed tables stay English, in either language.

The language (:func:`current`): ``PARLAB_LANG`` where it is set (``parlab run`` sets ``zh`` for a notebook under
``notebooks/zh/``; a learner may set it in the shell that starts JupyterLab), else the notebook the kernel
runs (JupyterLab names it to the kernel in ``JPY_SESSION_NAME``, and starts the kernel in its folder): one
under a ``zh/`` folder reads Chinese; else English. A template without a translation is said in English.
"""

from __future__ import annotations

import functools
import importlib
import os
import pathlib
import string

#: The languages the course speaks: English (the source) and Simplified Chinese (the edition).
LANGUAGES = ("en", "zh")
#: The catalog modules of each language beside English, each with a ``MESSAGES`` dict: English template →
#: translated template.
CATALOGS = {"zh": ("parlab.lab.language.zh_launch", "parlab.lab.language.zh_exercises_a",
                  "parlab.lab.language.zh_exercises_a2", "parlab.lab.language.zh_exercises_b",
                  "parlab.lab.language.zh_exercises_b2")}


def current() -> str:
    """``"zh"`` or ``"en"``: ``PARLAB_LANG``, else the notebook's folder (``JPY_SESSION_NAME``, else the kernel's
    working folder, ``notebooks/zh/``), else English."""
    chosen = os.environ.get("PARLAB_LANG", "").strip().lower()
    if chosen:
        if chosen not in LANGUAGES:
            raise ValueError(f"PARLAB_LANG={chosen!r}; choose one of {', '.join(LANGUAGES)}")
        return chosen
    notebook = os.environ.get("JPY_SESSION_NAME", "").replace("\\", "/")
    if notebook:
        return "zh" if "/zh/" in f"/{notebook}" else "en"
    cwd = pathlib.Path.cwd()  # JupyterLab starts a notebook's kernel in the notebook's folder
    return cwd.name if cwd.name in LANGUAGES[1:] and cwd.parent.name == "notebooks" else "en"


@functools.cache
def catalog(language: str) -> dict:
    """Every translated template of ``language`` (English: none)."""
    merged = {}
    for name in CATALOGS.get(language, ()):
        merged.update(importlib.import_module(name).MESSAGES)
    return merged


def say(template: str, /, **values) -> str:
    """``template`` filled with ``values``, in the :func:`current` language: its translation where the catalog
    has one, else the English."""
    language = current()
    chosen = catalog(language).get(template, template) if language != "en" else template
    return chosen.format(**values) if values else chosen


def placeholders(template: str) -> set[str]:
    """The ``{names}`` a template fills (a translation must fill the same)."""
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
