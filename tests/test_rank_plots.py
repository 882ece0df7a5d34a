"""parlab.lab.plots.ranks: the world a launch starts (ranks, devices, backend) and who waits in a hang."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch.distributed as dist  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import parlab  # noqa: E402
from parlab.lab.launch.errors import RankTimeoutError  # noqa: E402
from parlab.lab.plots.colors import KIND_COLORS  # noqa: E402
from parlab.lab.plots.ranks import devices, hang, world  # noqa: E402


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def _lines_under(fig, rank: int) -> list[str]:
    """The text lines drawn in rank ``rank``'s box (those at its x, below its heading)."""
    ax = fig.axes[0]
    head = next(t for t in ax.texts if t.get_text() == f"rank {rank}")
    x, y = head.get_position()
    return [t.get_text() for t in ax.texts if abs(t.get_position()[0] - x) < 1e-9 and t.get_position()[1] < y]


def test_world_follows_the_one_device_decision():
    fig = world(4, values=[1.0, 2.0, 3.0, 4.0], gpus=4)
    assert devices(4, gpus=4) == ("nccl", ["cuda:0", "cuda:1", "cuda:2", "cuda:3"], "")
    for r in range(4):
        assert f"device cuda:{r}" in _lines_under(fig, r) and f"value {r + 1}" in _lines_under(fig, r)
    assert any("world_size = 4" in t and "backend nccl" in t for t in _texts(fig))
    plt.close(fig)

    fig = world(4, gpus=1, launcher="torchrun --nproc-per-node 4 plain_total.py", env=True)
    for r in range(4):  # one GPU for four ranks: NCCL refuses, every rank on the CPU, and the picture says why
        assert _lines_under(fig, r)[:4] == ["a process", "device cpu", f"RANK={r}", f"LOCAL_RANK={r}"]
    assert any("backend gloo" in t for t in _texts(fig)) and any("NCCL needs one per rank" in t for t in _texts(fig))
    plt.close(fig)


def _lane_colors(fig) -> dict[int, set[str]]:
    lanes: dict[int, set[str]] = {}
    for p in fig.axes[0].patches:
        if isinstance(p, Rectangle) and p.get_width() > 0 and p.get_height() == pytest.approx(0.6):
            lanes.setdefault(round(p.get_y() + 0.3), set()).add(to_hex(p.get_facecolor()))
    return lanes


def test_hang_draws_who_waited_and_who_returned():
    fig = hang(RankTimeoutError(2.0, 4, {}, waited=[1, 3], returned=[0, 2]))
    comm, idle = to_hex(KIND_COLORS["comm"]), to_hex(KIND_COLORS["idle"])
    lanes = _lane_colors(fig)
    assert [comm in lanes[r] for r in range(4)] == [False, True, False, True]
    assert [idle in lanes[r] for r in range(4)] == [True, False, True, False]
    plt.close(fig)


def _skips_the_barrier():
    if parlab.rank() % 2 == 0:
        dist.barrier()


def test_a_real_hang_report_says_who_waited():
    with pytest.raises(parlab.RankTimeoutError) as info:
        parlab.launch(_skips_the_barrier, 2, timeout=1, announce=False)
    report = info.value
    assert (report.waited, report.returned, report.busy) == ([0], [1], [])
    lanes = _lane_colors(hang(report))
    assert to_hex(KIND_COLORS["comm"]) in lanes[0] and to_hex(KIND_COLORS["comm"]) not in lanes[1]
    plt.close("all")
