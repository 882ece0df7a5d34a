"""The errors a launch raises in the notebook, each naming the rank and the root cause.

When one rank fails, its peers usually fail too, a moment later and for a dull reason ("Connection
closed by peer", a timed-out receive). The launcher keeps the first real cause and reports the others
in one line each. Taught in chapter 00.
"""

from __future__ import annotations

import signal

from parlab.lab.language import say


def hang_hint() -> str:
    """What a hang report ends with: how to avoid the hang, in the learner's language."""
    return say("Every rank must call the same collectives, in the same order, with tensors of the same size. "
               "Raise the limit with timeout=... if the work is merely slow.")


def classify_exception(exc: BaseException) -> str:
    """Why a rank's function raised: 'timeout' (a collective waited too long), 'comm' (a peer went away)
    or 'own' (a cause of its own: the root cause when peers fail after it)."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TimeoutError) or "Timed out" in text or "timed out" in text or "DistTimeoutError" in text:
        return "timeout"
    markers = ("Connection closed by peer", "Connection reset", "Broken pipe", "DistNetworkError",
               "DistBackendError", "gloo/transport", "NCCL communicator was aborted")
    if any(m in text for m in markers):
        return "comm"
    return "own"


class LaunchError(RuntimeError):
    """Base class: something went wrong on the ranks of a launch."""

    def __init__(self, message: str, *, statuses: dict[int, str] | None = None):
        super().__init__(message)
        self.statuses = statuses or {}

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback: the launcher's own frames would only hide the
        rank's traceback, which the message already holds."""
        return f"{type(self).__name__}: {self}".splitlines()


class RankError(LaunchError):
    """A rank raised an exception. ``exception`` is the original object when it could travel."""

    def __init__(self, rank, world_size, type_name, message, remote_traceback, exception=None, statuses=None):
        self.rank, self.world_size = rank, world_size
        self.type_name, self.remote_message, self.remote_traceback = type_name, message, remote_traceback
        self.exception = exception
        text = say("rank {rank} of {world_size} raised {type_name}: {message}", rank=rank, world_size=world_size,
                   type_name=type_name, message=message) + "\n\n"
        text += say("Traceback on rank {rank} (most recent call last):", rank=rank) + f"\n{_body(remote_traceback)}"
        text += _others(statuses, rank)
        super().__init__(text, statuses=statuses)


class RankCrashedError(LaunchError):
    """A rank's process ended without reporting: killed by a signal, or exited from native code."""

    def __init__(self, rank, world_size, exitcode, last_lines=(), statuses=None):
        self.rank, self.world_size, self.exitcode = rank, world_size, exitcode
        self.signal = -exitcode if exitcode is not None and exitcode < 0 else None
        killed = self.signal is not None and self.signal == getattr(signal, "SIGKILL", None)
        text = say("rank {rank} of {world_size} {what}{oom}.", rank=rank, world_size=world_size,
                   what=describe_exit(exitcode),
                   oom=say(" (on Linux the out-of-memory killer sends SIGKILL: check memory per rank)") if killed else "")
        if last_lines:
            text += "\n\n" + say("Last lines rank {rank} wrote to stderr:", rank=rank) + "\n"
            text += "".join(f"  {l}\n" for l in last_lines)
        text += _others(statuses, rank)
        super().__init__(text, statuses=statuses)


class RankTimeoutError(LaunchError, TimeoutError):
    """No progress within ``timeout`` seconds: a collective could not complete. ``stacks`` maps rank to
    where that rank was waiting; ``waited``, ``busy`` and ``returned`` list the ranks that waited in a
    collective, were busy outside one, and had already returned (what ``plots.ranks.hang`` draws)."""

    def __init__(self, timeout, world_size, stacks: dict[int, str], statuses=None, summary="", *,
                 waited=(), busy=(), returned=()):
        self.timeout, self.world_size, self.stacks = timeout, world_size, stacks
        self.waited, self.busy, self.returned = sorted(waited), sorted(busy), sorted(returned)
        text = say("{summary} (timeout={timeout:g} s).", summary=summary or say("no progress"), timeout=timeout)
        text += "\n\n" + say("Where each rank was:") + "\n"
        for rank in sorted(stacks):
            text += f"--- rank {rank}: {stacks[rank]}\n"
        text += "\n" + hang_hint()
        super().__init__(text, statuses=statuses)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return say("ended without reporting")
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return say("was killed by signal {name} ({number})", name=name, number=-exitcode)
    return say("exited with code {code} before its function returned", code=exitcode)


def _body(tb: str) -> str:
    lines = tb.splitlines(keepends=True)
    if lines and lines[0].startswith("Traceback"):
        lines = lines[1:]
    return "".join(lines)


def _others(statuses, rank) -> str:
    others = {r: s for r, s in (statuses or {}).items() if r != rank}
    if not others:
        return ""
    return "\n" + say("The other ranks:") + "\n" + "".join(f"  rank {r}: {s}\n" for r, s in sorted(others.items()))
