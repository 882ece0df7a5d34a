"""A notebook cell as a program the ranks run: what ``%%ranks`` (``parlab/course/magic.py``) sends (chapter 00).

Kept apart from the magic so that a rank, unpickling a cell, imports neither IPython nor the magic.
"""

from __future__ import annotations

import ast
import builtins
import re

from parlab.lab.launch import _pickling

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
