"""``parlab.launch``: run one function on N ranks from a notebook cell, and get back what each returned.

The kernel side of the launcher. It decides the mode (NCCL with one GPU per rank, or gloo on CPU),
starts the ranks (forked by the zygote, ``_zygote.py``, or started fresh by the spawn start method,
``_spawn.py``), names the file through which they find each other (a ``FileStore``: no port, no
network), and then runs one event loop that
- prints every line a rank writes, whole and prefixed with its rank;
- collects each rank's result or error, and keeps the root cause when several ranks fail;
- notices a rank killed by a signal, and a collective that cannot complete (the process group's
  timeout, and ranks waiting on peers that have already returned);
- on any failure or interrupt kills every rank, so none outlives the cell.
Taught in chapter 00; every later chapter runs its cells through it.
"""

from __future__ import annotations

import collections
import linecache
import os
import pickle
import re
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait

from parlab.launch import _pickling, lease
from parlab.launch._zygote import _zygote_lock, _zygote_with
from parlab.launch.cluster import current_job, run_in_job
from parlab.launch.errors import (
    LaunchError,
    RankCrashedError,
    RankError,
    RankTimeoutError,
    describe_exit,
)
from parlab.launch.plan import BACKENDS, Plan, make_plan, record_launch
from parlab.runtime import NO_GPUS

OUTPUTS = ("all", "rank0", "none")
START_METHODS = ("zygote", "spawn")


def default_start_method() -> str:
    """The zygote where it is safe (Linux); spawn on macOS (forking is unsafe once system frameworks are
    loaded) and Windows (no fork at all)."""
    return "zygote" if sys.platform.startswith("linux") else "spawn"


# Modules that take seconds to import. When the kernel has imported one, its ranks will likely need it
# too: the zygote imports it once, instead of every rank on every launch.
HEAVY_MODULES = ("transformers", "torch.nn.parallel.distributed", "torch.distributed.fsdp",
                 "torch.distributed.tensor.parallel", "torch.distributed.pipelining")


# torch modules that ranks had to import themselves (reported by _worker._report_imports), in order.
_rank_imports: dict[str, None] = {}


def _auto_preloads() -> list[str]:
    """What the zygote should import before forking: the heavy modules the kernel uses, and the torch
    modules earlier ranks imported (a cost paid once, at this launch, instead of by every later rank)."""
    return [m for m in list(sys.modules) if m in HEAVY_MODULES
            or (m.startswith("transformers.models.") and ".modeling_" in m)] + list(_rank_imports)


class _Rank:
    def __init__(self, rank, proc):
        self.rank, self.proc = rank, proc  # proc: a _zygote.ForkedRank or a _spawn.SpawnedRank
        self.pid, self.ctrl = proc.pid, proc.ctrl
        self.partial = {1: b"", 2: b""}
        self.state = "running"  # running | ok | raised | unpicklable | dead
        self.ready = False  # has joined the process group
        self.result = None
        self.error: dict | None = None
        self.exitcode: int | None = None
        self.exited = False
        self.finished_at: float | None = None
        self.stack: tuple[str, bool] | None = None  # (where, in a collective?) when asked
        self.last_err = collections.deque(maxlen=15)


