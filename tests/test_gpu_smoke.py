"""The GPU smoke check (benchmarks/gpu_smoke.py) in its dry mode: every check runs on CPU expecting CPU
mode, so the script itself is known to work before the first GPU run, which only it can make."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_smoke.py"
pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="on GPUs the workflow runs it for real"),
              pytest.mark.usefixtures("no_leftover_ranks")]


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_passes_every_check_in_order(tmp_path, capsys):
    smoke = _smoke()
    assert smoke.main(["--dry-run", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert [c["check"] for c in report["checks"]] == ["zygote", "nccl", "memory", "cpu_mode", "job", "require_gpu"]
    assert all(c["ok"] for c in report["checks"]) and report["dry_run"] is True
    saw = {c["check"]: c["saw"] for c in report["checks"]}
    assert saw["nccl"] == "gloo on cpu, mesh cpu" and saw["require_gpu"] == "refused without a GPU, as it must be"


def test_a_failing_check_is_reported_and_the_rest_still_run(monkeypatch, capsys):
    smoke = _smoke()
    monkeypatch.setitem(smoke.CHECKS, "nccl", lambda gpu: 1 / 0)
    results = smoke.run(["nccl", "memory"], gpu=False)
    assert [(r["check"], r["ok"]) for r in results] == [("nccl", False), ("memory", True)]
    assert results[0]["saw"] == "ZeroDivisionError: division by zero"
    assert "FAIL nccl" in capsys.readouterr().out


def test_without_a_gpu_it_asks_for_the_dry_run(capsys):
    assert _smoke().main([]) == 2
    assert "no GPU visible" in capsys.readouterr().err
