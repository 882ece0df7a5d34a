"""The spawn start method: each rank is a fresh Python started by ``torch.multiprocessing``'s spawn context.

For macOS and Windows, where the zygote cannot work: Windows has no ``fork``, and on macOS forking a
process that has loaded system frameworks (torch loads Accelerate) is unsafe. A spawned rank imports
torch itself, on every launch, so it starts in seconds rather than milliseconds; the launcher measures
it and says so in the first line it prints. Everything else is as with the zygote: the function and the
notebook state travel with cloudpickle over the control connection (``_worker.run``), output comes back
through pipes, and the launcher's event loop waits on these connections and on each process's sentinel.

As with ``torch.multiprocessing.spawn``, a script (not a notebook) that launches at import time needs the
``if __name__ == "__main__":`` guard, since each new Python imports the script's main module again.
Chapter 00, "How it works".
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

import torch.multiprocessing as mp

from parlab.lab.launch import _worker


class SpawnedRank:
    """The kernel's handle on a rank started with the spawn context."""

    def __init__(self, rank: int):
        ctx = mp.get_context("spawn")
        self.ctrl, ctrl_there = ctx.Pipe(duplex=True)
        if os.name == "posix":  # plain pipes: the rank's native writes to fds 1 and 2 come back too
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            self.outputs = {out_r: 1, err_r: 2}
            out_there, err_there = Connection(out_w, readable=False), Connection(err_w, readable=False)
        else:  # Windows: message pipes, which the rank writes its Python-level output to
            out_r, out_there = ctx.Pipe(duplex=False)
            err_r, err_there = ctx.Pipe(duplex=False)
            self.outputs = {out_r: 1, err_r: 2}
        # Not a daemon: a daemonic process may not start children, and a rank may (a DataLoader's workers).
        # A rank still never outlives the kernel: it exits when its control connection closes.
        self.process = ctx.Process(target=_worker.spawned, args=(ctrl_there, out_there, err_there),
                                   name=f"parlab-rank-{rank}")
        try:
            self.process.start()
        except BaseException:
            self._close_pipes()
            raise
        finally:
            for end in (ctrl_there, out_there, err_there):
                end.close()
        self.pid = self.process.pid
        self.exit_event = self.process.sentinel

    @staticmethod
    def read(source) -> bytes:
        if isinstance(source, int):
            return os.read(source, 1 << 16)
        try:
            return source.recv_bytes()
        except (EOFError, OSError):
            return b""

    def exit_code(self) -> int | None:
        self.process.join(1.0)
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()

    def _close_pipes(self) -> None:
        self.ctrl.close()
        for source in self.outputs:
            try:
                os.close(source) if isinstance(source, int) else source.close()
            except OSError:
                pass

    def close(self) -> None:
        self._close_pipes()
        self.process.join(1.0)
        if self.process.exitcode is not None:
            self.process.close()
