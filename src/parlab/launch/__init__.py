"""The launcher: run a notebook cell's code on N ranks (chapter 00). Nothing else reaches inside."""

from parlab.launch.errors import LaunchError, RankCrashedError, RankError, RankTimeoutError
from parlab.launch.launcher import Plan, launch, make_plan, shutdown

__all__ = ["launch", "make_plan", "Plan", "shutdown", "LaunchError", "RankError", "RankCrashedError",
           "RankTimeoutError"]