class _Launch:
    GRACE = 1.0  # seconds to wait for the root cause once a rank reports a communication failure
    GATHER = 0.2  # seconds to hear from the other ranks once one reports a cause of its own

    def __init__(self, plan: Plan, payload: bytes, output: str, start_method: str, announce: bool):
        self.plan, self.payload, self.output, self.start_method = plan, payload, output, start_method
        self.ranks: list[_Rank] = []
        self.sources: dict = {}  # what to wait on -> (rank, "ctrl" | "out" | "exit")
        self.failures: list[_Rank] = []  # in order of arrival
        self.width = len(str(plan.world_size - 1))
        self.closed = False
        self.gpus = lease.Lease()  # the GPUs this launch holds (none on CPU, or without PARLAB_GPUS)
        self.store_path: str | None = None
        self.started_at = time.monotonic()
        # The zygote's ranks start in milliseconds: say what runs at once. Spawn's take seconds: say so,
        # measured, once they have started (or at the first thing a rank prints or fails with).
        self.announce_pending = announce
        if announce and start_method == "zygote":
            self.announce()

    def announce(self) -> None:
        if not self.announce_pending:
            return
        self.announce_pending = False
        line = self.plan.describe()
        if self.start_method == "spawn":
            took = time.monotonic() - self.started_at
            if any(r.ready for r in self.ranks):
                line += f" · spawn: the ranks took {took:.1f} s to start, each importing torch"
            else:
                line += f" · spawn: the ranks are still starting after {took:.1f} s, each importing torch"
            if default_start_method() == "zygote":
                line += " (start_method='zygote' starts them in milliseconds)"
        print(line, flush=True)

    # -- starting ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.plan.device_type == "cuda":  # on a shared machine, GPUs no other launch holds (lease.py)
            self.gpus = lease.acquire(self.plan.world_size, what=f"{self.plan.world_size} ranks")
        fd, self.store_path = tempfile.mkstemp(prefix="parlab-store-")
        os.close(fd)
        common = {
            "world_size": self.plan.world_size, "backend": self.plan.backend,
            "device_type": self.plan.device_type, "timeout": self.plan.timeout,
            "threads": self.plan.threads, "store_path": self.store_path, "sys_path": list(sys.path),
            "cwd": os.getcwd(), "linecache": _cell_sources(), "warning_filters": _pickling.warning_filters(),
            "payload": self.payload,
        }
        base_env = dict(os.environ)
        base_env.update(
            WORLD_SIZE=str(self.plan.world_size), LOCAL_WORLD_SIZE=str(self.plan.world_size),
            PARLAB_IN_RANK="1", OMP_NUM_THREADS=str(self.plan.threads), PYTHONUNBUFFERED="1",
        )
        # GPU mode: the leased GPUs (all visible ones without a lease). CPU mode: none at all, set before the
        # rank starts, so that nothing it runs (a profiler, Timeline, the Trainer) touches a GPU it was not given.
        base_env.update(self.gpus.env if self.plan.device_type == "cuda" else {"CUDA_VISIBLE_DEVICES": NO_GPUS})
        if self.plan.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in base_env:
            loopback = _loopback_interface()
            if loopback:  # all ranks are on this machine: keep their traffic on loopback
                base_env["GLOO_SOCKET_IFNAME"] = loopback
        if self.start_method == "zygote":
            with _zygote_lock:
                zygote = _zygote_with(_auto_preloads())
                for rank in range(self.plan.world_size):
                    self._add(rank, zygote.spawn())
        else:
            from parlab.launch._spawn import SpawnedRank

            for rank in range(self.plan.world_size):
                self._add(rank, SpawnedRank(rank))
        shared = pickle.dumps(common, protocol=pickle.HIGHEST_PROTOCOL)  # once: it holds the payload
        for r in self.ranks:
            device = f"cuda:{r.rank}" if self.plan.device_type == "cuda" else "cpu"
            env = dict(base_env, RANK=str(r.rank), LOCAL_RANK=str(r.rank), PARLAB_DEVICE=device)
            own = pickle.dumps({"rank": r.rank, "local_rank": r.rank, "env": env}, protocol=pickle.HIGHEST_PROTOCOL)
            # A rank that died before reading its spec is reported by its exit, below.
            _try(r.ctrl.send_bytes, shared)
            _try(r.ctrl.send_bytes, own)

    def _add(self, rank: int, proc) -> None:
        r = _Rank(rank, proc)
        self.ranks.append(r)
        for source in proc.outputs:
            self.sources[source] = (r, "out")
        self.sources[r.ctrl] = (r, "ctrl")
        self.sources[proc.exit_event] = (r, "exit")

    # -- the event loop ------------------------------------------------------------------------------
    def _handle(self, source) -> None:
        r, what = self.sources[source]
        if what == "out":
            data = r.proc.read(source)
            stream = r.proc.outputs[source]
            if not data:
                del self.sources[source]
                if r.partial[stream]:
                    self._emit(r, stream, r.partial[stream])
                    r.partial[stream] = b""
                return
            *lines, r.partial[stream] = (r.partial[stream] + data).split(b"\n")
            for line in lines:
                self._emit(r, stream, line)
        elif what == "ctrl":
            try:
                kind, body = pickle.loads(r.ctrl.recv_bytes())
            except (EOFError, OSError):
                del self.sources[source]
                return
            if kind == "stack":
                r.stack = body
                return
            if kind == "ready":
                r.ready = True
                self.announce()
                return
            if kind == "imported":
                _rank_imports.update(dict.fromkeys(body))
                return
            r.finished_at = time.monotonic()
            if kind == "ok":
                r.state, r.result = "ok", body
            else:
                r.state, r.error = kind, body
                self.failures.append(r)
        elif what == "exit":
            del self.sources[source]
            r.exited = True
            r.exitcode = r.proc.exit_code()
            if r.state == "running":
                r.state = "dead"
                r.finished_at = time.monotonic()
                self.failures.append(r)

    def _emit(self, r: _Rank, stream: int, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        if stream == 2:
            r.last_err.append(text)
        if self.output == "none" or (self.output == "rank0" and r.rank != 0):
            return
        self.announce()
        target = sys.stdout if stream == 1 else sys.stderr
        target.write(f"[rank {r.rank:>{self.width}}] {text}\n")

    def _pump(self, timeout: float) -> None:
        ready = wait(list(self.sources), timeout=max(0.0, timeout))
        # Messages before exits: a rank's report explains its exit.
        order = {"ctrl": 0, "out": 1, "exit": 2}
        for source in sorted(ready, key=lambda s: order[self.sources[s][1]]):
            if source in self.sources:
                self._handle(source)
        sys.stdout.flush()
        sys.stderr.flush()

    def run(self) -> list:
        __tracebackhide__ = True
        decide_at, next_probe = None, 0.0
        while True:
            now = time.monotonic()
            running = [r for r in self.ranks if r.state == "running"]
            if not running and not self.failures:
                break
            if self.failures and decide_at is None:
                first = self.failures[0]
                own_cause = first.state in ("dead", "unpicklable") or first.error.get("kind") == "own"
                decide_at = now + (self.GATHER if own_cause else self.GRACE)
            if decide_at is not None and any(self._is_root(r) for r in self.failures):
                decide_at = min(decide_at, self.failures[0].finished_at + self.GATHER)
            if decide_at is not None and now >= decide_at:
                raise self._failure()
            finished = [r.finished_at for r in self.ranks if r.state == "ok"]
            if finished and running and now - min(finished) > self.plan.timeout and now >= next_probe:
                # Peers have returned long ago. A rank waiting in a collective now waits for nobody: a
                # hang. A rank busy elsewhere (rank 0 evaluating or saving alone) is working: look again
                # a timeout later.
                self._probe_stacks(running)
                if any(r.stack is not None and r.stack[1] for r in running):
                    raise self._hang()
                next_probe = time.monotonic() + self.plan.timeout
            wait_for = 0.5
            if decide_at is not None:
                wait_for = min(wait_for, decide_at - now)
            self._pump(wait_for)
        return self._finish()

    # -- outcomes ------------------------------------------------------------------------------------
    def _finish(self) -> list:
        for r in self.ranks:
            _try(r.ctrl.send_bytes, b"done")
        self._drain(deadline=time.monotonic() + 5.0)
        results = []
        for r in self.ranks:
            try:
                results.append(_pickling.loads(r.result))
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"rank {r.rank} returned a value the notebook cannot unpickle: "
                                  f"{type(exc).__name__}: {exc}") from None
        return results

    @staticmethod
    def _is_root(r: _Rank) -> bool:
        return r.state in ("dead", "unpicklable") or (r.state == "raised" and r.error["kind"] == "own")

    def _statuses(self) -> dict[int, str]:
        out = {}
        for r in self.ranks:
            if r.state == "ok":
                out[r.rank] = "had returned"
            elif r.state == "raised":
                if r.error["kind"] == "comm":  # its first sentence says enough; the cause is reported above
                    out[r.rank] = (f"raised {r.error['type']}: {_sentence(r.error['message'], first=True)} "
                                   f"(a follow-on error: a rank it was talking to had gone)")
                else:
                    out[r.rank] = f"raised {r.error['type']}: {_sentence(r.error['message'])}"
            elif r.state == "dead":
                out[r.rank] = describe_exit(r.exitcode)
            elif r.state == "unpicklable":
                out[r.rank] = "returned a value that cannot be pickled"
            else:
                out[r.rank] = "was still running; stopped by parlab"
        return out

    def _failure(self) -> LaunchError:
        statuses = self._statuses()
        roots = [r for r in self.failures if self._is_root(r)]
        if not roots and all(r.state == "raised" and r.error["kind"] == "timeout" for r in self.failures):
            return self._hang()
        r = (roots or self.failures)[0]
        ws = self.plan.world_size
        if r.state == "dead" and any("Watchdog caught collective operation timeout" in line for line in r.last_err):
            return self._hang()  # NCCL's watchdog aborts a rank whose collective timed out
        if r.state == "dead":
            self._stop()
            self._drain(deadline=time.monotonic() + 1.0)  # its last words may still be in the pipe
            return RankCrashedError(r.rank, ws, r.exitcode, tuple(r.last_err), statuses)
        if r.state == "unpicklable":
            return LaunchError(
                f"rank {r.rank} of {ws} returned a value that cannot be pickled ({r.error}), so it cannot "
                f"travel back to the notebook. Return plain values: numbers, strings, lists, dicts, numpy "
                f"arrays or tensors.", statuses=statuses)
        err = r.error
        original = None
        if err["exception"] is not None:
            try:
                original = _pickling.loads(err["exception"])
            except Exception:  # noqa: BLE001
                original = None
        return RankError(r.rank, ws, err["type"], err["message"], _cell_names(err["traceback"]), original,
                         statuses)

    def _probe_stacks(self, ranks: list[_Rank]) -> None:
        """Ask running ranks where they are; their answers land in ``r.stack`` (text, in a collective?)."""
        for r in ranks:
            r.stack = None
            _try(r.ctrl.send_bytes, b"stack")
        deadline = time.monotonic() + 2.0
        while any(r.stack is None and r.state == "running" for r in ranks) and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())

    def _hang(self) -> RankTimeoutError:
        self._probe_stacks([r for r in self.ranks if r.state == "running"])
        statuses = self._statuses()
        now, timeout = time.monotonic(), self.plan.timeout
        stacks, waited, returned, busy = {}, [], [], []
        for r in self.ranks:
            if r.state == "ok":
                returned.append(r.rank)
                stacks[r.rank] = f"had returned from its function {now - r.finished_at:.1f} s before"
            elif r.state == "raised":
                waited.append(r.rank)
                stacks[r.rank] = (f"waited in a collective until it timed out "
                                  f"({_gloo_message(r.error['message'])}), at:\n{_indent(_cell_names(r.error['where']))}")
            elif r.stack is not None:
                text, in_collective = r.stack
                (waited if in_collective else busy).append(r.rank)
                what = "waiting in a collective" if in_collective else "busy outside any collective"
                stacks[r.rank] = f"{what}, at:\n{_indent(_cell_names(text))}"
            else:
                stacks[r.rank] = statuses[r.rank]
        parts = []
        if waited:
            parts.append(f"{_ranks(waited)} waited {timeout:g} s in a collective")
        if busy:
            parts.append(f"{_ranks(busy)} {'was' if len(busy) == 1 else 'were'} still busy elsewhere "
                         f"(if it is just slow, raise timeout)")
        if returned:
            parts.append(f"{_ranks(returned)} had already returned" + (", so never joined it" if waited else ""))
        return RankTimeoutError(timeout, self.plan.world_size, stacks, statuses, "; ".join(parts))

    # -- teardown ------------------------------------------------------------------------------------
    def _stop(self) -> None:
        for r in self.ranks:
            if not r.exited:
                r.proc.kill()

    def _drain(self, deadline: float) -> None:
        """Read what is left of the ranks' output and wait for them to exit; kill stragglers."""
        while self.sources and time.monotonic() < deadline:
            if all(r.exited for r in self.ranks) and "out" not in {what for _, what in self.sources.values()}:
                break
            self._pump(min(0.2, deadline - time.monotonic()))
        self._stop()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop()
        self._drain(deadline=time.monotonic() + 3.0)
        self.gpus.release()  # every rank has exited: the GPUs are free again
        self.sources.clear()
        for r in self.ranks:
            r.proc.close()
        if self.store_path is not None:
            _try(os.unlink, self.store_path)


