"""The zygote refuses a preload that started the CUDA driver without torch's lazy init (a library calling
cuInit, or torch counting devices through the CUDA runtime when NVML is unavailable): a rank forked from it
could not use CUDA. Its second sign, besides ``torch.cuda.is_initialized()``, is the driver library
(``libcuda.so``) mapped into the process (``_zygote.cuda_driver_mapped``, on ``/proc/self/maps``'s text)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from parlab.lab.launch import _zygote
from parlab.lab.launch.errors import LaunchError

MAPS = """\
55d0c0a00000-55d0c0a28000 r--p 00000000 08:01 1311 /usr/bin/python3.11
7f1a2b000000-7f1a2b400000 rw-p 00000000 00:00 0
7f1a2c000000-7f1a2c200000 r-xp 00000000 08:01 2222 /opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12
7f1a2d000000-7f1a2d100000 r-xp 00000000 08:01 3333 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15
7ffd1e000000-7ffd1e021000 rw-p 00000000 00:00 0                          [stack]
"""
DRIVER = "7f1a2e000000-7f1a2f000000 r-xp 00000000 08:01 4444 /usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15\n"


@pytest.mark.parametrize("line, found", [
    ("", None),  # torch's runtime and NVML loaded: CUDA not started
    (DRIVER, "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15"),
    (DRIVER.replace("libcuda.so.570.86.15", "libcuda.so.1"), "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    (DRIVER.replace("/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15", "/usr/lib/wsl/lib/libcuda.so"),
     "/usr/lib/wsl/lib/libcuda.so"),
    (DRIVER.replace("libcuda.so", "libcudadebugger.so"), None),
])
def test_the_driver_library_in_a_memory_map(line, found):
    assert _zygote.cuda_driver_mapped(MAPS + line) == found


def test_this_cpu_process_has_no_driver_loaded():
    assert _zygote._cuda_initialised() == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory map is Linux's /proc/self/maps")
def test_the_zygote_refuses_a_preload_that_loaded_the_cuda_driver(tmp_path, monkeypatch):
    """A module that loads a library named like the driver (a copy of libm, so a CPU machine can load it)
    while torch.cuda.is_initialized() stays False: refused by name, and the zygote serves no rank after it
    (a fresh one starts without it). About 3 s: one more zygote."""
    import ctypes.util

    libm = ctypes.util.find_library("m")
    source = next((p for p in (f"/lib/x86_64-linux-gnu/{libm}", f"/usr/lib/x86_64-linux-gnu/{libm}",
                               f"/lib64/{libm}", f"/usr/lib64/{libm}", f"/lib/aarch64-linux-gnu/{libm}")
                   if libm and os.path.exists(p)), None)
    if source is None:
        pytest.skip("no libm to copy")
    shutil.copy(source, tmp_path / "libcuda.so.1")
    (tmp_path / "parlab_cuinit_mod.py").write_text(
        f"import ctypes\n_driver = ctypes.CDLL({str(tmp_path / 'libcuda.so.1')!r})\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    _zygote.shutdown()  # the next zygote starts with tmp_path on its path
    try:
        with pytest.raises(LaunchError, match=r"importing parlab_cuinit_mod initialised CUDA in the rank server "
                                              r"\(the CUDA driver .*libcuda\.so\.1 is loaded\)"):
            _zygote.preload("parlab_cuinit_mod")
    finally:
        _zygote.shutdown()
