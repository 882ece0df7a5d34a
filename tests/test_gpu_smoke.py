"""The GPU smoke check (benchmarks/gpu_smoke.py) in its dry mode: every check runs on CPU expecting CPU
mode, so the script itself is known to work before the first GPU run, which only it can make."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_smoke.py"
CI_DOC = Path(__file__).resolve().parent.parent / "docs" / "ci.md"
pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="on GPUs the workflow runs it for real"),
              pytest.mark.usefixtures("no_leftover_ranks")]


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_passes_every_check_in_order(tmp_path, capsys):
    """In this process (``--in-process``), so that one zygote serves every check: their own processes and
    limits are tested below, with a real check and with stand-ins that fail and hang."""
    smoke = _smoke()
    assert smoke.main(["--dry-run", "--in-process", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert [c["check"] for c in report["checks"]] == list(smoke.CHECKS)
    assert all(c["ok"] for c in report["checks"]) and report["dry_run"] is True
    saw = {c["check"]: c["saw"] for c in report["checks"]}
    assert saw["nccl"] == "gloo on cpu, mesh cpu" and saw["require_gpu"] == "refused without a GPU, as it must be"
    assert "the losses use" in saw["job"] and "the weights" in saw["job"]  # both shares of TOLERANCE["cuda"]
    assert all(c["decides"] == smoke.DECIDES[c["check"]] for c in report["checks"])


def test_the_checks_come_in_the_order_of_what_only_a_gpu_can_settle():
    """Each check names the item of docs/ci.md it decides, and docs/ci.md names the check beside that item;
    the workflow's own plumbing (require_gpu) runs last."""
    smoke = _smoke()
    assert list(smoke.CHECKS) == list(smoke.DECIDES) == list(smoke.LIMITS)
    assert list(smoke.CHECKS)[-1] == "require_gpu"
    settle = CI_DOC.read_text().split("### What only a GPU run can settle", 1)[1]
    listed = [name for name in smoke.CHECKS if name != "require_gpu"]
    assert all(f"gpu_smoke `{name}`" in settle for name in listed), settle
    at = [settle.index(f"gpu_smoke `{name}`") for name in listed]
    assert at == sorted(at), dict(zip(listed, at))  # in the script's order


def test_a_check_runs_in_a_process_of_its_own(capsys):
    (result,) = _smoke().run(["driver"], gpu=False)  # the cheapest real check: no launch
    assert (result["ok"], result["saw"]) == (True, "CPU build of torch: no CUDA driver to decide here"), result


def _passes(result):  # a check's process that passes: writes its verdict where the runner reads it
    return [sys.executable, "-c", f"import json; json.dump({{'ok': True, 'saw': 'fine'}}, open({result!r}, 'w'))"]


def test_a_failing_check_is_reported_and_the_rest_still_run(monkeypatch, capsys):
    smoke = _smoke()
    fail = [sys.executable, "-c", "1 / 0"]
    monkeypatch.setattr(smoke, "_command", lambda name, gpu, result: fail if name == "nccl" else _passes(result))
    results = smoke.run(["nccl", "memory"], gpu=False)
    assert [(r["check"], r["ok"]) for r in results] == [("nccl", False), ("memory", True)]
    assert results[0]["saw"].startswith("the check's process ended with status 1")
    assert "ZeroDivisionError" in results[0]["saw"] and "FAIL nccl" in capsys.readouterr().out


def test_a_hung_check_is_killed_at_its_limit_and_the_next_runs(monkeypatch, tmp_path):
    """A check that never returns (an NCCL call nobody answers) is stopped at its own limit, with what it
    started, and reported; the next check still runs."""
    smoke = _smoke()
    pid_file = tmp_path / "child.pid"
    hang = [sys.executable, "-c", "import subprocess, sys, time; "  # it starts a rank of its own, then hangs
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"]
    monkeypatch.setattr(smoke, "_command", lambda name, gpu, result: hang if name == "nccl" else _passes(result))
    monkeypatch.setitem(smoke.LIMITS, "nccl", 1)
    monkeypatch.setattr(smoke, "TERM_GRACE", 1)
    results = smoke.run(["nccl", "memory"], gpu=False)
    assert [(r["check"], r["ok"], r["saw"]) for r in results] == [("nccl", False, "timed out after 1 s"),
                                                                  ("memory", True, "fine")]
    assert results[0]["seconds"] < 10
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")  # what the hung check started is gone too
    assert not stat.exists() or stat.read_text().split()[2] == "Z"


def test_without_a_gpu_it_asks_for_the_dry_run(capsys):
    assert _smoke().main([]) == 2
    assert "no GPU visible" in capsys.readouterr().err
