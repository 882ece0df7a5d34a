"""The package's floors (docs/course_design.md, "The repository"): the lab at the bottom, the decision tools
above it, the course's machinery on top; a module imports only from its own floor or one below.

Within the lab, the instruments sit below the strategies they watch: ``measure`` never imports
``parallel``, so a log can attach to any strategy without the strategy's code knowing of it.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "parlab"
#: the package's floors, bottom first
FLOORS = ("lab", "decide", "course")
#: the lab's own tiers, bottom first (``parlab.lab.X``)
LAB_TIERS = (("checks", "language", "runtime", "topology"), ("launch", "measure"), ("parallel", "models"),
             ("compose_models", "training", "compose", "builtin", "job", "plots"))


def level(module: str) -> tuple[int, int] | None:
    """(floor, tier) of a dotted ``parlab`` module; None for the package's front door (``parlab``,
    ``parlab.__main__``), which may import from every floor."""
    parts = module.split(".")
    if parts[0] != "parlab" or len(parts) < 2 or parts[1] not in FLOORS:
        return None
    floor = FLOORS.index(parts[1])
    if parts[1] != "lab" or len(parts) < 3:
        return floor, 0
    tiers = [i for i, names in enumerate(LAB_TIERS) if parts[2] in names]
    if not tiers:
        raise AssertionError(f"{module}: parlab.lab.{parts[2]} has no tier in LAB_TIERS")
    return floor, tiers[0]


def imports_of(path: pathlib.Path) -> set[str]:
    """Every ``parlab`` name ``path`` imports, at the top or inside a function (``from a import b``: a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("parlab"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("parlab")}
    return found


def upward_imports(package: pathlib.Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        module = ".".join(("parlab", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        mine = level(module)
        if mine is None:
            continue
        for imported in sorted(imports_of(path)):
            theirs = level(imported)
            if theirs is not None and theirs > mine:
                bad.append(f"{module} imports {imported}")
    return bad


def test_the_top_folder_holds_the_three_floors_and_every_lab_part_has_a_tier():
    tops = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", ".")))
    assert tops == sorted(FLOORS), f"the package's top folder holds only its floors; found {tops}"
    lab = sorted(p.name.removesuffix(".py") for p in (PACKAGE / "lab").iterdir()
                 if not p.name.startswith(("_", ".")))
    assert lab == sorted(n for names in LAB_TIERS for n in names), "every part of the lab has a tier"


def test_no_import_runs_up_a_floor():
    assert upward_imports() == []


def test_an_upward_import_is_caught(tmp_path):
    (tmp_path / "lab" / "measure").mkdir(parents=True)
    (tmp_path / "lab" / "measure" / "x.py").write_text("from parlab.lab.parallel import comm\n"
                                                       "from parlab.lab import runtime\n"
                                                       "def f():\n    from parlab.decide import planner\n")
    assert upward_imports(tmp_path) == ["parlab.lab.measure.x imports parlab.decide.planner",
                                        "parlab.lab.measure.x imports parlab.lab.parallel.comm"]
