"""One launch, as the kernel runs it: start the ranks, then one event loop until every rank has answered.

The loop (:class:`_Launch`) prints every line a rank writes, whole and prefixed with its rank; collects
each rank's result or error; notices a rank killed by a signal, and ranks waiting in a collective on peers
that have already returned; and on any failure or interrupt kills every rank, so none outlives the cell.
What a failure then says is ``_diagnosis.py``'s; :func:`parlab.lab.launch.launch` (``launcher.py``) checks the
call and drives this.
"""

from __future__ import annotations

import collections
import linecache
import os
import pickle
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait

from parlab.lab.language import say
from parlab.lab.launch import _diagnosis, _pickling, lease
from parlab.lab.launch._zygote import _zygote_lock, _zygote_with
from parlab.lab.launch.errors import LaunchError, RankTimeoutError
from parlab.lab.launch.plan import Plan
from parlab.lab.runtime import NO_GPUS

# Modules that take seconds to import. When the kernel has imported one, its ranks will likely need it
# too: the zygote imports it once, instead of every rank on every launch.
HEAVY_MODULES = ("transformers", "torch.nn.parallel.distributed", "torch.distributed.fsdp",
                 "torch.distributed.tensor.parallel", "torch.distributed.pipelining")


STORE_PREFIX = "parlab-store-"  # then the kernel's pid: a store whose kernel has ended is stale

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
            from parlab.lab.launch import launcher  # looked up now: the platform's default, as launch() sees it

            if launcher.default_start_method() == "zygote":
                line += " (start_method='zygote' starts them in milliseconds)"
        print(line, flush=True)

    # -- starting ------------------------------------------------------------------------------------
    def start(self) -> None:
        clean_stale_stores()  # a kernel that was killed mid-launch left its store behind
        fd, self.store_path = tempfile.mkstemp(prefix=f"{STORE_PREFIX}{os.getpid()}-")
        os.close(fd)
        common = {
            "world_size": self.plan.world_size, "backend": self.plan.backend,
            "device_type": self.plan.device_type, "timeout": self.plan.timeout,
            "threads": self.plan.threads, "store_path": self.store_path, "sys_path": list(sys.path),
            "cwd": os.getcwd(), "linecache": _cell_sources(), "warning_filters": _pickling.warning_filters(),
            "payload": self.payload,
        }
        # The ranks first (a kernel's first launch starts the zygote: seconds of importing torch), then the
        # GPUs: a lease is never held while the ranks are still starting.
        self.gpus = ranks_then_lease(self._start_ranks, self._lease)
        base_env = dict(os.environ)
        base_env.update(
            WORLD_SIZE=str(self.plan.world_size), LOCAL_WORLD_SIZE=str(self.plan.world_size),
            PARLAB_IN_RANK="1", OMP_NUM_THREADS=str(self.plan.threads), PYTHONUNBUFFERED="1",
        )
        # GPU mode: the leased GPUs (all visible ones without a lease). CPU mode: none at all, set before the
        # rank starts, so that nothing it runs (a profiler, Timeline, the Trainer) touches a GPU it was not given.
        base_env.update(self.gpus.env if self.plan.device_type == "cuda" else {"CUDA_VISIBLE_DEVICES": NO_GPUS})
        base_env.update(gloo_interface(self.plan.group_backend, base_env))  # GPU mode's gloo half too
        shared = pickle.dumps(common, protocol=pickle.HIGHEST_PROTOCOL)  # once: it holds the payload
        for r in self.ranks:
            device = f"cuda:{r.rank}" if self.plan.device_type == "cuda" else "cpu"
            env = dict(base_env, RANK=str(r.rank), LOCAL_RANK=str(r.rank), PARLAB_DEVICE=device)
            own = pickle.dumps({"rank": r.rank, "local_rank": r.rank, "env": env}, protocol=pickle.HIGHEST_PROTOCOL)
            # A rank that died before reading its spec is reported by its exit, below.
            _try(r.ctrl.send_bytes, shared)
            _try(r.ctrl.send_bytes, own)

    def _start_ranks(self) -> None:
        """Start every rank; each waits for its spec, touching no GPU until then."""
        if self.start_method == "zygote":
            with _zygote_lock:
                zygote = _zygote_with(_auto_preloads())
                for rank in range(self.plan.world_size):
                    self._add(rank, zygote.spawn())
        else:
            from parlab.lab.launch._spawn import SpawnedRank

            for rank in range(self.plan.world_size):
                self._add(rank, SpawnedRank(rank))

    def _lease(self) -> lease.Lease:
        """GPU mode: on a shared machine, GPUs no other launch holds (lease.py); it may wait its turn. CPU
        mode: nothing to hold, but the moment the ranks get their spec is noted all the same."""
        if self.plan.device_type == "cuda":
            return lease.acquire(self.plan.world_size, what=f"{self.plan.world_size} ranks")
        return lease.Lease(granted_at=time.monotonic())

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
            if decide_at is not None and any(_diagnosis.is_root(r) for r in self.failures):
                decide_at = min(decide_at, self.failures[0].finished_at + self.GATHER)
            if decide_at is not None and now >= decide_at:
                raise self._failure()
            finished = [r.finished_at for r in self.ranks if r.state == "ok"]
            if finished and running and now - min(finished) > self.plan.timeout and now >= next_probe:
                # Peers have returned long ago. A rank waiting in a collective now waits for nobody: a
                # hang. A rank busy elsewhere (rank 0 evaluating or saving alone) is working: look again
                # a timeout later.
                self.probe_stacks(running)
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
        self.drain(deadline=time.monotonic() + 5.0)
        results = []
        for r in self.ranks:
            try:
                results.append(_pickling.loads(r.result))
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(say("rank {rank} returned a value the notebook cannot unpickle: {type}: {error}",
                                      rank=r.rank, type=type(exc).__name__, error=exc)) from None
        return results

    def probe_stacks(self, ranks: list[_Rank]) -> None:
        """Ask running ranks where they are; their answers land in ``r.stack`` (text, in a collective?)."""
        for r in ranks:
            r.stack = None
            _try(r.ctrl.send_bytes, b"stack")
        deadline = time.monotonic() + 2.0
        while any(r.stack is None and r.state == "running" for r in ranks) and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())

    def _failure(self) -> LaunchError:
        return _diagnosis.failure(self)

    def _hang(self) -> RankTimeoutError:
        return _diagnosis.hang(self)

    # -- teardown ------------------------------------------------------------------------------------
    def stop(self) -> None:
        for r in self.ranks:
            if not r.exited:
                r.proc.kill()

    def drain(self, deadline: float) -> None:
        """Read what is left of the ranks' output and wait for them to exit; kill stragglers."""
        while self.sources and time.monotonic() < deadline:
            if all(r.exited for r in self.ranks) and "out" not in {what for _, what in self.sources.values()}:
                break
            self._pump(min(0.2, deadline - time.monotonic()))
        self.stop()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.stop()
        self.drain(deadline=time.monotonic() + 3.0)
        self.gpus.release()  # every rank has exited: the GPUs are free again
        self.sources.clear()
        for r in self.ranks:
            r.proc.close()
        if self.store_path is not None:
            _try(os.unlink, self.store_path)


