"""What one rank runs: in a process the zygote forked, or one that the spawn start method started.

The kernel sends plain dicts (the *spec*) over the rank's control connection. The rank takes on the
kernel's environment, ``sys.path``, working directory, warning filters and cell sources (so tracebacks
show cell lines), joins the process group, tells the kernel it is ready, runs the function and sends back
its result or its error.

The ranks meet through a ``FileStore`` (a file the kernel names), not a ``TCPStore``: a TCPStore client
looks up the host name of the address it connects to (``getnameinfo`` without ``NI_NUMERICHOST``), so
joining depends on the machine's DNS resolver, and a resolver that drops the query stalls that rank for
its timeout (5 s by default). Ranks on one machine need no network to find each other.

It then keeps its process group open until the kernel says ``done``: a rank that tore down early would
make its peers fail with "Connection closed by peer", hiding the real cause. A watcher thread answers
requests for the rank's current stack (shown when a collective hangs) and ends the process at once if
the kernel disappears, so no rank outlives its notebook. Taught in chapter 00.
"""

from __future__ import annotations

import datetime
import io
import linecache
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from parlab.lab.launch import _pickling
from parlab.lab.launch.errors import classify_exception
from parlab.lab import runtime
from parlab.lab.runtime import GPU_MODE_BACKEND

_LAUNCH_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames in these files are the launcher's plumbing, not the learner's code.
_PLUMBING = _LAUNCH_DIR + os.sep


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


