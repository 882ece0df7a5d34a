"""``parlab.parallel``: each parallelism strategy from scratch, one short file per strategy.

Every strategy wraps (or transforms) a model written as ordinary single-device code and takes the process
*group* it works on as an argument; ``topology.py`` says which group that is for each axis (``dp``, ``tp``,
``pp``) and ``comm.py`` is the one door every strategy's collectives go through, so that one
``parlab.measure.CommLog`` can count them all. Chapter 03 teaches ``ddp`` (and ``dp``, DataParallel's data
flow); chapter 07 composes them on a mesh.
"""

from parlab.parallel.comm import communicate
from parlab.parallel.ddp import DDPBuckets, DDPNaive, DDPOverlap
from parlab.parallel.topology import AXES, Topology
from parlab.parallel.zero import ZeroStage1, ZeroStage2, ZeroStage3

__all__ = ["AXES", "Topology", "communicate", "DDPNaive", "DDPBuckets", "DDPOverlap", "ZeroStage1", "ZeroStage2",
           "ZeroStage3"]