def ranks_then_lease(start_ranks, take_lease) -> lease.Lease:
    """A launch's start, in its order: ``start_ranks()``, then ``take_lease()``, whose lease it returns.

    Starting the ranks can take seconds: a kernel's first launch starts the zygote, which imports torch
    (spawned ranks import it on every launch). The ranks then wait for their spec, and cannot touch a GPU
    before it comes: its environment names the leased GPUs (``CUDA_VISIBLE_DEVICES``). So the GPUs are
    leased only now, and no GPU waits idle while a rank starts. If leasing fails or is interrupted, the
    caller's ``close()`` kills the ranks. ``benchmarks/workshop.py`` simulates a workshop through this
    same function, so the simulation keeps the launcher's order."""
    start_ranks()
    return take_lease()


def clean_stale_stores(folder: str | None = None) -> list[str]:
    """Remove rendezvous store files (``parlab-store-<pid>-*``) whose kernel has ended; returns them.
    A launch removes its own when it ends; a kernel killed during a launch cannot."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(STORE_PREFIX)]
    except OSError:
        return removed
    for name in names:
        pid = name[len(STORE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except OSError:  # another user's, in a sticky folder; or removed by someone else just now
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _cell_sources() -> dict:
    """linecache entries with no file behind them (notebook cells), so ranks' tracebacks show the code."""
    return {name: entry for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and (entry[1] is None or name.startswith("<"))}


def gloo_interface(backend: str, env: dict) -> dict:
    """``GLOO_SOCKET_IFNAME`` for a launch's ranks: all of them are on this machine, so gloo's traffic stays
    on loopback, for plain ``gloo`` and for GPU mode's gloo half (``cpu:gloo,cuda:nccl``) alike; a value the
    environment already has is kept."""
    if "gloo" not in backend or "GLOO_SOCKET_IFNAME" in env:
        return {}
    loopback = _loopback_interface()
    return {"GLOO_SOCKET_IFNAME": loopback} if loopback else {}


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
