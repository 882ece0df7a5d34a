"""The zygote: a clean Python process, with torch imported, that forks the ranks.

Why not ``torch.multiprocessing.spawn`` or ``multiprocessing``'s forkserver?
``spawn`` pays for ``import torch`` in every rank on every launch (≈5 s for 4 ranks) and cannot
unpickle a function defined in a notebook cell. Plain ``fork`` of the kernel is fast but unsafe: the
kernel may hold CUDA state or OpenMP worker threads, and a forked child that touches them hangs.
``multiprocessing``'s forkserver is the right idea but re-runs the caller's ``__main__`` script in
every child (a script without a ``__name__`` guard launches itself again) and shares one global preload
list with everything else in the process.

So the launcher starts this module once per kernel (``python -m parlab.launch._zygote FD``), in a new
session so that a kernel interrupt never reaches it. It imports torch while it has a single thread and
no CUDA context, then waits on a Unix socket. Each request carries four file descriptors (control
socket, stdout, stderr, exit-status pipe); the zygote forks, the child becomes a rank
(``_worker.main``) and the zygote reports the child's pid, later its exit code. Forking a
single-threaded, CUDA-free process is safe, and costs milliseconds instead of seconds.

The zygote exits when the kernel closes its end of the socket (the kernel exited or was killed).
Taught in chapter 00.
"""

from __future__ import annotations

import importlib
import os
import selectors
import signal
import socket
import struct
import sys
import threading

SPAWN = b"S"
PRELOAD = b"P"
FDS_PER_SPAWN = 4  # control socket, stdout, stderr, exit-status pipe
# What ranks need on every launch, and the strategies the chapters use (each costs seconds to import).
BASE_PRELOAD = ("torch", "torch.distributed", "cloudpickle", "numpy", "parlab.launch._worker", "parlab",
                "torch.nn.parallel", "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
                "torch.distributed.pipelining")


def _preload(name: str) -> str:
    """Import ``name``; refuse modules that start threads, since forking a threaded process is unsafe."""
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - reported back to the kernel as text
        return f"error: {type(exc).__name__}: {exc}"
    if threading.active_count() > 1:
        return f"error: importing {name} started a thread; it is imported in each rank instead"
    return "ok"


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
                sock.sendall(_preload(msg[1:].decode()).encode().ljust(256)[:256])
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
                    from parlab.launch import _worker

                    code = _worker.main(ctrl_fd, out_fd, err_fd)
                finally:
                    os._exit(code)
            for fd in (ctrl_fd, out_fd, err_fd):
                os.close(fd)
            status_fds[pid] = status_fd
            sock.sendall(struct.pack("q", pid))
            _reap(status_fds)  # a child may have exited before its pid was recorded


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    for name in BASE_PRELOAD + tuple(filter(None, os.environ.get("PARLAB_PRELOAD", "").split(","))):
        _preload(name)
    serve(sock)


if __name__ == "__main__":
    main(sys.argv)