class _Channel:
    """The rank's end of the control connection: locked sends, and a watcher thread for requests."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.finished = False  # the function returned or raised; its report is on the way
        self.main_thread = threading.main_thread().ident
        self.nccl = False  # GPU mode: a rank waiting on a peer blocks in synchronize() or .item() too
        self.draining = False  # returned, and waiting for the GPU work it queued (see run)

    def send(self, msg) -> None:
        with self.lock:
            self.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def watch(self) -> None:
        while True:
            try:
                msg = self.conn.recv_bytes()
            except (EOFError, OSError):
                os._exit(1)  # the kernel is gone: never outlive it
            if msg == b"done":
                self.done.set()
            elif msg == b"stack" and self.draining:
                self.send(("stack", (DRAINING, True)))
            elif msg == b"stack" and not self.finished:  # once finished, the report itself answers
                frame = sys._current_frames().get(self.main_thread)
                frames = list(traceback.extract_stack(frame)) if frame else []
                self.send(("stack", _describe_stack(frames, nccl=self.nccl)))


# What a rank is doing when it has returned but its GPU still runs a collective that a peer never joined.
DRAINING = ("(the function returned; the rank waits for the GPU work it queued: under NCCL a collective "
            "returns when it is queued, and this one's peers never came)\n")


# Where an NCCL rank waits for a peer: NCCL queues the collective and returns, so the host blocks later,
# when it needs the result: in a synchronize, or in a copy to the host (.item(), .tolist(), .cpu()).
_HOST_WAITS = ("synchronize", ".item()", ".tolist()", ".cpu()", ".numpy()")


def _describe_stack(frames: list, nccl: bool = False) -> tuple[str, bool]:
    """The user's frames, and whether the innermost call is a torch.distributed one (under NCCL, also a
    wait for the GPU: a collective whose peers never came blocks there)."""
    frames = _user_frames(frames)
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    cut = len(frames)
    while cut > 0 and os.path.abspath(frames[cut - 1].filename).startswith(torch_dir):
        cut -= 1
    inner = [f.name for f in frames[cut:] if f.name not in ("wrapper", "wait")]
    in_collective = any(f"torch{os.sep}distributed" in f.filename for f in frames[cut:])
    if nccl and not in_collective:
        line = (frames[cut - 1].line or "") if cut else ""
        in_collective = any(f.name == "synchronize" for f in frames[cut:]) or any(w in line for w in _HOST_WAITS)
    text = "".join(traceback.format_list(frames[:cut])) or "(no Python frame)\n"
    if inner:
        text += f"  (inside torch: {inner[0]})\n"
    return text, in_collective


def _user_frames(frames: list) -> list:
    """The learner's frames: the zygote's, the worker's and the launcher's own are noise to them."""
    user = [f for f in frames
            if not (f.filename.startswith("<frozen") or os.path.abspath(f.filename).startswith(_PLUMBING))]
    return user or frames


def _format_exception(exc: BaseException) -> str:
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list(_user_frames(list(te.stack)))
    return "".join(te.format())


# GPU mode: how much longer than the launch's timeout the group's is. At the launch's timeout the launcher
# asks each live rank where it is (the hang report); NCCL's watchdog, at the group's timeout, aborts the
# rank. Equal timeouts raced: the report often found ranks already dead. With gloo the waiting rank raises
# at the group's timeout, which the report reads, so there the two stay equal.
NCCL_WATCHDOG_MARGIN = 60.0


def group_timeout(spec: dict) -> float:
    """The process group's timeout in seconds for a rank of ``spec``: the launch's, plus
    ``NCCL_WATCHDOG_MARGIN`` in GPU mode so that the launcher's hang report comes before NCCL's abort."""
    return spec["timeout"] + (NCCL_WATCHDOG_MARGIN if spec["device_type"] == "cuda" else 0.0)


def _init_process_group(spec: dict) -> None:
    timeout = datetime.timedelta(seconds=group_timeout(spec))
    store = dist.FileStore(spec["store_path"], spec["world_size"])
    store.set_timeout(timeout)
    if spec["device_type"] == "cuda":
        # device_id: NCCL creates its communicator now, on every rank, instead of at the first CUDA
        # collective; a collective that only some ranks reach then hangs as NCCL hangs, not as gloo does.
        gpu = torch.device("cuda", spec["local_rank"])
        torch.cuda.set_device(gpu)
        dist.init_process_group(GPU_MODE_BACKEND, store=store, rank=spec["rank"], world_size=spec["world_size"],
                                timeout=timeout, device_id=gpu)
    else:
        dist.init_process_group(spec["backend"], store=store, rank=spec["rank"], world_size=spec["world_size"],
                                timeout=timeout)


def _adopt_kernel_state(spec: dict) -> None:
    os.environ.clear()
    os.environ.update(spec["env"])
    # torch.distributed reads TORCH_DISTRIBUTED_DEBUG once, when imported: in the zygote, before the kernel
    # set it. Read it again, so that a learner who sets it in the notebook gets it on the ranks (chapter 09).
    dist.set_debug_level_from_env()
    sys.path[:] = spec["sys_path"]
    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass
    linecache.cache.update(spec["linecache"])
    _pickling.install_warning_filters(spec["warning_filters"])
    torch.set_num_threads(spec["threads"])


def main(ctrl: Connection, out_fd: int, err_fd: int) -> int:
    """A rank whose output goes to the pipes ``out_fd`` and ``err_fd`` (native writes included)."""
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    return run(ctrl)


def spawned(ctrl: Connection, out: Connection, err: Connection) -> None:
    """Entry point of a rank started by the spawn start method (``_spawn.py``)."""
    if os.name == "posix":
        os.setsid()  # out of the kernel's process group: an interrupt is the kernel's to handle
        fds = os.dup(out.fileno()), os.dup(err.fileno())
        out.close()
        err.close()
        code = main(ctrl, *fds)
    else:  # Windows: the pipes are message pipes; Python-level output travels, native writes do not
        sys.stdout = sys.__stdout__ = _message_stream(out)
        sys.stderr = sys.__stderr__ = _message_stream(err)
        code = run(ctrl)
    os._exit(code)  # as a forked rank does: no interpreter teardown, which only costs time


class _MessageWriter(io.RawIOBase):
    def __init__(self, conn: Connection):
        self.conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.conn.send_bytes(bytes(data))
        return len(data)


def _message_stream(conn: Connection) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BufferedWriter(_MessageWriter(conn)), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True)


def run(ctrl: Connection) -> int:
    before = set(sys.modules)
    channel = _Channel(ctrl)
    spec = pickle.loads(channel.conn.recv_bytes())  # what all ranks share, then this rank's own part
    spec.update(pickle.loads(channel.conn.recv_bytes()))
    threading.Thread(target=channel.watch, name="parlab-watch", daemon=True).start()
    started = time.monotonic()
    try:
        channel.nccl = spec["backend"] == "nccl"
        _adopt_kernel_state(spec)
        _init_process_group(spec)
        channel.send(("ready", None))  # joining is collective: once one rank is ready, all have started
        fn, args, kwargs = _pickling.loads(spec["payload"])
        value = fn(*args, **kwargs)
        if channel.nccl:
            # NCCL returns from a collective when it is queued: a rank whose peers never came would return
            # here and the launch "succeed". Wait for the GPU's queued work, as gloo's rank waits in the
            # collective itself, so a collective that only some ranks reached is a hang on both.
            channel.draining = True
            runtime.synchronize()
            channel.draining = False
    except BaseException as exc:  # noqa: BLE001 - every failure, SystemExit too, goes to the kernel
        channel.finished, channel.draining = True, False
        _report_imports(channel, before)
        channel.send(("raised", _error_report(exc, time.monotonic() - started)))
    else:
        channel.finished = True
        _report_imports(channel, before)
        try:
            channel.send(("ok", _pickling.dumps(value)))
        except Exception as exc:  # noqa: BLE001
            channel.send(("unpicklable", f"{type(value).__name__}: {type(exc).__name__}: {exc}"))
    sys.stdout.flush()
    sys.stderr.flush()
    channel.done.wait()
    # Every rank is done and the process ends at once: with gloo, tearing the group down first only costs
    # time (tens of ms); the OS closes its sockets. NCCL's communicators are destroyed properly.
    if dist.is_initialized() and spec["backend"] == "nccl":
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def _report_imports(channel: _Channel, before: set) -> None:
    """Tell the kernel which torch modules this rank had to import itself (the first of each new chain),
    so that the zygote imports them once instead of every rank on every launch. torch's own modules only:
    importing a learner's module in the zygote would run its top-level code outside any rank."""
    new = [m for m in set(sys.modules) - before
           if m.startswith("torch.") and m.rpartition(".")[0] in before and sys.modules[m] is not None]
    if new:
        channel.send(("imported", sorted(new)))


def _error_report(exc: BaseException, elapsed: float) -> dict:
    try:
        original = _pickling.dumps(exc)
    except Exception:  # noqa: BLE001 - the text is enough
        original = None
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": _format_exception(exc),
        "where": _describe_stack(list(traceback.extract_tb(exc.__traceback__)))[0],
        "kind": classify_exception(exc),
        "elapsed": elapsed,
        "exception": original,
    }
