"""Parallelism Lab: a notebook course on training one model on many GPUs.

The public face: :func:`launch` runs a function on N ranks, ``%load_ext parlab`` adds the ``%%ranks``
cell magic, and :func:`rank`, :func:`world_size`, :func:`local_rank`, :func:`device` tell code on a
rank who and where it is. The measuring instruments (chapter 01 on): :func:`estimate_memory`,
:func:`measure_memory`, :func:`count_params`, :func:`record_comm`, :class:`CommLog` and :class:`Timeline`
(``with CommLog() as log:`` records what the course's strategies send inside the block).

The package has three floors, each importing only from itself and the floors below:

- ``parlab.lab``: the lab — the launcher, the models, the strategies (``parlab.lab.parallel``), the
  instruments that attach to them from outside (``parlab.lab.measure``), the plots, chapter 08's job;
- ``parlab.decide``: the decision tools — the guide's rules (``advice``), the planner, the widgets;
- ``parlab.course``: the course's machinery — running chapters, their sizes and times, the magic, the
  exercises' checks, the experiments chapters run, the ``parlab`` command.
"""

import importlib

# The public names, each from the module that defines it, imported on first use (PEP 562): ``import parlab``
# costs nothing, so the ``parlab`` command and the ranks' start-up pay for torch only where they use it.
_PUBLIC = {
    "parlab.lab.launch": ("LaunchError", "RankCrashedError", "RankError", "RankTimeoutError", "launch"),
    "parlab.lab.measure": ("CommLog", "Timeline", "count_params", "estimate_memory", "measure_memory",
                           "record_comm"),
    "parlab.lab.runtime": ("device", "local_rank", "rank", "world_size"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
_FLOORS = ("lab", "decide", "course")

__version__ = "0.1.0"

__all__ = [*_HOME, "load_ipython_extension"]


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    if name in _FLOORS:
        return importlib.import_module(f"parlab.{name}")
    raise AttributeError(f"module 'parlab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOME) | set(_FLOORS))


def load_ipython_extension(ipython):
    """``%load_ext parlab``: registers the ``%%ranks`` cell magic."""
    from parlab.course.magic import register

    register(ipython)
