"""A workshop, simulated: kernels share a faked 8-GPU pool, launching back to back (benchmarks/workshop.py).

Issue 44: leases were polled with no queue, so a kernel that released its GPUs took them back for its next
launch within milliseconds while others' first launches waited tens of seconds. Now launches are served
first come, first served; nothing may fail, collide or be left behind. Issue 51: a launch leased its GPUs
before its zygote started, so every kernel's first launch held them idle while torch imported. The
simulation starts each launch through the launcher's own ``ranks_then_lease``, and a kernel's first launch
pays the zygote's start.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import workshop  # noqa: E402

from parlab.lab.launch import _loop  # noqa: E402

# Workshop seconds, run 10 times faster: a launch holds its GPUs 1 s; a kernel's zygote starts in 3 s.
SMALL = dict(kernels=16, launches=2, world_size=4, gpus=8, duration=1.0, zygote=3.0, stagger=0.1, scale=10.0,
             timeout=120)


def test_sixteen_kernels_share_eight_gpus_in_order_and_never_hold_one_idle():
    result = workshop.simulate(**SMALL)
    problems = workshop.check(result, slack=20.0)  # 2 s of real time: a loaded machine delays a poll
    assert problems == {k: [] for k in problems}, {k: v[:5] for k, v in problems.items() if v}
    records = result["records"]
    assert len(records) == 32 and all(r.get("ticket") is not None for r in records)
    assert any("in the queue" in line for line in result["lines"])  # each waiter was told its place
    row = workshop.summary(result, slack=20.0)
    assert row["gpu_seconds_idle"] == 0 and row["overtaken"] <= row["served"] / 20
    # every first launch paid the zygote's start before it asked for GPUs, none while holding them
    assert all(r["asked"] - r["pressed"] >= 3.0 for r in records if r["launch"] == 0)


def test_the_simulation_starts_a_launch_as_the_launcher_does():
    assert workshop.ORDERS["launcher"] is _loop.ranks_then_lease


def test_the_launchers_old_order_held_gpus_idle():
    """Leasing before the zygote starts (the order before issue 51) is caught: each first launch held idle."""
    result = workshop.simulate(**dict(SMALL, kernels=2, launches=1, order="lease first"))
    idle = workshop.check(result, slack=20.0)["held_idle"]
    assert sorted(k for k, _, _ in idle) == [0, 1] and all(seconds >= 3.0 for _, _, seconds in idle)
    assert workshop.summary(result)["idle_share"] > 0.7  # 3 s of every 4 s held


def test_the_checks_can_fail():
    """The checks find a collision, an overtaking and an orphan when they are there."""
    a = {"kernel": 0, "launch": 0, "pressed": 0.0, "asked": 0.0, "ranks_up": 0.0, "granted": 3.0, "released": 4.0,
         "gpus": ["0"], "clashes": 0, "ticket": 0}
    b = dict(a, kernel=1, asked=2.0, granted=2.5, released=3.5, ticket=1)  # asked later, served first
    result = {"records": [a, b], "kernels": 2, "launches": 1, "alive": [123], "exitcodes": [0, None],
              "tickets_left": [], "held_after": {}, "marks_left": []}
    problems = workshop.check(result, slack=1.0)
    assert problems["collisions"] == [("0", 1, 0)] and problems["overtaken"] == [(0, 1, 2.0)]
    assert problems["out_of_ticket_order"] == [(0, 1)] and problems["orphans"] == [123, None]
    assert workshop.check(result, slack=2.0)["overtaken"] == [] and problems["held_idle"] == []
    many = [dict(a, kernel=k, asked=float(k), granted=10.0 + k, released=10.5 + k) for k in range(40)]
    many[0]["granted"], many[1]["granted"] = 60.0, 61.0  # 2 launches of 40 overtaken: 1 in 20, allowed
    assert workshop.check(dict(result, records=many, kernels=40), slack=0.5)["overtaken"] == []
    many[2]["granted"] = 62.0  # 3 of 40: not
    assert len(workshop.check(dict(result, records=many, kernels=40), slack=0.5)["overtaken"]) > 2
    late = dict(a, ranks_up=3.5)  # its ranks came up half a second after it got its GPUs
    assert workshop.check(dict(result, records=[late]), slack=1.0)["held_idle"] == [(0, 0, 0.5)]
