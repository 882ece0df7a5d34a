"""The launcher: run a notebook cell's code on N ranks (chapter 00). Nothing else reaches inside."""

from parlab.launch._zygote import preload, shutdown
from parlab.launch.errors import LaunchError, RankCrashedError, RankError, RankTimeoutError
from parlab.launch.launcher import launch
from parlab.launch.plan import Plan, make_plan

__all__ = ["launch", "make_plan", "Plan", "preload", "shutdown", "LaunchError", "RankError", "RankCrashedError",
           "RankTimeoutError"]
