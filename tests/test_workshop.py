"""A workshop, simulated: 30 kernels share a faked 8-GPU pool, launching back to back (benchmarks/workshop.py).

The issue this answers (#44): leases were polled with no queue, so a kernel that released its GPUs took
them back for its next launch within milliseconds while others' first launches waited tens of seconds.
Now launches are served first come, first served; nothing may fail, collide or be left behind.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import workshop  # noqa: E402


def test_thirty_kernels_share_eight_gpus_in_order():
    result = workshop.simulate(kernels=30, launches=3, world_size=4, gpus=8, duration=0.1, stagger=0.01,
                               timeout=120)
    problems = workshop.check(result, slack=2.0)  # asked 2 s earlier: must not be served later (the old
    # polling, without a queue, gave 209 such overtakings in this run; the slack absorbs a loaded machine)
    assert problems == {k: [] for k in problems}, {k: v[:5] for k, v in problems.items() if v}
    records = result["records"]
    assert len(records) == 90 and all(r.get("ticket") is not None for r in records)
    assert any("in the queue" in line for line in result["lines"])  # each waiter was told its place
    # "overtaken" above: no relaunch by a kernel that had just released went before those already waiting.


def test_the_checks_can_fail():
    """The checks find a collision, an overtaking and an orphan when they are there."""
    a = {"kernel": 0, "launch": 0, "asked": 0.0, "granted": 3.0, "released": 4.0, "gpus": ["0"], "clashes": 0,
         "ticket": 0}
    b = dict(a, kernel=1, asked=2.0, granted=2.5, released=3.5, ticket=1)  # asked later, served first
    result = {"records": [a, b], "kernels": 2, "launches": 1, "alive": [123], "exitcodes": [0, None],
              "tickets_left": [], "held_after": {}, "marks_left": []}
    problems = workshop.check(result, slack=1.0)
    assert problems["collisions"] == [("0", 1, 0)] and problems["overtaken"] == [(0, 1, 2.0)]
    assert problems["out_of_ticket_order"] == [(0, 1)] and problems["orphans"] == [123, None]
    assert workshop.check(result, slack=2.0)["overtaken"] == []
