"""``parlab.parallel``: each parallelism strategy from scratch, one short file per strategy.

Every strategy wraps (or transforms) a model written as ordinary single-device code, and takes its
topology (a process group) as an argument. Chapter 03 teaches ``ddp``.
"""

from parlab.parallel.ddp import CommEvent, DDPBuckets, DDPNaive, DDPOverlap

__all__ = ["CommEvent", "DDPNaive", "DDPBuckets", "DDPOverlap"]
