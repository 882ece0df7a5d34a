"""First come, first served: the queue of launches waiting for GPUs on a shared machine (lease.py).

Every GPU launch that leases takes a *ticket* before it touches a GPU lock: a file
``ticket-<number>-<pid>`` in the lock folder, its number from a counter kept in ``queue.lock`` and drawn
under that file's ``flock``, so two launches never draw the same number and numbers only grow. Only the
launch holding the first ticket may take GPUs; the others wait behind it, so a kernel that has just
released its GPUs goes to the back of the queue for its next launch instead of taking them straight back.

A waiter holds an exclusive ``flock`` on its own ticket for as long as it waits. Tickets are readable by
every learner whatever their umask (a separate Unix user checks that lock, and ``parlab check`` reads the
ticket's record). The operating system drops
that lock when the process ends, however it ends, so a ticket whose lock can be taken belongs to a waiter
that is gone: it is skipped, and removed where the folder allows (another user's file in a sticky folder
may not be removed; it is then skipped each time). A waiter that dies never blocks the queue.

A ticket is created, locked and filled in while the queue's lock is held, and every liveness check holds
that lock too: a checker never sees a ticket in the moment between its creation and its waiter's lock, which
would look like a waiter that is gone and be removed from under a live one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from parlab.lab.launch.errors import LaunchError

COUNTER = "queue.lock"
WIDTH = 12  # digits of a ticket number: names sort in the order they were drawn


@contextlib.contextmanager
def _queue_locked(folder: str):
    """The queue's lock, held briefly for every change to the queue; yields its fd (it holds the counter)."""
    path = os.path.join(folder, COUNTER)
    try:
        try:  # another learner's file in a sticky folder: opened as it is (O_CREAT on it may be refused)
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
                with contextlib.suppress(PermissionError):
                    os.fchmod(fd, 0o666)  # every learner draws from it, whatever the umask
            except FileExistsError:  # created by someone else a moment ago
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise LaunchError(f"cannot open the GPU queue's file {path} ({exc.strerror}): every learner must be able "
                          f"to write it. Its owner can `chmod 666` it, or set PARLAB_GPU_LOCKS to a folder everyone "
                          f"can write (mode 1777).") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # drops the flock


def _tickets(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("ticket-"))


def _number(name: str) -> int:
    return int(name.split("-")[1])


def _gone(folder: str, name: str) -> bool:
    """True when the ticket's waiter has ended (its flock can be taken); removes the ticket where allowed."""
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:  # not a ticket this launch may read (not one of ours: ours are readable by all): it cannot
        return True  # be told alive, and is skipped, so that it never blocks the queue
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two checkers never mistake each other
        except BlockingIOError:                              # for the waiter
            return False  # its waiter is alive and waiting
        with contextlib.suppress(OSError):
            os.unlink(path)
        return True
    finally:
        os.close(fd)


class Ticket:
    """This launch's place in the queue, from the moment it asks for GPUs until it has them (or gives up)."""

    def __init__(self, folder: str, holder: dict):
        self.folder = folder
        with _queue_locked(folder) as qfd:
            raw = os.pread(qfd, 64, 0).strip()
            try:
                self.number = int(raw) if raw else 0
            except ValueError:  # never half-written in practice; recover from what the folder shows
                self.number = max((_number(n) + 1 for n in _tickets(folder)), default=0)
            os.pwrite(qfd, str(self.number + 1).rjust(WIDTH).encode(), 0)  # one fixed-width write
            self.name = f"ticket-{self.number:0{WIDTH}d}-{os.getpid()}"
            self.path = os.path.join(folder, self.name)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            os.fchmod(self.fd, 0o644)  # whatever the umask: other learners test its lock and read who waits
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # alive while this is held; taken before the queue lock drops
            os.pwrite(self.fd, json.dumps(dict(holder, ticket=self.number, since=time.time())).encode(), 0)

    def place(self) -> int:
        """How many live waiters are ahead of this one: 0 means this launch may take GPUs now."""
        with _queue_locked(self.folder):
            names = _tickets(self.folder)
            ahead = names[:names.index(self.name)] if self.name in names else names
            live = 0
            # tickets of waiters that are gone are skipped (and removed where allowed); past the first live
            # one, count without checking: the number only guides a learner
            for name in ahead:
                if live or not _gone(self.folder, name):
                    live += 1
            return live

    def leave(self) -> None:
        """Out of the queue (served, timed out or interrupted); idempotent."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None


def waiting(folder: str) -> list[dict]:
    """The live waiters in the queue, first first (``parlab check``): each ticket's recorded holder."""
    if not os.path.isdir(folder):
        return []
    try:
        with _queue_locked(folder):
            return _live(folder)
    except LaunchError:  # a folder this user may only read: then only a moment's picture
        return _live(folder)


def _live(folder: str) -> list[dict]:
    out = []
    for name in _tickets(folder):
        if _gone(folder, name):
            continue
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(folder, name)) as f:
                out.append(json.loads(f.read() or "{}") or {"ticket": _number(name)})
    return out
