"""`parlab check`: the readiness report and its smoke test."""

from __future__ import annotations

import re
import subprocess
import sys

import parlab
from parlab.course import cli
def test_check_reports_and_passes():
    out = subprocess.run([sys.executable, "-m", "parlab", "check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for heading in ("Versions", "Backends", "Hardware", "Smoke test: all_reduce"):
        assert heading in out.stdout
    assert "gloo · CPU  ok (2 ranks" in out.stdout
    hold = re.search(r"^hold\s+(\d+\.\d\d) s from lease to release, median of 3 small launches \(2 ranks, gloo on "
                     r"the CPU", out.stdout, re.M)  # what docs/workshop.md sizes a shared machine from
    assert hold and 0 < float(hold.group(1)) < 30, out.stdout
    assert out.stdout.rstrip().endswith("Ready.")


def test_smoke_test_catches_a_wrong_result(monkeypatch):
    monkeypatch.setattr(parlab, "launch", lambda *a, **k: [6.0, 5.0])
    verdict, ok = cli._smoke("gloo")
    assert not ok and verdict.startswith("WRONG: got [6.0, 5.0], expected 12.0")


def test_smoke_test_reports_a_failure(monkeypatch):
    def broken(*a, **k):
        raise parlab.LaunchError("no ranks today")

    monkeypatch.setattr(parlab, "launch", broken)
    verdict, ok = cli._smoke("gloo")
    assert not ok and verdict == "FAILED: LaunchError: no ranks today"
