"""Which GPUs a launch may use, on one machine shared by several learners (the workshop guide).

Without ``PARLAB_GPUS`` a launch uses the GPUs this process sees (``CUDA_VISIBLE_DEVICES``), as on a
machine of one's own. With it, every GPU launch *leases* ``world_size`` GPUs from a pool, for as long as
its ranks run, and no two launches on the machine hold the same GPU at once:

- ``PARLAB_GPUS=2,3``: the pool is GPUs 2 and 3 (numbered as ``nvidia-smi`` numbers them), e.g. the
  pair an instructor gave this learner. Where a spawner (JupyterHub, SLURM, a container runtime) has set
  ``CUDA_VISIBLE_DEVICES`` already, the numbers count *within the GPUs it lists*, as CUDA numbers them in
  this process: under ``CUDA_VISIBLE_DEVICES=4,5,6,7``, ``PARLAB_GPUS=2,3`` is the machine's GPUs 6 and 7,
  and a number past the list is an error, so a lease never escapes the spawner's restriction;
- ``PARLAB_GPUS=auto``: the pool is every GPU this process sees; a launch takes any free ones.

A lease is an exclusive ``flock`` on one file per GPU in ``PARLAB_GPU_LOCKS`` (default
``/tmp/parlab-gpus``), shared by every user on the machine: the folder is made with mode 1777 and the
lock files 0666, whatever the umask of the learner who made them (tested with two Unix users). The
operating system drops a flock when the process holding it ends, however it ends (a crashed or killed
kernel too), so a GPU is never left locked by a process that is gone. The ranks see only the leased GPUs
(``CUDA_VISIBLE_DEVICES``), so rank ``r`` still computes on ``cuda:r``. A launch leases once its ranks
have started (``_loop.ranks_then_lease``), so no GPU is held while a kernel's zygote imports torch. When
too few GPUs of the pool are free, the launch waits up to ``PARLAB_GPU_WAIT`` seconds (default 600),
saying who holds them, then fails naming them. Waiting launches are served first come, first served, in
a queue in the same folder (``_queue.py``), and each says its place in it. Each lock file records its
holder (user, process, since when, which notebook); ``parlab check`` shows it, and the queue.

The pool's size comes from an injectable device count, so all of this is tested without GPUs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field

from parlab.lab.language import say
from parlab.lab.launch import _queue
from parlab.lab.launch.errors import LaunchError

DEFAULT_LOCK_DIR = "/tmp/parlab-gpus"
DEFAULT_WAIT = 600.0
POLL = 0.05  # seconds between attempts of the first two in the queue (a lock can be waited on, a set of them cannot)
POLL_QUEUED = 0.2  # seconds between looks at the queue by those behind it
TELL_EVERY = 10.0  # seconds between lines saying a waiter's new place


def _torch_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def requested(env=None) -> str | None:
    """``PARLAB_GPUS`` as set (stripped), or None when leasing is off."""
    value = (env if env is not None else os.environ).get("PARLAB_GPUS", "").strip()
    return value or None


def pool(env=None, device_count=None) -> list[str] | None:
    """The GPUs this process may lease from, as ``CUDA_VISIBLE_DEVICES`` names them (indices, or UUIDs);
    None when ``PARLAB_GPUS`` is unset (no leasing: every visible GPU, as before)."""
    env = env if env is not None else os.environ
    value = requested(env)
    if value is None:
        return None
    device_count = device_count or _torch_device_count
    if value == "auto":
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:  # "" (a CPU-mode process) is a pool of none
            return [t.strip() for t in visible.split(",") if t.strip()]
        return [str(i) for i in range(device_count())]
    tokens = [t.strip() for t in value.split(",")]
    if not all(re.fullmatch(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+", t) for t in tokens) or len(set(tokens)) != len(tokens):
        raise ValueError(f"PARLAB_GPUS must be 'auto' or a comma-separated list of distinct GPU numbers as "
                         f"nvidia-smi shows them (e.g. '2,3'); got {value!r}")
    if "CUDA_VISIBLE_DEVICES" in env:  # a spawner's list: the numbers index it (what CUDA calls 0, 1, ...)
        visible = [t.strip() for t in env["CUDA_VISIBLE_DEVICES"].split(",") if t.strip()]
        missing = [t for t in tokens if not t.isdigit() or int(t) >= len(visible)]
        if missing:
            raise ValueError(f"PARLAB_GPUS={value!r} names GPU {', '.join(missing)}, but CUDA_VISIBLE_DEVICES="
                             f"{env['CUDA_VISIBLE_DEVICES']!r} lets this process see {len(visible)} GPU(s), numbered "
                             f"0..{len(visible) - 1} in the order it lists them" if visible else
                             f"PARLAB_GPUS={value!r} names GPUs, but CUDA_VISIBLE_DEVICES is empty: this process "
                             f"may see no GPU")
        return [visible[int(t)] for t in tokens]
    count = device_count()  # the numbers are then the machine's own: check they exist
    missing = [t for t in tokens if t.isdigit() and int(t) >= count]
    if missing:
        raise ValueError(f"PARLAB_GPUS={value!r} names GPU {', '.join(missing)}, but this machine has "
                         f"{count} GPU(s), numbered 0..{count - 1}" if count else
                         f"PARLAB_GPUS={value!r} names GPUs, but this machine has none")
    return tokens


def pool_size(env=None, device_count=None) -> int:
    """How many GPUs a launch may use: the pool's size when leasing, else every visible GPU."""
    gpus = pool(env, device_count)
    return (device_count or _torch_device_count)() if gpus is None else len(gpus)


