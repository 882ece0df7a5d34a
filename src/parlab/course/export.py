"""``parlab export``: turn a function written in a notebook into a script that torchrun can run.

A learner writes ``def train(): ...`` in a notebook and runs it with ``parlab.launch(train, 4)``. To run
the same code on a cluster, ``parlab export notebook.ipynb train -o train.py`` writes a script holding
the notebook's imports and exactly the definitions ``train`` needs (functions, classes and variables it
uses, and what those use in turn; the last definition of each name, as after running the whole
notebook), in notebook order, and a ``__main__`` that calls
``parlab.launch(train, world_size)``. Run it with ``python train.py`` or under torchrun: ``launch`` then
joins the job (see :mod:`parlab.lab.launch.cluster`). Nothing is copied by hand, so nothing drifts.

It reads the notebook file: save the notebook first. A bare file name that is not in the current folder
is looked up among the course's chapters, so a chapter's own export cell works wherever its kernel was
started. Only imports, function and class definitions and assignments are exported; other top-level
statements (``torch.manual_seed(0)``, a training run) are not, so put what the function needs inside it.
Chapter 00, "From notebook to cluster".
"""

from __future__ import annotations

import ast
import os

import nbformat

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def _cell_source(source: str) -> str:
    """Drop IPython syntax: cells run by a magic (%%...), line magics and shell escapes."""
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!")))


def _defined(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _bound(node) -> set[str]:
    """Names an import statement binds: ``import a.b`` binds ``a``, ``from a import b as c`` binds ``c``."""
    return {(alias.asname or alias.name).split(".")[0] for alias in node.names}


def _used(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _find_notebook(notebook: str) -> str:
    if os.path.exists(notebook):
        return notebook
    if os.path.basename(notebook) == notebook:
        from parlab.course.chapters import notebooks_dir

        chapter = notebooks_dir() / notebook
        if chapter.exists():
            return str(chapter)
    raise FileNotFoundError(
        f"notebook {notebook!r}: no such file in the working folder {os.getcwd()}, nor among the course's "
        f"chapters. Give its path, or run from the notebook's own folder (JupyterLab and `parlab run` do; "
        f"with papermill, pass --cwd).")


def _statements(nb) -> tuple[list, list]:
    """(imports, definitions) of the notebook's code cells: (node, source text) each, in notebook order."""
    imports, definitions = [], []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = _cell_source(cell.source)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            text = ast.get_source_segment(source, node)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append((node, text))
            elif isinstance(node, _DEFINITIONS):
                definitions.append((node, text))
    return imports, definitions


def _needed(definitions: list, function: str) -> set[int]:
    """The indices of the definitions ``function`` needs, itself included."""
    # A function looks its globals up when it runs, i.e. after the whole notebook ran: take the last
    # definition of each needed name, then what that definition needs, until nothing new is needed.
    last = {}
    for index, (node, _) in enumerate(definitions):
        for name in _defined(node):
            last[name] = index
    needed, keep = {function}, set()
    while needed:
        name = needed.pop()
        if name in last and last[name] not in keep:
            keep.add(last[name])
            needed |= _used(definitions[last[name]][0])
    return keep


def export_function(notebook: str, function: str, args=(), world_size: int = 4, script: str = "script.py") -> str:
    """The text of a script that runs ``function`` from ``notebook`` on ``world_size`` ranks."""
    try:
        literal = ast.literal_eval(repr(list(args))) == list(args)
    except (ValueError, SyntaxError):
        literal = False
    if not literal:
        raise ValueError(f"args must be Python literals (numbers, strings, lists, dicts); got {args!r}")
    imports, definitions = _statements(nbformat.read(_find_notebook(notebook), as_version=4))
    if not any(function in _defined(n) and not isinstance(n, (ast.Assign, ast.AnnAssign))
               for n, _ in definitions):
        names = sorted({name for n, _ in definitions if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for name in _defined(n)})
        raise ValueError(f"no function named {function!r} is defined in {notebook}; functions there: "
                         f"{', '.join(names) or 'none'}")
    keep = _needed(definitions, function)
    body = "\n\n\n".join(definitions[i][1] for i in sorted(keep))
    used = set().union(*(_used(definitions[i][0]) for i in keep))
    kept_imports = [text for node, text in imports if _bound(node) & used]
    header = list(dict.fromkeys(kept_imports + ["import argparse", "import os", "import parlab"]))
    return f'''"""Exported from {notebook} by `parlab export`: runs `{function}` on N ranks.

    python {script} --world-size {world_size}        # ranks started by parlab; prints every rank's value
    torchrun --nproc-per-node {world_size} {script}  # each process is one rank; rank 0 prints its value
"""

{chr(10).join(header)}


{body}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", {world_size})))
    result = parlab.launch({function}, parser.parse_args().world_size, args={list(args)!r})
    if parlab.rank() == 0:
        print(result)
'''
