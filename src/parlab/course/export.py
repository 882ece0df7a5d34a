"""``parlab export``: turn a function written in a notebook into a script that torchrun can run.

A learner writes ``def train(): ...`` in a notebook and runs it with ``parlab.launch(train, 4)``. To run
the same code on a cluster, ``parlab export notebook.ipynb train -o train.py`` writes a script holding
the notebook's imports and exactly the definitions ``train`` needs (functions, classes and variables it
uses, and what those use in turn; the last definition of each name, as after running the whole
notebook), in notebook order. Nothing is copied by hand, so nothing drifts.

What the cluster needs depends on what the function uses, and the script's first lines say which:

- **Plain PyTorch** (the function uses nothing of the course, or only ``parlab.rank()``,
  ``parlab.world_size()``, ``parlab.local_rank()`` and ``parlab.device()``, which the export writes out as
  ``torch.distributed`` calls and a ``LOCAL_RANK`` rule): the script needs torch and the function's own
  imports, nothing of the course. Under torchrun each process joins the job's group (NCCL when every rank
  on the node has a GPU, else gloo), runs the function and rank 0 prints its value; ``python script.py
  --world-size N`` starts N such processes on this machine with ``torch.distributed.run --standalone``.
- **The course's package** (the function uses more of ``parlab``: a model, a strategy, ``parlab.launch``):
  the script calls ``parlab.launch(function, world_size)``, which joins a torchrun job (see
  :mod:`parlab.lab.launch.cluster`). Every node then needs the course installed (``pip install -e .`` in a
  clone of its repository, or ``pip install`` of the repository); the script's docstring says so and
  names what it uses, and it stops with that message where ``parlab`` is missing.

It reads the notebook file: save the notebook first. A bare file name that is not in the current folder
is looked up among the course's chapters, so a chapter's own export cell works wherever its kernel was
started. Only imports, function and class definitions and assignments are exported; other top-level
statements (``torch.manual_seed(0)``, a training run) are not, so put what the function needs inside it.
Chapter 00, "From notebook to cluster"; docs/launcher.md, the same section.
"""

from __future__ import annotations

import ast
import os
import re

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
    plain = re.sub(_HELPER_CALL, lambda m: _PLAIN[m.group(1)], body)
    plain_used = _used(ast.parse(plain))
    plain_imports = [text for node, text in imports if _bound(node) & plain_used]
    if not re.search(r"\bparlab\b", "\n".join([plain, *plain_imports])):
        return _plain_script(notebook, function, args, world_size, script, plain_imports, plain,
                             rank_device="_rank_device()" in plain)
    uses = sorted(set(re.findall(r"\bparlab(?:\.\w+)+", body + "\n".join(kept_imports)))) or ["parlab"]
    header = list(dict.fromkeys([t for t in kept_imports if t != "import parlab"] + ["import argparse", "import os"]))
    return f'''"""Exported from {notebook} by `parlab export`: runs `{function}` on N ranks.

    python {script} --world-size {world_size}        # ranks started by parlab; prints every rank's value
    torchrun --nproc-per-node {world_size} {script}  # each process is one rank; rank 0 prints its value

Needs the course's package `parlab` on every node, since it uses {", ".join(uses)}:
`pip install -e .` in a clone of the course's repository (or pip install the repository).
"""

try:
    import parlab
except ImportError:
    raise SystemExit("{script} needs the course's package parlab: pip install -e . in a clone of its repository")
{chr(10).join(header)}


{body}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", {world_size})))
    result = parlab.launch({function}, parser.parse_args().world_size, args={list(args)!r})
    if parlab.rank() == 0:
        print(result)
'''


#: ``parlab.rank()`` and its kind, called with no arguments: written out in plain PyTorch by the export.
_HELPER_CALL = re.compile(r"\bparlab\.(rank|world_size|local_rank|device)\(\)")
_PLAIN = {"rank": "torch.distributed.get_rank()", "world_size": "torch.distributed.get_world_size()",
          "local_rank": "int(os.environ[\"LOCAL_RANK\"])", "device": "_rank_device()"}


def _plain_script(notebook, function, args, world_size, script, kept_imports, body, rank_device) -> str:
    """A script that needs torch and the function's imports only: torchrun's environment, a plain group."""
    header = list(dict.fromkeys(kept_imports + ["import argparse", "import os", "import subprocess", "import sys",
                                                "import torch", "import torch.distributed"]))
    device = '''

def _rank_device():  # the course's device(): this rank's own GPU when every rank on the node has one, else the CPU
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cpu")
''' if rank_device else ""
    return f'''"""Exported from {notebook} by `parlab export`: runs `{function}` on N ranks, in plain PyTorch.

    python {script} --world-size {world_size}        # starts {world_size} ranks here (torchrun --standalone)
    torchrun --nproc-per-node {world_size} {script}  # each process is one rank; rank 0 prints its value

Needs torch and the imports below, nothing of the course: copy this file alone to the cluster.
"""

{chr(10).join(header)}
{device}

{body}


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:  # started by python, not torchrun: torchrun starts the ranks on this machine
        parser = argparse.ArgumentParser()
        parser.add_argument("--world-size", type=int, default={world_size})
        n = parser.parse_args().world_size
        sys.exit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={{n}}", os.path.abspath(__file__)]))
    gpu = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])  # a GPU per rank: NCCL, else gloo
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl" if gpu else "gloo")
    result = {function}(*{list(args)!r})
    if torch.distributed.get_rank() == 0:
        print(result, flush=True)
    torch.distributed.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown, which can abort a gloo rank (docs/launcher.md)
'''