def lock_dir(env=None) -> str:
    return (env if env is not None else os.environ).get("PARLAB_GPU_LOCKS") or DEFAULT_LOCK_DIR


@dataclass
class Lease:
    """GPUs held for one launch; ``env`` is what the ranks' environment needs to see only them."""

    gpus: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    _fds: list[int] = field(default_factory=list, repr=False)
    ticket: int | None = None  # its number in the queue (first come, first served)
    granted_at: float | None = None  # time.monotonic() when it got its GPUs
    waited: float = 0.0  # seconds from asking to getting them
    released_at: float | None = None  # time.monotonic() when it first let them go (``parlab check``'s hold time)

    def release(self) -> None:
        if self.released_at is None:
            self.released_at = time.monotonic()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale holder once free
            with contextlib.suppress(OSError):
                os.close(fd)  # closing drops the flock
        self._fds.clear()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(world_size: int, *, env=None, device_count=None, wait: float | None = None,
            what: str = "", echo=None) -> Lease:
    """Lease ``world_size`` GPUs from the pool, waiting up to ``wait`` seconds for them to be free.

    Launches are served first come, first served (``_queue.py``): this one takes a ticket, waits until it
    is first in the queue, then until enough GPUs are free, saying its place while it waits. Without
    ``PARLAB_GPUS``: an empty lease (every visible GPU, nothing locked). Raises :class:`LaunchError`
    naming the holders when the GPUs stay taken.
    """
    env = env if env is not None else os.environ
    gpus = pool(env, device_count)
    if gpus is None:
        return Lease(granted_at=time.monotonic())
    if world_size > len(gpus):
        raise LaunchError(f"world_size={world_size} needs {world_size} GPUs, but PARLAB_GPUS={requested(env)!r} "
                          f"gives this session {len(gpus)} ({', '.join(gpus) or 'none'})")
    wait = float(env.get("PARLAB_GPU_WAIT", DEFAULT_WAIT)) if wait is None else wait
    echo = echo if echo is not None else (lambda line: print(line, file=sys.stderr, flush=True))
    folder = lock_dir(env)
    _make_lock_dir(folder)
    holder = {"user": _user(), "pid": os.getpid(), "host": socket.gethostname(), "what": what,
              "notebook": env.get("JPY_SESSION_NAME", "")}
    asked = time.monotonic()
    ticket = _queue.Ticket(folder, holder)
    try:
        fds, got = _wait_turn(ticket, gpus, world_size, wait, echo, requested(env))
        granted = time.monotonic()
    finally:
        ticket.leave()  # served, timed out or interrupted: out of the queue
    holder.update(since=time.time(), gpus=got)
    try:
        for fd in fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
    except BaseException:  # an interrupt right now must not leave the GPUs locked by a kernel that lives on
        Lease(_fds=fds).release()
        raise
    # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi and the lock files go by PCI bus.
    lease_env = {"CUDA_VISIBLE_DEVICES": ",".join(got),
                 "CUDA_DEVICE_ORDER": env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}
    return Lease(got, lease_env, fds, ticket=ticket.number, granted_at=granted, waited=granted - asked)


def _wait_turn(ticket, gpus: list[str], world_size: int, wait: float, echo, asked_for) -> tuple[list[int], list[str]]:
    """Wait for this ticket's turn, then for ``world_size`` free GPUs of ``gpus``; their locks' fds."""
    start = time.monotonic()
    deadline, told, told_at = start + wait, None, 0.0
    while True:
        place = ticket.place()
        if place == 0:  # first in the queue: nobody who asked earlier is still waiting
            fds, got = _try_gpus(ticket.folder, gpus, world_size)
            if len(got) == world_size:
                return fds, got
        now = time.monotonic()
        if now >= deadline:
            holders = {g: h for g, h in holders_of(gpus, ticket.folder).items() if h is not None}
            raise LaunchError(say("{world_size} free GPU(s) needed from PARLAB_GPUS={asked_for!r} ({gpus}), but "
                                  "for {wait:g} s only {free} were free. {holders} This launch was {place}. Wait "
                                  "for them, or ask for fewer ranks; PARLAB_GPU_WAIT sets how long to wait.",
                                  world_size=world_size, asked_for=asked_for, gpus=', '.join(gpus), wait=wait,
                                  free=len(gpus) - len(holders), holders=_describe_holders(holders),
                                  place=_place(place)))
        if told is None:
            holders = {g: h for g, h in holders_of(gpus, ticket.folder).items() if h is not None}
            echo(say("parlab: waiting for {world_size} free GPU(s) of {gpus} (up to {wait:g} s), {place}. {holders}",
                     world_size=world_size, gpus=', '.join(gpus), wait=wait, place=_place(place),
                     holders=_describe_holders(holders)))
            told, told_at = place, now
        elif place != told and now - told_at >= TELL_EVERY:  # the queue moves: say so, now and then
            echo(say("parlab: now {place} for {world_size} GPU(s) (waited {waited:.0f} s)", place=_place(place),
                     world_size=world_size, waited=now - start))
            told, told_at = place, now
        time.sleep(POLL if place <= 1 else POLL_QUEUED)  # the next in line is quick to take its turn


