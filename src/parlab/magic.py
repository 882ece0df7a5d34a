"""The ``%%ranks`` cell magic: run a cell's body on N ranks (chapter 00).

``%load_ext parlab``, then::

    %%ranks -n 4
    t = torch.ones(2) * parlab.rank()
    dist.all_reduce(t)
    t

Each rank executes the cell as module-level code, with the notebook variables that the cell names
(functions and classes defined in earlier cells included). Output, errors and timeouts behave as in
:func:`parlab.launch`, which runs it. If the cell ends in an expression, the magic returns the list of
its value on each rank; ``--out NAME`` stores that list in the notebook as ``NAME``.
"""

from __future__ import annotations

import ast
import builtins
import re

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from parlab.launch import _pickling
from parlab.launch.launcher import launch

# Output-history names IPython keeps in the user namespace (_, __, _5, _i5, _oh, ...): never sent.
_HISTORY = re.compile(r"_+|_i+|_i?\d+|_oh|_dh|_ih")


class CellProgram:
    """A cell's code plus the notebook variables it uses; calling it runs the cell on this rank."""

    def __init__(self, source: str, filename: str, variables: dict[str, bytes]):
        self.source, self.filename, self.variables = source, filename, variables

    def __call__(self):
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        for name, blob in self.variables.items():
            namespace[name] = _pickling.loads(blob)
        tree = ast.parse(self.source, self.filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, self.filename, "exec"), namespace)
        if last is not None:
            return eval(compile(ast.Expression(last.value), self.filename, "eval"), namespace)
        return None


def referenced_names(source: str) -> set[str]:
    """Every bare name the cell mentions; the notebook variables among them travel to the ranks."""
    return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}


def pack_variables(names, user_ns: dict, hidden=()) -> dict[str, bytes]:
    """Pickle the notebook variables among ``names``; ``hidden`` are the names IPython put there."""
    variables = {}
    for name in sorted(names):
        if name not in user_ns or name in hidden or _HISTORY.fullmatch(name):
            continue
        value = user_ns[name]
        try:
            variables[name] = _pickling.dumps(value)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(
                f"the cell uses the notebook variable {name!r} ({type(value).__name__}), which cannot be "
                f"sent to the ranks ({type(exc).__name__}: {exc}). Create it inside the cell instead."
            ) from None
    return variables


@magics_class
class RankMagics(Magics):
    @magic_arguments()
    @argument("-n", "--world-size", type=int, default=2, help="number of ranks (default 2)")
    @argument("--backend", default="auto", help="auto (default), gloo or nccl")
    @argument("--timeout", type=float, default=30.0, help="seconds a collective may wait (default 30)")
    @argument("--rank0", action="store_true", help="show only rank 0's output")
    @argument("--quiet", action="store_true", help="no output at all from the ranks")
    @argument("--out", default=None, help="store the per-rank values of the last expression in this variable")
    @cell_magic
    def ranks(self, line, cell):
        """Run this cell on N ranks: ``%%ranks -n 4 [--backend gloo] [--timeout 10] [--rank0]``."""
        __tracebackhide__ = True
        args = parse_argstring(self.ranks, line)
        filename = self.shell.compile.cache(cell)  # registers the source, so tracebacks show cell lines
        try:
            tree_ok = ast.parse(cell)
        except SyntaxError:
            tree_ok = None
        if tree_ok is None:  # let IPython show the syntax error as for any cell
            self.shell.run_cell(cell)
            return None
        program = CellProgram(cell, filename, pack_variables(
            referenced_names(cell), self.shell.user_ns, self.shell.user_ns_hidden))
        output = "none" if args.quiet else ("rank0" if args.rank0 else "all")
        results = launch(program, args.world_size, backend=args.backend, timeout=args.timeout, output=output)
        if args.out:
            self.shell.user_ns[args.out] = results
        return results if any(r is not None for r in results) else None


def register(ipython) -> None:
    ipython.register_magics(RankMagics)
