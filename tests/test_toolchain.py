"""``parlab check``'s GPU toolchain rows (parlab.course.toolchain), on faked values: the driver against the
CUDA this torch was built for, and the C compiler and Python headers a GPU's torch.compile builds with."""

from __future__ import annotations

import subprocess

import pytest

from parlab.course import cli, toolchain

SMI = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
"""


@pytest.mark.parametrize("build, driver, gpus, ok, says", [
    ("13.0", "12.4", 2, False, "FAILED: built for CUDA 13.0; the driver supports CUDA 12.4, too old for this build"),
    ("13.0", "13.0", 2, True, "ok: built for CUDA 13.0; the driver supports CUDA 13.0"),
    ("12.8", "13.0", 8, True, "ok: built for CUDA 12.8; the driver supports CUDA 13.0"),  # newer drivers run older builds
    ("12.8", "12.4", 2, True, "WARNING: built for CUDA 12.8; the driver supports CUDA 12.4: it runs by CUDA's "
                              "minor-version compatibility"),
    ("13.0", None, 1, False, "built for CUDA 13.0; no NVIDIA driver found (nvidia-smi, NVML): install one"),
    ("13.0", None, 0, True, "built for CUDA 13.0; no NVIDIA driver found"),  # a CUDA wheel on a laptop: CPU mode
    (None, None, 0, True, "CPU build of torch: no CUDA"),
    (None, "13.0", 2, True, "CPU build of torch: no CUDA (GPU mode needs the CUDA build of torch); the driver "
                            "supports CUDA 13.0; 2 GPU(s)"),
])
def test_the_driver_against_the_build(build, driver, gpus, ok, says):
    verdict = toolchain.cuda_verdict(build, driver, gpus)
    assert verdict.ok == ok and verdict.text.startswith(says), verdict


def test_a_too_old_driver_says_what_to_install():
    text = toolchain.cuda_verdict("13.0", "12.9", 4).text
    assert "Install an NVIDIA driver for CUDA 13.x, or the torch build for CUDA 12.x" in text


@pytest.mark.parametrize("build, driver", [("13", "12.4"), ("13.0", "new")])
def test_versions_that_are_not_versions_are_refused(build, driver):
    with pytest.raises(ValueError, match="must be a CUDA version like"):
        toolchain.cuda_verdict(build, driver, 1)


def test_the_drivers_cuda_from_nvidia_smi_else_nvml():
    said = lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=SMI, stderr="")  # noqa: E731
    assert toolchain.driver_cuda_version(run=said, nvml=lambda: "12.2") == "13.0"
    silent = lambda *a, **k: subprocess.CompletedProcess(a, 9, stdout="", stderr="NVIDIA-SMI has failed")  # noqa: E731
    assert toolchain.driver_cuda_version(run=silent, nvml=lambda: "12.2") == "12.2"

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    assert toolchain.driver_cuda_version(run=missing, nvml=lambda: None) is None


@pytest.mark.parametrize("cc, headers, gpus, ok, says", [
    ("/usr/bin/gcc", "/usr/include/python3.11/Python.h", 2, True, "ok: C compiler /usr/bin/gcc"),
    (None, "/usr/include/python3.11/Python.h", 2, False, "FAILED: C compiler none; Python.h /usr/include"),
    ("/usr/bin/gcc", None, 1, False, "FAILED: C compiler /usr/bin/gcc; Python.h missing"),
    (None, None, 0, True, "C compiler none; Python.h missing (not needed on CPU"),
])
def test_the_compiler_and_headers_a_gpus_compile_needs(cc, headers, gpus, ok, says):
    verdict = toolchain.compiler_verdict(cc, headers, gpus, hint="HINT")
    assert verdict.ok == ok and verdict.text.startswith(says), verdict
    if not ok:
        lacking = " and ".join(w for w, have in (("a C compiler", cc), ("this Python's headers", headers)) if not have)
        assert verdict.text.endswith(f"Install {lacking}: HINT")


def test_the_install_hint_names_this_pythons_headers():
    assert "python3.12-dev" in toolchain.install_hint("3.12") and "CC" in toolchain.install_hint("3.12")


def test_the_compiler_is_tritons_choice(monkeypatch, tmp_path):
    cc = tmp_path / "mycc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    assert toolchain.c_compiler({"CC": str(cc)}) == str(cc)  # $CC first
    assert toolchain.c_compiler({"CC": str(tmp_path / "absent")}) is None  # a CC that is not there: none
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: {"clang": "/usr/bin/clang"}.get(name))
    assert toolchain.c_compiler({}) == "/usr/bin/clang"  # no gcc: clang


def test_parlab_check_fails_on_a_driver_too_old(monkeypatch, capsys):
    """The row is printed and the check's exit status is 1 (the smoke test itself faked: ok)."""
    monkeypatch.setattr(cli, "_smoke", lambda backend, world_size=2: ("ok (faked)", True))
    monkeypatch.setattr(toolchain, "driver_cuda_version", lambda: "12.4")
    monkeypatch.setattr(cli, "_toolchain", lambda build, gpus, real=cli._toolchain: real("13.0", 2))
    assert cli.check() == 1
    out = capsys.readouterr().out
    assert "CUDA           FAILED: built for CUDA 13.0; the driver supports CUDA 12.4, too old" in out
    assert out.rstrip().endswith("Some checks FAILED (see above).")


def test_the_gpu_runner_is_asked_for_the_builds_cuda_not_a_fixed_one():
    """torch 2.13's default wheel is very probably a CUDA 13 build: "a driver for CUDA 12" would not run it."""
    import pathlib
    import re

    root = pathlib.Path(__file__).parent.parent
    for path in (root / ".github/workflows/ci.yml", root / "docs/ci.md"):
        text = " ".join(line.lstrip("# ") for line in path.read_text().splitlines())
        assert not re.search(r"CUDA 12 driver|driver for CUDA 12", text), f"{path.name} names a fixed CUDA 12 driver"
        assert re.search(r"supports the CUDA version of the installed (torch )?build", text), path.name
        assert "very probably" in text and "13.x" in text and "parlab check" in text, path.name
        assert "python3-dev" in text, f"{path.name}: say what torch.compile's C module needs installed"