def _try_gpus(folder: str, gpus: list[str], world_size: int) -> tuple[list[int], list[str]]:
    """Locks on ``world_size`` free GPUs, or none: a partial set is never kept (two launches each holding
    half would wait for each other)."""
    fds, got = [], []
    try:
        for gpu in gpus:
            fd = _try_lock(_lock_path(folder, gpu))
            if fd is not None:
                fds.append(fd)
                got.append(gpu)
                if len(got) == world_size:
                    return fds, got
    except BaseException:
        Lease(_fds=fds).release()
        raise
    Lease(_fds=fds).release()
    return [], []


def _place(place: int) -> str:
    if place == 0:
        return say("first in the queue")
    if place == 1:
        return say("place {place} in the queue ({ahead} launch ahead of this one)", place=place + 1, ahead=place)
    return say("place {place} in the queue ({ahead} launches ahead of this one)", place=place + 1, ahead=place)


def holders_of(gpus=None, folder=None) -> dict[str, dict | None]:
    """Who holds each GPU's lock now: ``{gpu: holder or None}``; by default every GPU that has a lock file."""
    folder = folder or lock_dir()
    if gpus is None:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return {}
        gpus = sort_gpus(n[len("gpu-"):-len(".lock")] for n in names if n.startswith("gpu-") and n.endswith(".lock"))
    out = {}
    for gpu in gpus:
        path = _lock_path(folder, gpu)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            out[gpu] = None
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # someone holds it: read who
                try:
                    out[gpu] = json.loads(os.pread(fd, 4096, 0) or b"{}") or {"user": "?"}
                except ValueError:
                    out[gpu] = {"user": "?"}  # the holder is writing its name right now
            else:
                out[gpu] = None
        finally:
            os.close(fd)
    return out


def waiting(folder=None) -> list[dict]:
    """The launches waiting for GPUs now, first first: each one's recorded holder (``parlab check``)."""
    return _queue.waiting(folder or lock_dir())


def sort_gpus(gpus) -> list[str]:
    """Numbers in numeric order (2 before 10), then UUIDs."""
    return sorted(set(gpus), key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g))


def describe_holder(holder: dict) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(holder["since"])) if "since" in holder else "?"
    where = f", {os.path.basename(holder['notebook'])}" if holder.get("notebook") else ""
    what = f", {holder['what']}" if holder.get("what") else ""
    return f"{holder.get('user', '?')} (pid {holder.get('pid', '?')}{what}{where}, since {since})"


def _describe_holders(holders: dict) -> str:
    if not holders:
        return say("No holder recorded yet.")
    return say("Held: {holders}.", holders=say("; ").join(say("GPU {gpu} by {holder}", gpu=g, holder=describe_holder(h))
                                                          for g, h in holders.items()))


def _lock_path(folder: str, gpu: str) -> str:
    return os.path.join(folder, f"gpu-{gpu.replace('/', '_')}.lock")


def _make_lock_dir(folder: str) -> None:
    """Create the lock folder, for every learner on the machine: mode 1777 (like /tmp, anyone may add a file,
    none may delete another's), whatever the umask. It appears complete or not at all: made under another
    name, then renamed, so that another learner never finds it while it is still private to its creator."""
    if os.path.isdir(folder):
        return
    parent = os.path.dirname(os.path.abspath(folder))
    try:
        os.makedirs(parent, exist_ok=True)
        fresh = tempfile.mkdtemp(prefix=".parlab-gpus-", dir=parent)
    except OSError as exc:
        raise LaunchError(f"cannot create the GPU lock folder {folder} ({exc.strerror}): set PARLAB_GPU_LOCKS to a "
                          f"folder every learner can write (mode 1777), or create this one with that mode.") from None
    try:
        os.chmod(fresh, 0o1777)
        os.rename(fresh, folder)
    except OSError:  # another learner's came first
        with contextlib.suppress(OSError):
            os.rmdir(fresh)


def _try_lock(path: str) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when another process holds it."""
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # a planted symlink must not make us truncate its target
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
                with contextlib.suppress(PermissionError):
                    os.fchmod(fd, 0o666)  # the umask would keep other learners from recording themselves
            except FileExistsError:  # another learner created it a moment ago; open theirs (in a sticky
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # folder, O_CREAT on another's file is refused)
    except OSError as exc:
        raise LaunchError(f"cannot open the GPU lock file {path} ({exc.strerror}): every learner must be able to "
                          f"write it. Its owner can `chmod 666` it, or set PARLAB_GPU_LOCKS to a folder everyone "
                          f"can write (mode 1777).") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
