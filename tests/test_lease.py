"""Workshop mode: GPU leases on a shared machine (launch/lease.py), tested without GPUs through an injected
device count. No two launches hold one GPU; a lease ends when its process ends, however it ends."""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from parlab.course import cli
from parlab.lab.launch import LaunchError, lease, make_plan
from conftest import wait_gone


def eight():
    return 8


@pytest.fixture
def box(tmp_path, monkeypatch):
    """A machine with 8 GPUs and its own lock folder; returns the environment a learner's kernel has."""
    monkeypatch.setattr(lease, "_torch_device_count", eight)
    monkeypatch.setenv("PARLAB_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("PARLAB_GPUS", raising=False)
    return {"PARLAB_GPU_LOCKS": str(tmp_path / "locks")}


# -- the pool ------------------------------------------------------------------------------------------

def test_without_parlab_gpus_nothing_is_leased(box):
    assert lease.pool(box) is None and lease.pool_size(box) == 8
    with lease.acquire(4, env=box) as held:
        assert held.gpus == [] and held.env == {}
    assert not os.path.exists(box["PARLAB_GPU_LOCKS"])


def test_the_pool(box):
    assert lease.pool({"PARLAB_GPUS": "auto"}) == [str(i) for i in range(8)]
    assert lease.pool({"PARLAB_GPUS": "auto", "CUDA_VISIBLE_DEVICES": "4,5"}, eight) == ["4", "5"]
    assert lease.pool({"PARLAB_GPUS": " 2, 3 "}, eight) == ["2", "3"]
    assert lease.pool_size({"PARLAB_GPUS": "6,7,2"}, eight) == 3


@pytest.mark.parametrize("value", ["2,,3", "two", "2,2", "-1"])
def test_a_malformed_pool_is_named(box, value):
    with pytest.raises(ValueError, match=f"PARLAB_GPUS must be 'auto' or .*got {value!r}"):
        lease.pool({"PARLAB_GPUS": value}, eight)


def test_a_gpu_the_machine_lacks_is_named(box):
    with pytest.raises(ValueError, match=r"names GPU 8, but this machine has 8 GPU\(s\), numbered 0..7"):
        lease.pool({"PARLAB_GPUS": "7,8"}, eight)
    with pytest.raises(ValueError, match="this machine has none"):
        lease.pool({"PARLAB_GPUS": "0"}, lambda: 0)


def test_the_plan_sees_the_pool_not_the_machine(box, monkeypatch):
    monkeypatch.setenv("PARLAB_GPUS", "2,3")
    assert make_plan(2).backend == "nccl"
    four = make_plan(4)  # 8 GPUs in the machine, but this learner was given 2
    assert four.backend == "gloo" and "2 GPU(s) visible" in four.note
    with pytest.raises(ValueError, match="world_size=4 on this machine but 2 GPU"):
        make_plan(4, "nccl")


# -- leases --------------------------------------------------------------------------------------------

def test_two_launches_never_share_a_gpu(box):
    env = dict(box, PARLAB_GPUS="0,1,2,3")
    with lease.acquire(2, env=env, wait=0) as a, lease.acquire(2, env=env, wait=0) as b:
        assert a.gpus == ["0", "1"] and b.gpus == ["2", "3"]
        assert b.env == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        held = lease.holders_of(folder=box["PARLAB_GPU_LOCKS"])
        assert list(held) == ["0", "1", "2", "3"] and all(h["pid"] == os.getpid() for h in held.values())
        with pytest.raises(LaunchError, match=rf"1 free GPU\(s\) needed .* only 0 were free\. Held: GPU 0 by "
                                              rf".*\(pid {os.getpid()}"):
            lease.acquire(1, env=env, wait=0)
    with lease.acquire(4, env=env, wait=0) as c:  # released on exit from the with blocks
        assert c.gpus == ["0", "1", "2", "3"]
    assert set(lease.holders_of(folder=box["PARLAB_GPU_LOCKS"]).values()) == {None}


def test_more_ranks_than_the_pool_is_an_error(box):
    with pytest.raises(LaunchError, match=r"world_size=3 needs 3 GPUs, but PARLAB_GPUS='5,6' gives this session 2"):
        lease.acquire(3, env=dict(box, PARLAB_GPUS="5,6"), wait=0)


HOLDER = textwrap.dedent("""
    import sys
    from parlab.lab.launch import lease
    held = lease.acquire(int(sys.argv[1]), env={"PARLAB_GPUS": sys.argv[2], "PARLAB_GPU_LOCKS": sys.argv[3]},
                         device_count=lambda: 8, wait=float(sys.argv[4]) if sys.argv[4:] else 0, what="holder")
    print(",".join(held.gpus), flush=True)
    sys.stdin.readline()  # hold until told; a crash test kills us here instead
""")


def _holder(box, n, gpus):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(n), gpus, box["PARLAB_GPU_LOCKS"]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()  # the line comes once the lease is held


def test_a_crashed_holder_frees_its_gpus(box):
    proc, gpus = _holder(box, 2, "auto")
    assert gpus == "0,1"
    held = lease.holders_of(folder=box["PARLAB_GPU_LOCKS"])
    assert held["0"]["pid"] == proc.pid and held["0"]["what"] == "holder"
    with pytest.raises(LaunchError, match=rf"pid {proc.pid}"):
        lease.acquire(1, env=dict(box, PARLAB_GPUS="0,1"), wait=0)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up, like a kernel the OOM killer ends
    proc.wait()
    with lease.acquire(2, env=dict(box, PARLAB_GPUS="0,1"), wait=0) as again:
        assert again.gpus == ["0", "1"]


def test_a_launch_waits_for_gpus_then_takes_them(box):
    proc, _ = _holder(box, 8, "auto")  # someone holds every GPU
    said = []

    def told(line):  # the lease says it waits: only then does the holder let go
        said.append(line)
        proc.stdin.write("\n")
        proc.stdin.flush()

    with lease.acquire(2, env=dict(box, PARLAB_GPUS="auto"), wait=60, echo=told) as held:
        assert held.gpus == ["0", "1"]
    proc.wait()
    assert len(said) == 1 and said[0].startswith("parlab: waiting for 2 free GPU(s) of 0, 1, 2")
    assert f"GPU 0 by " in said[0] and f"pid {proc.pid}" in said[0]


def test_launches_in_threads_take_turns(box):
    """Four threads ask for 2 of 2 GPUs at once: each gets them in turn, never two at a time."""
    env = dict(box, PARLAB_GPUS="0,1")
    inside, most, errors = [0], [0], []
    count = threading.Lock()

    def one():
        try:
            with lease.acquire(2, env=env, wait=60, echo=lambda line: None):
                with count:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                lease.holders_of(folder=box["PARLAB_GPU_LOCKS"])  # some work while holding
                with count:
                    inside[0] -= 1
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and most[0] == 1


def test_check_shows_who_holds_which_gpu(box, monkeypatch):
    monkeypatch.setenv("PARLAB_GPUS", "auto")
    proc, gpus = _holder(box, 2, "2,3")
    try:
        text, usable = cli.leases()
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait()
    assert usable == 8
    rows = dict(re.findall(r"^GPU (\S+)\s{2,}(.*)$", text, re.M))
    assert rows["0"] == "free" and rows["7"] == "free"
    assert rows["2"].startswith("held by ") and f"pid {proc.pid}, holder" in rows["2"] and gpus == "2,3"
    assert re.search(r"^queue\s{2,}nobody waiting$", text, re.M)


def test_check_fails_on_a_malformed_pool(box, monkeypatch):
    monkeypatch.setenv("PARLAB_GPUS", "1,1")
    text, usable = cli.leases()
    assert usable is None and "INVALID" in text


def test_a_lock_file_nobody_may_write_is_named(box, tmp_path):
    folder = tmp_path / "locks"
    folder.mkdir()
    (folder / "gpu-0.lock").symlink_to(tmp_path / "elsewhere")  # never followed, nor truncated
    with pytest.raises(LaunchError, match=r"cannot open the GPU lock file .*gpu-0.lock .*PARLAB_GPU_LOCKS"):
        lease.acquire(1, env=dict(box, PARLAB_GPUS="0"), wait=0)


# -- first come, first served ---------------------------------------------------------------------------

def _queue_in_order(env, count, served):
    """Start ``count`` threads asking for the pool's GPUs, each once the one before has its ticket; each
    notes when it is served, then lets go."""
    def one(i):
        with lease.acquire(2, env=env, wait=60, echo=lambda line: None) as held:
            served.append((i, held.ticket))

    threads = []
    for i in range(count):
        threads.append(threading.Thread(target=one, args=(i,), daemon=True))
        threads[-1].start()
        deadline = time.monotonic() + 30  # its ticket is in the queue: the next one queues behind it
        while len(lease.waiting(env["PARLAB_GPU_LOCKS"])) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    return threads


def test_waiters_are_served_first_come_first_served(box):
    """A kernel that releases its GPUs and asks again at once goes behind those already waiting."""
    env = dict(box, PARLAB_GPUS="0,1")
    first = lease.acquire(2, env=env, wait=0)
    served = []
    try:
        threads = _queue_in_order(env, 3, served)
        assert [w["pid"] for w in lease.waiting(env["PARLAB_GPU_LOCKS"])] == [os.getpid()] * 3
    finally:
        first.release()  # a failed check never leaves the waiters to time out after the test
    with lease.acquire(2, env=env, wait=60, echo=lambda line: None) as again:  # the holder's next launch
        served.append(("again", again.ticket))
    for t in threads:
        t.join(60)
    assert [who for who, _ in served] == [0, 1, 2, "again"]
    tickets = [ticket for _, ticket in served]
    assert tickets == sorted(tickets) and tickets[0] > first.ticket
    assert lease.waiting(env["PARLAB_GPU_LOCKS"]) == []


def test_a_check_never_removes_a_ticket_before_its_waiter_locks_it(box, monkeypatch):
    """A ticket exists for a moment before its waiter's lock: a check in that moment must wait, not take it
    for a gone waiter's ticket and remove it (the queue would then lose a live launch)."""
    from parlab.lab.launch import _queue

    folder = box["PARLAB_GPU_LOCKS"]
    os.makedirs(folder, exist_ok=True)
    real = _queue.fcntl
    checks = []

    class Between:  # runs a check from another thread just before the ticket's waiter takes its lock
        def __getattr__(self, name):
            return getattr(real, name)

        def flock(self, fd, op):
            if op == real.LOCK_EX and "ticket-" in os.readlink(f"/proc/self/fd/{fd}") and not checks:
                checks.append(threading.Thread(target=lambda: checks.append(_queue.waiting(folder))))
                checks[0].start()
                checks[0].join(0.5)  # time for a check that does not wait for the queue's lock to finish
            return real.flock(fd, op)

    monkeypatch.setattr(_queue, "fcntl", Between())
    ticket = _queue.Ticket(folder, {"pid": os.getpid()})
    try:
        checks[0].join(30)
        assert os.path.exists(ticket.path), "a check removed a live waiter's ticket"
        assert [w["pid"] for w in checks[1]] == [os.getpid()]  # it waited, then saw the whole record
    finally:
        ticket.leave()


def test_a_waiter_is_told_its_place_and_a_dead_waiters_ticket_is_skipped(box):
    env = dict(box, PARLAB_GPUS="0,1")
    proc, _ = _holder(box, 2, "0,1")
    waiter = subprocess.Popen([sys.executable, "-c", HOLDER, "2", "0,1", box["PARLAB_GPU_LOCKS"], "60"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1000):  # it queues behind the holder, then is killed while it waits
        if lease.waiting(box["PARLAB_GPU_LOCKS"]):
            break
        time.sleep(0.01)
    assert [w["pid"] for w in lease.waiting(box["PARLAB_GPU_LOCKS"])] == [waiter.pid]
    said = []

    def told(line):  # behind a live waiter: place 2; once it is killed, first
        said.append(line)
        if len(said) == 1:
            waiter.kill()
            waiter.wait()
            proc.stdin.write("\n")
            proc.stdin.flush()

    old = lease.TELL_EVERY
    lease.TELL_EVERY = 0.0
    try:
        with lease.acquire(2, env=env, wait=60, echo=told) as held:
            assert held.gpus == ["0", "1"]
    finally:
        lease.TELL_EVERY = old
    proc.wait()
    assert "place 2 in the queue (1 launch ahead of this one)" in said[0]
    assert "now first in the queue" in said[1]
    assert lease.waiting(box["PARLAB_GPU_LOCKS"]) == []
    assert not [n for n in os.listdir(box["PARLAB_GPU_LOCKS"]) if n.startswith("ticket-")]  # the dead one removed


def test_a_queue_file_nobody_may_write_is_named(box, tmp_path):
    folder = tmp_path / "locks"
    folder.mkdir()
    (folder / "queue.lock").symlink_to(tmp_path / "elsewhere")  # never followed
    with pytest.raises(LaunchError, match=r"cannot open the GPU queue's file .*queue.lock .*PARLAB_GPU_LOCKS"):
        lease.acquire(1, env=dict(box, PARLAB_GPUS="0"), wait=0)


# -- when a launch takes its lease: once its ranks wait for their spec -------------------------------------

def _watch_a_start(monkeypatch, start_method, gpus):
    """What happens, in order, when a GPU launch starts: each rank starting (and whether any of ``gpus`` was
    held then), the lease, and each rank's spec (its environment's CUDA_VISIBLE_DEVICES)."""
    from parlab.lab.launch import _loop, _spawn, _zygote

    events = []

    def held():
        return any(h is not None for h in lease.holders_of(gpus).values())

    real_with = _loop._zygote_with
    monkeypatch.setattr(_loop, "_zygote_with", lambda *a, **k: events.append(("zygote", held())) or real_with(*a, **k))
    real_spawn = _zygote._Zygote.spawn
    monkeypatch.setattr(_zygote._Zygote, "spawn", lambda self: events.append(("rank", held())) or real_spawn(self))

    class Spawned(_spawn.SpawnedRank):
        def __init__(self, rank):
            events.append(("rank", held()))
            super().__init__(rank)

    monkeypatch.setattr(_spawn, "SpawnedRank", Spawned)
    real_acquire = lease.acquire
    monkeypatch.setattr(lease, "acquire", lambda *a, **k: events.append(("lease", held())) or real_acquire(*a, **k))
    real_try = _loop._try

    def sending(fn, *args):
        spec = pickle.loads(args[0]) if getattr(fn, "__name__", "") == "send_bytes" else {}
        if "env" in spec:
            events.append(("spec", spec["env"].get("CUDA_VISIBLE_DEVICES")))
        return real_try(fn, *args)

    monkeypatch.setattr(_loop, "_try", sending)
    return events


@pytest.mark.usefixtures("no_leftover_ranks")
@pytest.mark.parametrize("start_method", ["zygote", "spawn"])
def test_a_launch_leases_its_gpus_once_its_ranks_wait_for_their_spec(box, monkeypatch, start_method):
    """A kernel's first launch starts the zygote (seconds of importing torch); spawned ranks import torch on
    every launch. No GPU may be held meanwhile: the lease comes after the ranks, before their spec."""
    from parlab.lab.launch._loop import _Launch
    from parlab.lab.launch.plan import Plan

    monkeypatch.setenv("PARLAB_GPUS", "4,5")
    events = _watch_a_start(monkeypatch, start_method, ["4", "5"])
    run = _Launch(Plan(2, "nccl", "cuda", 1, 30.0, gpus=2), b"", "none", start_method, announce=False)
    try:
        run.start()  # GPU mode, as a 2-GPU pool plans it; the CPU ranks never get further than their spec
        assert run.gpus.gpus == ["4", "5"] and run.gpus.granted_at is not None
    finally:
        run.close()
    starting = [e for e in events if e[0] in ("zygote", "rank")]
    assert len(starting) == 2 + (start_method == "zygote") and not any(h for _, h in starting), events
    assert [kind for kind, _ in events][len(starting):] == ["lease", "spec", "spec"], events
    assert [e for e in events if e[0] == "spec"] == [("spec", "4,5")] * 2  # the ranks see only the leased GPUs
    assert run.gpus.released_at >= run.gpus.granted_at


@pytest.mark.usefixtures("no_leftover_ranks")
def test_a_launch_that_cannot_lease_or_is_interrupted_leaves_no_rank(box, monkeypatch, capsys):
    """The ranks exist before the lease now: a lease that times out or is interrupted must still stop them."""
    import parlab
    from parlab.lab.launch import _zygote

    forked = []
    real_spawn = _zygote._Zygote.spawn

    def spawn(self):
        rank = real_spawn(self)
        forked.append(rank.pid)
        return rank

    monkeypatch.setattr(_zygote._Zygote, "spawn", spawn)
    monkeypatch.setenv("PARLAB_GPUS", "0,1")
    monkeypatch.setenv("PARLAB_GPU_WAIT", "0")
    with lease.acquire(2, env=dict(box, PARLAB_GPUS="0,1"), wait=0):  # another launch holds both GPUs of the pool
        with pytest.raises(LaunchError, match=r"2 free GPU\(s\) needed .* only 0 were free"):
            parlab.launch(lambda: None, 2, announce=False)  # GPU mode: the pool has 2 GPUs
    assert len(forked) == 2 and wait_gone(forked) == []

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lease, "acquire", interrupted)
    with pytest.raises(KeyboardInterrupt):
        parlab.launch(lambda: None, 2, announce=False)
    assert len(forked) == 4 and wait_gone(forked) == []
    assert "parlab: interrupted; stopped 2 ranks" in capsys.readouterr().err


# -- two learners are two Unix users ---------------------------------------------------------------------

# One learner's side, run as that user: lease.py and _queue.py need nothing but the standard library, so the
# package's __init__ (which imports torch) is skipped and each side starts in milliseconds.
SIDE = textwrap.dedent("""
    import json, os, sys, types
    src, folder, what = sys.argv[1:4]
    for name in ("parlab", "parlab.lab", "parlab.lab.launch"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(src, *name.split("."))]
        sys.modules[name] = module
    from parlab.lab.launch import lease
    if what == "waiting":
        print("waiting", json.dumps([w.get("user") for w in lease.waiting(folder)]), flush=True)
        sys.exit()
    n, gpus, wait = int(sys.argv[4]), sys.argv[5], float(sys.argv[6])
    env = {"PARLAB_GPUS": gpus, "PARLAB_GPU_LOCKS": folder}
    try:
        held = lease.acquire(n, env=env, device_count=lambda: 8, wait=wait, what=what,
                             echo=lambda line: print("said", line, flush=True))
    except lease.LaunchError as exc:
        print("refused", exc, flush=True)
        sys.exit()
    print("got", ",".join(held.gpus), flush=True)
    sys.stdin.readline()  # hold until told
""")
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture(scope="module")
def learners():
    """Two Unix users, alice's and bob's stand-ins, and a Python both may run; removed afterwards."""
    import pwd
    import shutil

    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("two learners need two Unix users: creating them needs root (CI runs as root)")
    if not shutil.which("useradd") or not shutil.which("userdel"):
        pytest.skip("two learners need two Unix users, and useradd/userdel are missing")
    names = [f"parlab-{who}-{os.getpid()}" for who in ("a", "b")]
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/bin/false", name],
                           check=True, capture_output=True)
            made.append(name)
        users = [pwd.getpwnam(name) for name in names]
        for python in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
            try:  # this interpreter may live in a folder other users cannot enter (e.g. under /root)
                if python and subprocess.run([python, "-c", "import fcntl"], user=users[0].pw_uid,
                                             group=users[0].pw_gid, extra_groups=[], cwd="/",
                                             capture_output=True).returncode == 0:
                    break
            except PermissionError:
                pass
        else:
            pytest.skip("no Python interpreter that another Unix user may run")
        yield python, users
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)


