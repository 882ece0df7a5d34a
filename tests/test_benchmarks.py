"""The chapter 03 benchmarks' non-timing logic (``parlab.course.bench`` and the scripts in ``benchmarks/``): how they summarise, and what they do without GPUs."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import dp_vs_ddp  # noqa: E402

from parlab.course.bench.dp_vs_ddp import PUBLISHED, table  # noqa: E402
from parlab.lab.measure import summarize  # noqa: E402


def test_throughput_ratio_pairs_rounds():
    # Round 2 ran while the machine was busy: pairing by round keeps it from skewing the ratio.
    times = {"torch": [1.0, 5.0, 1.0], "v3": [1.25, 6.0, 1.25]}
    median, ratio = summarize(times, reference="torch")
    assert median == {"torch": 1.0, "v3": 1.25}
    assert ratio["v3"] == pytest.approx(0.8) and ratio["torch"] == 1.0


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="has the GPUs the benchmark needs")
def test_dp_vs_ddp_says_why_and_exits_0_without_two_gpus(capsys, tmp_path):
    assert dp_vs_ddp.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "needs 2 GPUs" in out and "nothing was run" in out and "110.59" in out
    assert list(tmp_path.iterdir()) == []


def test_published_table_is_the_guides():
    assert PUBLISHED["seconds"] == {"DP": 110.59, "DDP": 101.90, "DDP, NCCL_P2P_DISABLE=1": 131.44}
    text = table({"DDP": {"seconds": 2.0}, "DP": {"seconds": 3.0}}, cpu=True)
    assert "1.50" in text and "n/a" in text
