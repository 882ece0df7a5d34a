"""What a GPU machine needs besides torch, for ``parlab check``: a driver for the CUDA this torch was built
with, and for chapter 08's ``torch.compile`` cell a C compiler and this Python's headers (Triton builds a
small C module the first time it compiles for a GPU).

Each verdict is a function of plain values (versions as text, paths), so its rules are tested with faked
values on any machine; the functions that ask the machine are separate and small.

The CUDA rule (NVIDIA's compatibility policy): a driver runs any build of its own CUDA major version or an
older one; a build of a newer major version does not start ("the NVIDIA driver on your system is too
old"). Within one major version an older driver still runs the build (minor-version compatibility), but
code compiled at run time for the newer minor version (Triton's kernels, for ``torch.compile``) may not
load: that is a warning, not a failure.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    ok: bool  # False: parlab check fails
    text: str  # the row's text: what was found, and what to do when it is not ok (or worth a warning)


def _version(text: str | None) -> tuple[int, int] | None:
    match = re.fullmatch(r"\s*(\d+)\.(\d+)(\.\d+)?\s*", text or "")
    return (int(match[1]), int(match[2])) if match else None


def cuda_verdict(build: str | None, driver: str | None, gpus: int) -> Verdict:
    """Whether the driver (the CUDA version it supports, ``nvidia-smi``'s "CUDA Version", e.g. "12.4") runs
    this torch's build (``torch.version.cuda``, e.g. "13.0"; None: a CPU build) on ``gpus`` visible GPUs."""
    if build is None:
        return Verdict(True, "CPU build of torch: no CUDA (GPU mode needs the CUDA build of torch)"
                             + (f"; the driver supports CUDA {driver}" if driver else "")
                             + (f"; {gpus} GPU(s) visible go unused" if gpus else ""))
    built = _version(build)
    if built is None:
        raise ValueError(f"build must be a CUDA version like '13.0' (torch.version.cuda) or None; got {build!r}")
    if driver is None:
        return Verdict(gpus == 0, f"built for CUDA {build}; no NVIDIA driver found (nvidia-smi, NVML)"
                       + ("" if gpus == 0 else ": install one that supports CUDA " + f"{built[0]}.x or later"))
    supported = _version(driver)
    if supported is None:
        raise ValueError(f"driver must be a CUDA version like '12.4' (nvidia-smi's 'CUDA Version'); got {driver!r}")
    said = f"built for CUDA {build}; the driver supports CUDA {driver}"
    if supported[0] < built[0]:
        return Verdict(False, f"FAILED: {said}, too old for this build: torch will not start CUDA. Install an "
                              f"NVIDIA driver for CUDA {built[0]}.x, or the torch build for CUDA {supported[0]}.x "
                              f"(the wheel for your CUDA from https://pytorch.org/get-started/locally/)")
    if supported < built:
        return Verdict(True, f"WARNING: {said}: it runs by CUDA's minor-version compatibility, but kernels "
                             f"compiled at run time (torch.compile, chapter 08) may need a driver for CUDA {build}")
    return Verdict(True, f"ok: {said}")


def driver_cuda_version(run=subprocess.run, nvml=None) -> str | None:
    """The CUDA version the NVIDIA driver supports ("13.0"), from ``nvidia-smi``'s header, else from NVML;
    None when neither is there. Asks no GPU for a CUDA context."""
    if shutil.which("nvidia-smi") or run is not subprocess.run:
        try:
            out = run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
            found = re.search(r"CUDA Version\s*:\s*(\d+\.\d+)", out.stdout or "")
            if found:
                return found[1]
        except (OSError, subprocess.SubprocessError):
            pass
    return (nvml or _nvml_cuda_version)()


def _nvml_cuda_version() -> str | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
        version = ctypes.c_int()
        code = lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(version))
        lib.nvmlShutdown()
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}" if code == 0 else None


def install_hint(python: str = f"{sys.version_info.major}.{sys.version_info.minor}") -> str:
    return (f"Debian/Ubuntu: sudo apt-get install gcc python{python}-dev (or build-essential python3-dev for the "
            f"system's Python); conda: conda install -c conda-forge c-compiler; or set CC to a C compiler")


def compiler_verdict(cc: str | None, headers: str | None, gpus: int, hint: str | None = None) -> Verdict:
    """Whether chapter 08's GPU cell can compile: ``cc``, the C compiler Triton would use (None: none
    found), and ``headers``, this Python's ``Python.h`` (None: missing). Missing either fails only where
    there is a GPU: on CPU the chapter compiles with ``aot_eager``, which builds nothing."""
    found = f"C compiler {cc or 'none'}; Python.h {headers or 'missing'}"
    if cc and headers:
        return Verdict(True, f"ok: {found}")
    lacking = " and ".join(what for what, have in (("a C compiler", cc), ("this Python's headers", headers))
                           if not have)
    if not gpus:
        return Verdict(True, f"{found} (not needed on CPU; a GPU's torch.compile needs {lacking})")
    return Verdict(False, f"FAILED: {found}: torch.compile on a GPU (chapter 08) builds a C module with them. "
                          f"Install {lacking}: {hint or install_hint()}")


def c_compiler(env=None) -> str | None:
    """The C compiler Triton uses: ``$CC``, else gcc, else clang (triton/runtime/build.py's order)."""
    env = env if env is not None else os.environ
    if env.get("CC"):
        return shutil.which(env["CC"]) or None
    return shutil.which("gcc") or shutil.which("clang")


def python_headers() -> str | None:
    """This interpreter's ``Python.h``, where Triton looks for it (``sysconfig``'s include folder)."""
    path = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return path if os.path.exists(path) else None