class _Side:
    """One learner's process: asks for GPUs as ``user``, with the umask that keeps their files private."""

    def __init__(self, python, user, folder, *args):
        self.proc = subprocess.Popen([python, "-c", SIDE, SRC, folder, *map(str, args)], user=user.pw_uid,
                                     group=user.pw_gid, extra_groups=[], umask=0o077, cwd="/",
                                     env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.said = []

    def until(self, *words) -> str:
        """Read its lines up to one that starts with one of ``words`` (each waiter gives up within its wait)."""
        for line in self.proc.stdout:
            self.said.append(line.rstrip("\n"))
            if line.startswith(words):
                return line.rstrip("\n")
        raise AssertionError(f"it ended saying {self.said} {self.proc.stderr.read()[-2000:]}")

    def let_go(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(30)


def _tickets(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("ticket-"))  # looked at, never removed


def test_two_unix_users_share_the_lock_folder_and_the_queue(learners):
    """Each learner keeps their files private (umask 077). Still: the first creates the lock folder for both;
    each may lock the other's GPU files and read who holds them; a waiter behind the other's waiter, which is
    then killed, is served; the dead waiter's ticket, which only its owner may remove, is skipped."""
    import shutil
    import stat
    import tempfile

    python, (alice, bob) = learners
    base = tempfile.mkdtemp(prefix="parlab-learners-")  # pytest's own folders are private to root
    os.chmod(base, 0o1777)  # a /tmp of their own
    folder = os.path.join(base, "locks")
    sides = []

    def side(user, *args):
        sides.append(_Side(python, user, folder, *args))
        return sides[-1]

    try:
        holder = side(alice, "holder", 2, "0,1,2,3", 0)
        assert holder.until("got", "refused") == "got 0,1"  # she created the folder, for everyone
        mode = os.stat(folder)
        assert (stat.S_IMODE(mode.st_mode), mode.st_uid) == (0o1777, alice.pw_uid)
        assert stat.S_IMODE(os.stat(os.path.join(folder, "gpu-0.lock")).st_mode) == 0o666
        refused = side(bob, "all four", 4, "0,1,2,3", 0).until("got", "refused")
        assert "only 2 were free" in refused and f"GPU 0 by {alice.pw_name} (pid {holder.proc.pid}" in refused
        other = side(bob, "two more", 2, "0,1,2,3", 0)
        assert other.until("got", "refused") == "got 2,3"  # his lock files now: she must be able to lock them
        # he holds 2,3 until bob's waiter is served: were they free, it could take them the moment her dead ticket is
        # skipped, racing her holder's release of 0,1 (a fresh clone once saw "got 2,3")
        waiter = side(alice, "her second notebook", 4, "0,1,2,3", 60)
        assert waiter.until("said", "got", "refused").startswith("said parlab: waiting for 4 free GPU(s)")
        behind = side(bob, "behind her", 2, "0,1,2,3", 60)
        assert "place 2 in the queue (1 launch ahead of this one)" in behind.until("said", "got", "refused")
        assert len(_tickets(folder)) == 2
        waiter.proc.kill()  # her kernel is killed while it waits: its ticket stays, its lock is gone
        waiter.proc.wait()
        holder.let_go()
        assert behind.until("got", "refused") == "got 0,1"  # served; her dead ticket did not block him
        other.let_go()
        behind.let_go()
        dead = _tickets(folder)
        assert len(dead) == 1 and os.stat(os.path.join(folder, dead[0])).st_uid == alice.pw_uid  # sticky: his
        assert side(bob, "waiting").until("waiting") == "waiting []"  # parlab check, as bob: nobody waits
        again = side(alice, "her next launch", 1, "0,1,2,3", 0)
        assert again.until("got", "refused") == "got 0"
        again.let_go()
        assert _tickets(folder) == []  # her own next launch removed it
    finally:
        for s in sides:
            s.proc.kill()
            s.proc.wait()
            for stream in (s.proc.stdin, s.proc.stdout, s.proc.stderr):
                stream.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_lock_folder_that_cannot_be_made_is_named(box, tmp_path):
    (tmp_path / "a file").write_text("")
    with pytest.raises(LaunchError, match=r"cannot create the GPU lock folder .*a file/locks .*PARLAB_GPU_LOCKS"):
        lease.acquire(1, env=dict(box, PARLAB_GPUS="0", PARLAB_GPU_LOCKS=str(tmp_path / "a file" / "locks")), wait=0)
    with lease.acquire(1, env=dict(box, PARLAB_GPUS="0"), wait=0):  # made whole, for everyone, whatever the umask
        assert os.stat(box["PARLAB_GPU_LOCKS"]).st_mode & 0o7777 == 0o1777
    assert [n for n in os.listdir(tmp_path) if n.startswith(".parlab-gpus-")] == []


def test_one_line_puts_a_chapter_on_the_cpu(box, monkeypatch, capsys):
    """docs/workshop.md: chapter 07's 8 ranks would take a whole shared pool of 8 for each launch; the line
    first in its Parameters cell hides the GPUs from that kernel, and its launches run on the CPU instead."""
    import pathlib

    from IPython.core.magics.osm import OSMagics

    line = "%env CUDA_VISIBLE_DEVICES="
    guide = pathlib.Path(__file__).parents[1] / "docs" / "workshop.md"
    assert f"`{line}`" in guide.read_text()
    monkeypatch.setenv("PARLAB_GPUS", "auto")
    assert make_plan(8).device_type == "cuda"  # the pool: every GPU of the box
    OSMagics(shell=None).env(line.split(" ", 1)[1])  # as the notebook runs it
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and "env: CUDA_VISIBLE_DEVICES=" in capsys.readouterr().out
    plan = make_plan(8)
    assert (plan.device_type, plan.backend, plan.gpus) == ("cpu", "gloo", 0)
    with lease.acquire(8, env=dict(box, PARLAB_GPUS="auto"), wait=0) as other:  # the others' launches: all 8
        assert other.gpus == [str(i) for i in range(8)]