def launch(fn, world_size: int = 2, *, args=(), kwargs=None, backend: str = "auto", timeout: float = 30.0,
           output: str = "all", threads: int | None = None, announce: bool = True,
           start_method: str | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks with ``torch.distributed`` initialised.

    Returns the list of the values each rank returned, indexed by rank (tensors come back on the CPU).
    In a process that torchrun or SLURM started as one rank of a job, it joins that job instead, runs
    ``fn`` on this rank only and returns this rank's value (see :mod:`parlab.launch.cluster`).

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
    if not callable(fn):
        raise TypeError(f"fn must be callable: a function each rank runs, like `def work(): ...`; got "
                        f"{type(fn).__name__} {fn!r:.60}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(map(repr, OUTPUTS))}; got {output!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None; got {type(kwargs).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments; got {type(args).__name__}")
    start_method = _check_start_method(start_method)
    if os.environ.get("PARLAB_IN_RANK"):
        raise RuntimeError("parlab.launch was called inside a rank; launch from the notebook (or script) only")
    job = current_job()
    if job is not None:  # torchrun or SLURM started this process as one rank of a job: join it
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
        return run_in_job(job, fn, tuple(args), kwargs, world_size, backend, timeout, announce)
    plan = make_plan(world_size, backend, timeout, threads)
    record_launch(plan.world_size, backend, plan.device_type, plan.note, plan.gpus, "parlab.launch")
    try:
        payload = _pickling.dumps((fn, tuple(args), kwargs or {}))
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"{getattr(fn, '__name__', 'fn')} or its arguments cannot be sent to the ranks "
                        f"({type(exc).__name__}: {exc}). Functions, classes, tensors and plain values travel; "
                        f"open files, sockets, locks and generators do not.") from None
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


