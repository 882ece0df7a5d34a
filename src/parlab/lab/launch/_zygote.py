"""The zygote: a clean Python process, with torch imported, that forks the ranks.

Why not ``torch.multiprocessing.spawn`` or ``multiprocessing``'s forkserver?
``spawn`` pays for ``import torch`` in every rank on every launch (≈5 s for 4 ranks) and cannot
unpickle a function defined in a notebook cell. Plain ``fork`` of the kernel is fast but unsafe: the
kernel may hold CUDA state or OpenMP worker threads, and a forked child that touches them hangs.
``multiprocessing``'s forkserver is the right idea but re-runs the caller's ``__main__`` script in
every child (a script without a ``__name__`` guard launches itself again) and shares one global preload
list with everything else in the process.

So the launcher starts this module once per kernel (``python -m parlab.lab.launch._zygote FD``), in a new
session so that a kernel interrupt never reaches it. It imports torch while it has a single thread and
no CUDA context, then waits on a Unix socket. Each request carries four file descriptors (control
socket, stdout, stderr, exit-status pipe); the zygote forks, the child becomes a rank
(``_worker.main``) and the zygote reports the child's pid, later its exit code. Forking a
single-threaded, CUDA-free process is safe, and costs milliseconds instead of seconds.

The zygote exits when the kernel closes its end of the socket (the kernel exited or was killed).
The kernel's side (``_Zygote``, below the server) starts it on the first launch and restarts it if it died.
Taught in chapter 00.
"""

from __future__ import annotations

import atexit
import importlib
import os
import re
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection

from parlab.lab.launch.errors import LaunchError

SPAWN = b"S"
PRELOAD = b"P"
FDS_PER_SPAWN = 4  # control socket, stdout, stderr, exit-status pipe
# What every rank needs. Heavier modules are preloaded on request, before a launch forks its ranks: those
# the kernel itself uses (transformers, strategies) and the torch modules earlier ranks had to import
# themselves (DistributedDataParallel and FSDP import torch._dynamo when built); see launcher.py. Never
# while idle: a launch arriving during a background import would wait for it.
BASE_PRELOAD = ("torch", "torch.distributed", "cloudpickle", "numpy", "parlab", "parlab.lab.launch._worker",
                "parlab.lab.launch.cell")


CUDA_REFUSED = "initialised CUDA"


# The CUDA driver's library. The runtime (libcudart) loads with torch and starts nothing; the driver is
# loaded when something starts CUDA: torch's lazy init, a library calling cuInit, or torch counting devices
# through the runtime when NVML is unavailable. torch.cuda.is_initialized() sees only the first.
CUDA_DRIVER = re.compile(r"/libcuda\.so(\.\d+)*$")


def cuda_driver_mapped(maps: str) -> str | None:
    """The path of the CUDA driver library (``libcuda.so``) in a process's memory map, the text of
    ``/proc/<pid>/maps``, or None when it is not mapped."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, path (absent: anonymous)
        if len(fields) == 6 and CUDA_DRIVER.search(fields[5].strip()):
            return fields[5].strip()
    return None


def _cuda_initialised() -> str:
    """Why this process can no longer fork usable GPU ranks ("" when it still can): torch initialised CUDA,
    or the CUDA driver is loaded (Linux: read from /proc/self/maps, a millisecond)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch.cuda.is_initialized() is True"
    try:
        with open("/proc/self/maps") as f:
            driver = cuda_driver_mapped(f.read())
    except OSError:  # no /proc (macOS): torch's own flag is the only sign
        return ""
    return f"the CUDA driver {driver} is loaded" if driver else ""


def _preload(name: str) -> str:
    """Import ``name``; refuse modules that start threads, since forking a threaded process is unsafe, and
    modules that initialise CUDA: a forked child cannot use its parent's CUDA context, so every GPU rank
    after it would fail ("Cannot re-initialize CUDA in forked subprocess")."""
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - reported back to the kernel as text
        return f"error: {type(exc).__name__}: {exc}"
    if sign := _cuda_initialised():
        return (f"error: importing {name} {CUDA_REFUSED} in the rank server ({sign}); a forked rank cannot use "
                f"a CUDA context it inherits, so it is not preloaded: import it inside the function the ranks run")
    if threading.active_count() > 1:
        return f"error: importing {name} started a thread; it is imported in each rank instead"
    return "ok"


def _unsafe() -> bool:
    """No longer safe to fork: the kernel starts a fresh zygote without the module that did this."""
    return threading.active_count() > 1 or bool(_cuda_initialised())


