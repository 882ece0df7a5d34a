"""``parlab.launch``: run one function on N ranks from a notebook cell, and get back what each returned.

The kernel side of the launcher. It decides the mode (NCCL with one GPU per rank, or gloo on CPU),
starts the ranks (forked by the zygote, ``_zygote.py``, or started fresh by the spawn start method,
``_spawn.py``), names the file through which they find each other (a ``FileStore``: no port, no
network), and then runs one event loop (``_loop.py``) that
- prints every line a rank writes, whole and prefixed with its rank;
- collects each rank's result or error, and keeps the root cause when several ranks fail
  (``_diagnosis.py`` says what failed);
- notices a rank killed by a signal, and a collective that cannot complete (the process group's
  timeout, and ranks waiting on peers that have already returned);
- on any failure or interrupt kills every rank, so none outlives the cell.
This module checks the call and drives that loop. Taught in chapter 00; every later chapter runs its
cells through it.
"""

from __future__ import annotations

import os
import sys

from parlab.lab.language import say
from parlab.lab.launch import _pickling
from parlab.lab.launch._loop import _Launch
from parlab.lab.launch.cluster import current_job, run_in_job
from parlab.lab.launch.plan import BACKENDS, make_plan, record_launch

OUTPUTS = ("all", "rank0", "none")
START_METHODS = ("zygote", "spawn")


def default_start_method() -> str:
    """The zygote where it is safe (Linux); spawn on macOS (forking is unsafe once system frameworks are
    loaded) and Windows (no fork at all)."""
    return "zygote" if sys.platform.startswith("linux") else "spawn"


def launch(fn, world_size: int = 2, *, args=(), kwargs=None, backend: str = "auto", timeout: float = 30.0,
           output: str = "all", threads: int | None = None, announce: bool = True,
           start_method: str | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks with ``torch.distributed`` initialised.

    Returns the list of the values each rank returned, indexed by rank (tensors come back on the CPU).
    In a process that torchrun or SLURM started as one rank of a job, it joins that job instead, runs
    ``fn`` on this rank only and returns this rank's value (see :mod:`parlab.lab.launch.cluster`).

    - ``backend``: ``"auto"`` takes NCCL with one GPU per rank when that many GPUs are visible, else gloo
      on CPU; ``"gloo"`` or ``"nccl"`` choose.
    - ``timeout``: seconds a collective may wait for its peers before the launch fails with
      :class:`RankTimeoutError`, showing where each rank was.
    - ``output``: ``"all"`` prints every rank's lines prefixed with its rank, ``"rank0"`` only rank 0's,
      ``"none"`` nothing.
    - ``threads``: CPU threads per rank; by default the cores are shared out among the ranks.
    - ``start_method``: ``"zygote"`` forks the ranks from a helper process that has imported torch once
      (milliseconds; the default on Linux); ``"spawn"`` starts each rank as a fresh Python with
      ``torch.multiprocessing``'s spawn context (seconds, since each imports torch; the default on macOS
      and Windows). Both behave the same in every other way.

    A rank that raises makes the launch raise :class:`RankError` with that rank's traceback; a rank
    killed by a signal, :class:`RankCrashedError`. In both cases and on interrupt every rank is stopped.
    Inside ``fn``, :func:`parlab.rank`, :func:`parlab.world_size` and :func:`parlab.device` tell a rank
    who and where it is. Chapter 00 teaches it.
    """
    __tracebackhide__ = True  # IPython: show the rank's error, not the launcher's frames
    _check_call(fn, args, kwargs, output)
    start_method = _check_start_method(start_method)
    if os.environ.get("PARLAB_IN_RANK"):
        raise RuntimeError("parlab.launch was called inside a rank; launch from the notebook (or script) only")
    job = current_job()
    if job is not None:  # torchrun or SLURM started this process as one rank of a job: join it
        if backend not in BACKENDS:
            raise ValueError(say("backend must be one of {allowed}; got {backend!r}",
                                 allowed=', '.join(map(repr, BACKENDS)), backend=backend))
        return run_in_job(job, fn, tuple(args), kwargs, world_size, backend, timeout, announce)
    plan = make_plan(world_size, backend, timeout, threads)
    record_launch(plan.world_size, backend, plan.device_type, plan.note, plan.gpus, "parlab.launch")
    try:
        payload = _pickling.dumps((fn, tuple(args), kwargs or {}))
    except Exception as exc:  # noqa: BLE001
        raise TypeError(say("{fn} or its arguments cannot be sent to the ranks ({type}: {error}). Functions, "
                            "classes, tensors and plain values travel; open files, sockets, locks and generators "
                            "do not.", fn=getattr(fn, '__name__', 'fn'), type=type(exc).__name__,
                            error=exc)) from None
    run = _Launch(plan, payload, output, start_method, announce)
    try:
        run.start()
        return run.run()
    except KeyboardInterrupt:
        run.announce()
        run.close()  # every rank is gone before the interrupt propagates
        print(f"parlab: interrupted; stopped {plan.world_size} ranks", file=sys.stderr, flush=True)
        raise
    except BaseException:
        run.announce()
        raise
    finally:
        run.close()


def _check_call(fn, args, kwargs, output: str) -> None:
    if not callable(fn):
        raise TypeError(say("fn must be callable: a function each rank runs, like `def work(): ...`; got {type} "
                            "{fn!r:.60}", type=type(fn).__name__, fn=fn))
    if output not in OUTPUTS:
        raise ValueError(say("output must be one of {allowed}; got {output!r}", allowed=', '.join(map(repr, OUTPUTS)),
                             output=output))
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(say("kwargs must be a dict or None; got {type}", type=type(kwargs).__name__))
    if not isinstance(args, (tuple, list)):
        raise TypeError(say("args must be a tuple or list of positional arguments; got {type}",
                            type=type(args).__name__))


def _check_start_method(start_method: str | None) -> str:
    if start_method is None:
        return default_start_method()
    if start_method not in START_METHODS:
        raise ValueError(say("start_method must be one of {allowed} or None (this platform's default, "
                             "{default!r}); got {start_method!r}", allowed=', '.join(map(repr, START_METHODS)),
                             default=default_start_method(), start_method=start_method))
    if start_method == "zygote" and not hasattr(os, "fork"):
        raise ValueError(say("start_method='zygote' forks the ranks, and this platform cannot fork; use "
                             "start_method='spawn' (the default here)"))
    return start_method
