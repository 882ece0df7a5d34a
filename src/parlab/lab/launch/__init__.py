"""The launcher: run a notebook cell's code on N ranks (chapter 00). Nothing else reaches inside."""

import os

if os.environ.get("PARLAB_SIMULATE_GPUS"):  # GPUs simulated on the CPU, NCCL's ways included (docs/ci.md)
    from parlab.lab.launch import simgpu

    simgpu.install()

from parlab.lab.launch._zygote import preload, shutdown  # noqa: E402 - after the simulation, if any
from parlab.lab.launch.errors import LaunchError, RankCrashedError, RankError, RankTimeoutError
from parlab.lab.launch.kernel_gpus import leased_gpus
from parlab.lab.launch.launcher import launch
from parlab.lab.launch.plan import Plan, make_plan

__all__ = ["launch", "leased_gpus", "make_plan", "Plan", "preload", "shutdown", "LaunchError", "RankError",
           "RankCrashedError", "RankTimeoutError"]