def _reap(status_fds: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_fds.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, struct.pack("i", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            os.close(fd)


def serve(sock: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status_fds: dict[int, int] = {}
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(status_fds)
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(sock, 4096, FDS_PER_SPAWN)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the kernel is gone
                return
            if msg[:1] == PRELOAD:
                answer = _preload(msg[1:].decode())
                sock.sendall(answer.encode().ljust(512)[:512])
                if _unsafe():
                    return  # no longer safe to fork: the kernel starts a fresh zygote without that module
                continue
            ctrl_fd, out_fd, err_fd, status_fd = fds
            pid = os.fork()
            if pid == 0:  # the rank
                code = 1
                try:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    sel.close()
                    sock.close()
                    for fd in (wake_r, wake_w, status_fd, *status_fds.values()):
                        os.close(fd)
                    from parlab.lab.launch import _worker

                    code = _worker.main(Connection(ctrl_fd), out_fd, err_fd)
                finally:
                    os._exit(code)
            for fd in (ctrl_fd, out_fd, err_fd):
                os.close(fd)
            status_fds[pid] = status_fd
            sock.sendall(struct.pack("q", pid))
            _reap(status_fds)  # a child may have exited before its pid was recorded


# ----------------------------------------------------------------------------------------------------
# The kernel's side: start the zygote once, ask it for ranks.


class ForkedRank:
    """The kernel's handle on a rank the zygote forked (the launcher drives it as it drives a spawned one)."""

    def __init__(self, pid: int, ctrl: Connection, out_fd: int, err_fd: int, status_fd: int):
        self.pid, self.ctrl = pid, ctrl
        self.outputs = {out_fd: 1, err_fd: 2}  # what to wait on -> stream number
        self.exit_event = status_fd  # readable once the zygote has reaped the rank

    @staticmethod
    def read(source: int) -> bytes:
        return os.read(source, 1 << 16)

    def exit_code(self) -> int | None:
        data = os.read(self.exit_event, 4)
        return struct.unpack("i", data)[0] if len(data) == 4 else None

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.ctrl.close()
        for fd in (*self.outputs, self.exit_event):
            try:
                os.close(fd)
            except OSError:
                pass


class _Zygote:
    def __init__(self):
        here, there = socket.socketpair()
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "parlab.lab.launch._zygote", str(there.fileno())],
            pass_fds=[there.fileno()], start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=self.log, env=env,
        )
        there.close()
        self.sock = here
        self.preloaded: set[str] = set()
        self.refused = ""  # why the last preload was refused for initialising CUDA

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _fail(self, what: str) -> LaunchError:
        self.log.seek(0)
        log = self.log.read().decode(errors="replace")[-4000:]
        return LaunchError(f"the parlab rank server {what}.\n{log}")

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except OSError:  # it exited while we spoke
                chunk = b""
            if not chunk:
                raise self._fail("stopped unexpectedly")
            data += chunk
        return data

    def preload(self, name: str) -> None:
        if name in self.preloaded:
            return
        self.preloaded.add(name)
        try:
            self.sock.sendall(PRELOAD + name.encode())
        except OSError:
            raise self._fail("stopped unexpectedly") from None
        answer = self._recv(512).decode().strip()
        if "started a thread" in answer or CUDA_REFUSED in answer:  # the zygote exits: never ask again
            _threaded_modules.add(name)
            self.close()
        if CUDA_REFUSED in answer:
            self.refused = answer[len("error: "):]

    def spawn(self) -> ForkedRank:
        """Fork one rank."""
        ctrl_here, ctrl_there = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            socket.send_fds(self.sock, [SPAWN], [ctrl_there.fileno(), out_w, err_w, status_w])
            (pid,) = struct.unpack("q", self._recv(8))
        except OSError as exc:
            for fd in (out_r, err_r, status_r):
                os.close(fd)
            ctrl_here.close()
            raise self._fail(f"could not start a rank ({exc})") from None
        finally:
            ctrl_there.close()
            for fd in (out_w, err_w, status_w):
                os.close(fd)
        return ForkedRank(pid, Connection(ctrl_here.detach()), out_r, err_r, status_r)

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()  # reaped: alive() is False from now on (a refused preload is seen as refused)


_zygote_lock = threading.Lock()
_the_zygote: _Zygote | None = None
_threaded_modules: set[str] = set()  # preloading them would leave the zygote with threads


def _zygote_with(preloads, strict: bool = False) -> _Zygote:
    """The zygote, with ``preloads`` imported. A module that initialised CUDA there is an error when asked for
    by name (``strict``, :func:`preload`); among the launcher's automatic preloads it is skipped, with a line."""
    global _the_zygote
    if _the_zygote is None or not _the_zygote.alive():
        if _the_zygote is None:
            atexit.register(shutdown)
        _the_zygote = _Zygote()
    for name in preloads:
        if name not in _threaded_modules:
            _the_zygote.preload(name)
        if not _the_zygote.alive():  # it refused a module that starts threads or initialised CUDA, and exited
            refused, _the_zygote = _the_zygote.refused, _Zygote()
            if refused and strict:
                raise LaunchError(refused)
            if refused:
                print(f"parlab: {refused}", file=sys.stderr, flush=True)
    return _the_zygote


def preload(*modules: str) -> None:
    """Import ``modules`` once in the zygote, so that every later rank starts with them loaded.

    For modules that take seconds to import and that ranks use on every launch. A module that starts a
    thread when imported is refused (forking a threaded process is unsafe); ranks then import it
    themselves.
    """
    with _zygote_lock:
        _zygote_with(modules, strict=True)


def shutdown() -> None:
    """Stop the rank server (it restarts on the next launch). Called at interpreter exit."""
    global _the_zygote
    with _zygote_lock:
        if _the_zygote is not None:
            _the_zygote.close()
            _the_zygote = None


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    for name in BASE_PRELOAD + tuple(filter(None, os.environ.get("PARLAB_PRELOAD", "").split(","))):
        answer = _preload(name)
        if CUDA_REFUSED in answer:  # every rank forked from here would be broken: refuse to serve at all
            print(answer, file=sys.stderr, flush=True)
            sys.exit(1)
    serve(sock)


if __name__ == "__main__":
    main(sys.argv)
