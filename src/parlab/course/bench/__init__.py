"""Benchmark bodies that the chapters run too (chapter 03 on). The command-line scripts, and the results
they write as JSON + PNG, live in ``benchmarks/`` at the top of the repository; what a chapter also needs
lives here, so that it works from an installed package as well as from a clone.

- ``ddp``: the course's DDP v1/v2/v3 against ``DistributedDataParallel``, step times in alternating rounds.
- ``dp_vs_ddp``: the guide's DataParallel vs DistributedDataParallel benchmark, on GPUs or as a CPU analogue.
"""
