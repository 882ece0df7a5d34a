"""benchmarks/launch.py's non-timing logic: the verdicts it prints against the issue's targets."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import launch  # noqa: E402


def _result(median, maximum, first, spawn):
    row = {"world_size": 4, "parlab_kernel": {"median_s": median, "max_s": maximum, "times_s": []},
           "parlab_kernel_first_s": first, "mp_spawn": {"median_s": spawn}}
    return {"rows": [{"world_size": 2}, row]}


def test_verdicts_name_each_target_met_or_missed():
    assert launch.verdicts(_result(0.09, 0.2, 1.8, 10.0)) == [
        "met: warm median 0.090 s <= 0.15 s", "met: warm maximum 0.200 s <= 0.5 s",
        "met: first launch 1.80 s <= mp.spawn 10.00 s"]
    missed = launch.verdicts(_result(0.16, 5.1, 11.0, 10.0))
    assert [v.split(":")[0] for v in missed] == ["MISSED", "MISSED", "MISSED"]
    assert launch.verdicts({"rows": [{"world_size": 2}]}) == []  # no 4-rank row: nothing to judge
