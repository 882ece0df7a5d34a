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

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from parlab.lab.launch.cell import CellProgram, pack_variables, referenced_names
from parlab.lab.launch.launcher import START_METHODS, launch


@magics_class
class RankMagics(Magics):
    @magic_arguments()
    @argument("-n", "--world-size", type=int, default=2, help="number of ranks (default 2)")
    @argument("--backend", default="auto", help="auto (default), gloo or nccl")
    @argument("--timeout", type=float, default=30.0, help="seconds a collective may wait (default 30)")
    @argument("--rank0", action="store_true", help="show only rank 0's output")
    @argument("--quiet", action="store_true", help="no output at all from the ranks")
    @argument("--out", default=None, help="store the per-rank values of the last expression in this variable")
    @argument("--start-method", default=None, choices=START_METHODS,
              help="zygote (default on Linux) or spawn (default on macOS and Windows)")
    @cell_magic
    def ranks(self, line, cell):
        """Run this cell on N ranks: ``%%ranks -n 4 [--backend gloo] [--timeout 10] [--rank0] [--start-method spawn]``."""
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
        results = launch(program, args.world_size, backend=args.backend, timeout=args.timeout, output=output,
                         start_method=args.start_method)
        if args.out:
            self.shell.user_ns[args.out] = results
        return results if any(r is not None for r in results) else None


def register(ipython) -> None:
    ipython.register_magics(RankMagics)
