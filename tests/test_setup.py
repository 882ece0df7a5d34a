"""The ways to install the course agree: pyproject.toml, environment.yml (conda), binder/ (Binder, CPU),
./lab and .ci/run name the same packages, the same torch, and a Python the package accepts; the CI
workflow's CPU job runs what .ci/run runs, and its GPU job runs the GPU tests, every chapter on NCCL and
the GPU benchmarks."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version


tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
ROOT = pathlib.Path(__file__).parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def _requirements(lines) -> dict[str, Requirement]:
    reqs = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):  # options (--extra-index-url, -e .) are not packages
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


def _pinned(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not pinned with =="
    return Version(spec.version)


PROJECT = _requirements(PYPROJECT["dependencies"])
BINDER = _requirements((ROOT / "binder" / "requirements.txt").read_text().splitlines())
CONDA = yaml.safe_load((ROOT / "environment.yml").read_text())
CONDA_PIP = next(d["pip"] for d in CONDA["dependencies"] if isinstance(d, dict))


def _course_torch() -> Version:
    """The torch ./lab installs by default: the version the course is tested with."""
    m = re.search(r"PARLAB_TORCH:-torch==([\w.]+)", (ROOT / "lab").read_text())
    assert m, "./lab names no default torch (PARLAB_TORCH:-torch==X)"
    return Version(m.group(1))


def test_binder_installs_every_dependency_as_pyproject_names_it():
    # postBuild installs parlab with --no-deps: requirements.txt must hold every dependency itself.
    assert set(BINDER) == set(PROJECT), (f"binder/requirements.txt lacks {sorted(set(PROJECT) - set(BINDER))}, "
                                         f"has extra {sorted(set(BINDER) - set(PROJECT))}")
    for name, req in PROJECT.items():
        if name == "torch":
            continue  # pinned to the CPU build, below
        assert BINDER[name].specifier == req.specifier, f"{name}: binder {BINDER[name]} vs pyproject {req}"
    assert "--no-deps -e ." in (ROOT / "binder" / "postBuild").read_text()


def test_one_torch_everywhere():
    torch = _course_torch()
    assert torch in PROJECT["torch"].specifier, f"the course's torch {torch} is outside pyproject's {PROJECT['torch']}"
    assert _pinned(BINDER["torch"]) == torch, "binder/requirements.txt pins another torch than ./lab"
    assert _pinned(_requirements(CONDA_PIP)["torch"]) == torch, "environment.yml pins another torch than ./lab"
    ci = re.search(r'PARLAB_TORCH="torch==([\w.]+)"', (ROOT / ".ci" / "run").read_text())
    assert ci and Version(ci.group(1)) == torch, ".ci/run installs another torch than ./lab"
    # CPU builds for Binder and conda: the default (CUDA) wheel is gigabytes a laptop does not need
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in (ROOT / "binder" / "requirements.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in CONDA_PIP


def test_conda_installs_the_project_and_a_python_it_accepts():
    assert "-e .[dev]" in CONDA_PIP, "environment.yml must install the course itself (pip: -e .[dev])"
    python = next(d for d in CONDA["dependencies"] if isinstance(d, str) and d.startswith("python="))
    version = python.split("=", 1)[1]
    assert Version(version) in SpecifierSet(PYPROJECT["requires-python"])
    binder_python = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert binder_python == f"python-{version}", f"binder/runtime.txt says {binder_python}, environment.yml {python}"
    # conda packages other than python and pip would shadow what pyproject pins
    assert sorted(d.split("=")[0] for d in CONDA["dependencies"] if isinstance(d, str)) == ["pip", "python"]


def test_binder_opens_chapter_00():
    assert "/lab/tree/notebooks/00_welcome.ipynb" in (ROOT / "binder" / "postBuild").read_text()
    assert (ROOT / "notebooks" / "00_welcome.ipynb").exists()
    readme = (ROOT / "README.md").read_text()
    assert "urlpath=lab/tree/notebooks/00_welcome.ipynb" in readme
    # a badge or link with a placeholder owner opens nothing: the address is given as text until it exists
    assert not re.search(r"\]\(https://[^)]*OWNER", readme), "a link in README.md points at a placeholder address"


# -- the CI workflow --------------------------------------------------------------------------------------

def _steps(job: str) -> str:
    flow = yaml.safe_load(WORKFLOW.read_text())
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", "")) for step in flow["jobs"][job]["steps"])


def test_cpu_job_runs_what_ci_runs():
    assert re.search(r"^\s*\.ci/run\s*$", _steps("cpu"), re.M), "the CPU job must run .ci/run, as CI here does"


def test_gpu_job_runs_gpu_tests_chapters_on_nccl_and_benchmarks():
    flow = yaml.safe_load(WORKFLOW.read_text())
    job = flow["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "parlab-gpu"], "the label docs/ci.md and docs/workshop.md name"
    steps = _steps("gpu")
    assert "pytest -m gpu" in steps
    assert re.search(r"parlab run --ci --require-gpu --output \S+", steps)
    assert "benchmarks/dp_vs_ddp.py" in steps
    for bench in ("ddp_throughput", "zero", "tensor_parallel", "pipeline_schedules"):  # every built-in comparison
        assert bench in steps and (ROOT / "benchmarks" / f"{bench}.py").exists()
    # One statement of the runner's size (tests/test_gpu_mode.py checks it in every place it is made).
    assert "assert n >= 1, 'a GPU runner: 1, 2, 4 or 8 NVIDIA GPUs'" in steps
    assert "a GPU runner: 1, 2, 4 or 8 NVIDIA GPUs" in (ROOT / "docs" / "ci.md").read_text()
    assert "actions/upload-artifact" in steps
    assert "parlab-gpu" in (ROOT / "docs" / "ci.md").read_text()