def _check_start_method(start_method: str | None) -> str:
    if start_method is None:
        return default_start_method()
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {', '.join(map(repr, START_METHODS))} or None (this "
                         f"platform's default, {default_start_method()!r}); got {start_method!r}")
    if start_method == "zygote" and not hasattr(os, "fork"):
        raise ValueError("start_method='zygote' forks the ranks, and this platform cannot fork; use "
                         "start_method='spawn' (the default here)")
    return start_method


# ----------------------------------------------------------------------------------------------------


def _cell_sources() -> dict:
    """linecache entries with no file behind them (notebook cells), so ranks' tracebacks show the code."""
    return {name: entry for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and (entry[1] is None or name.startswith("<"))}


def _cell_names(text: str) -> str:
    """Name notebook cells as IPython does (``Cell In[12]``) instead of by their temporary file."""
    try:
        from IPython import get_ipython
    except ImportError:
        return text
    shell = get_ipython()
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    for filename, number in cells.items():
        text = text.replace(f'File "{filename}"', f"Cell In[{number}]")
    return text


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def _try(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def _sentence(text: str, limit: int = 200, first: bool = False) -> str:
    """A message in one line for a rank's status: its first line, without the source file gloo prefixes
    (``[.../pair.cc:553] ``), and when longer than ``limit`` cut after a whole sentence, never mid-word;
    ``first``: only its first sentence."""
    # gloo's prefix, also as "[enforce fail at .../pair.cc:446] "
    line = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", (text.strip().splitlines() or [""])[0])
    if first and ". " in line[:limit]:
        return line[:line.index(". ") + 1]
    if len(line) <= limit:
        return line
    cut = line[:limit]
    end = max(cut.rfind(". "), cut.rfind("; "))
    if end >= 40:
        return cut[:end + 1]
    return cut[:cut.rfind(" ")].rstrip(",;:") + " …"


def _gloo_message(text: str) -> str:
    """gloo prefixes its messages with its source file; the learner needs the sentence."""
    return _sentence(re.sub(r"^\[[^\]]*\]\s*", "", text.strip()))


def _indent(text: str) -> str:
    return "".join(f"      {line}\n" for line in text.rstrip().splitlines())
