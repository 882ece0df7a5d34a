"""What a failed launch says: the root cause among the ranks that failed, where each rank was when a
collective hung, and one line of status per rank (chapter 00's errors).

The event loop (``_loop.py``) decides *when* a launch has failed; these functions read its ranks and say
*what* failed: :func:`failure` picks the root cause (a rank that died or raised an error of its own, not a
follow-on "connection closed by peer") and :func:`hang` asks every running rank for its stack and says who
waited in a collective, who was busy elsewhere and who had already returned.
"""

from __future__ import annotations

import re
import time

from parlab.lab.language import say
from parlab.lab.launch import _pickling
from parlab.lab.launch.errors import LaunchError, RankCrashedError, RankError, RankTimeoutError, describe_exit


def is_root(r) -> bool:
    """A failure of the rank's own (it died, returned what cannot travel, or raised), not a follow-on."""
    return r.state in ("dead", "unpicklable") or (r.state == "raised" and r.error["kind"] == "own")


def statuses(ranks) -> dict[int, str]:
    """{rank: what it did}, in words, for every rank of the launch."""
    out = {}
    for r in ranks:
        if r.state == "ok":
            out[r.rank] = say("had returned")
        elif r.state == "raised":
            if r.error["kind"] == "comm":  # its first sentence says enough; the cause is reported above
                out[r.rank] = say("raised {type}: {message} (a follow-on error: a rank it was talking to had gone)",
                                  type=r.error['type'], message=_sentence(r.error['message'], first=True))
            else:
                out[r.rank] = say("raised {type}: {message}", type=r.error['type'],
                                  message=_sentence(r.error['message']))
        elif r.state == "dead":
            out[r.rank] = describe_exit(r.exitcode)
        elif r.state == "unpicklable":
            out[r.rank] = say("returned a value that cannot be pickled")
        else:
            out[r.rank] = say("was still running; stopped by parlab")
    return out


def failure(run) -> LaunchError:
    """The error ``run`` (a ``_loop._Launch`` whose ranks have failed) raises: its root cause's."""
    states = statuses(run.ranks)
    roots = [r for r in run.failures if is_root(r)]
    if not roots and all(r.state == "raised" and r.error["kind"] == "timeout" for r in run.failures):
        return hang(run)
    r = (roots or run.failures)[0]
    ws = run.plan.world_size
    if r.state == "dead" and any("Watchdog caught collective operation timeout" in line for line in r.last_err):
        return hang(run)  # NCCL's watchdog aborts a rank whose collective timed out
    if r.state == "dead":
        run.stop()
        run.drain(deadline=time.monotonic() + 1.0)  # its last words may still be in the pipe
        return RankCrashedError(r.rank, ws, r.exitcode, tuple(r.last_err), states)
    if r.state == "unpicklable":
        return LaunchError(
            say("rank {rank} of {world_size} returned a value that cannot be pickled ({error}), so it cannot travel "
                "back to the notebook. Return plain values: numbers, strings, lists, dicts, numpy arrays or tensors.",
                rank=r.rank, world_size=ws, error=r.error), statuses=states)
    err = r.error
    original = None
    if err["exception"] is not None:
        try:
            original = _pickling.loads(err["exception"])
        except Exception:  # noqa: BLE001
            original = None
    from parlab.lab.launch.simgpu import NeedsRealGPU

    if isinstance(original, NeedsRealGPU):  # simulated GPUs: where only a real one answers (parlab run goes on)
        return original
    return RankError(r.rank, ws, err["type"], err["message"], _cell_names(err["traceback"]), original, states)


def hang(run) -> RankTimeoutError:
    """The error of a collective that cannot complete: where each rank of ``run`` was, asked now."""
    run.probe_stacks([r for r in run.ranks if r.state == "running"])
    states = statuses(run.ranks)
    now, timeout = time.monotonic(), run.plan.timeout
    stacks, waited, returned, busy = {}, [], [], []
    for r in run.ranks:
        if r.state == "ok":
            returned.append(r.rank)
            stacks[r.rank] = say("had returned from its function {seconds:.1f} s before",
                                 seconds=now - r.finished_at)
        elif r.state == "raised":
            waited.append(r.rank)
            stacks[r.rank] = (say("waited in a collective until it timed out ({message}), at:",
                                  message=_gloo_message(r.error['message']))
                              + f"\n{_indent(_cell_names(r.error['where']))}")
        elif r.stack is not None:
            text, in_collective = r.stack
            (waited if in_collective else busy).append(r.rank)
            what = say("waiting in a collective, at:") if in_collective else say("busy outside any collective, at:")
            stacks[r.rank] = f"{what}\n{_indent(_cell_names(text))}"
        else:
            stacks[r.rank] = states[r.rank]
    parts = []
    if waited:
        parts.append(say("{ranks} waited {timeout:g} s in a collective", ranks=_ranks(waited), timeout=timeout))
    if busy:
        parts.append(say("{ranks} was still busy elsewhere (if it is just slow, raise timeout)", ranks=_ranks(busy))
                     if len(busy) == 1 else
                     say("{ranks} were still busy elsewhere (if it is just slow, raise timeout)", ranks=_ranks(busy)))
    if returned:
        parts.append(say("{ranks} had already returned, so never joined it", ranks=_ranks(returned)) if waited
                     else say("{ranks} had already returned", ranks=_ranks(returned)))
    return RankTimeoutError(timeout, run.plan.world_size, stacks, states, say("; ").join(parts), waited=waited,
                            busy=busy, returned=returned)


# -- words ---------------------------------------------------------------------------------------------------


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


def _ranks(ranks: list[int]) -> str:
    listed = ', '.join(map(str, ranks))
    return say("ranks {ranks}", ranks=listed) if len(ranks) > 1 else say("rank {ranks}", ranks=listed)


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
