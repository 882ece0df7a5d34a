"""PyTorch's own strategies, one function per strategy: the reference the course's from-scratch code is
checked against (chapters 03–07), shared by the notebooks and the scripts in ``examples/``.

Each ``train_*`` is what every rank runs: in a notebook through ``parlab.launch(train_ddp, 4)``, on a
cluster through ``torchrun ... examples/ddp.py``, which calls the very same function. Each is
``parallelize`` (``parlab.lab.compose``) with one choice of axes, then the shared loop (``parlab.lab.training.train``),
and returns the loss of each step over the global batch — equal to ``parlab.lab.training.train_single``'s.
``topology`` (a ``parlab.lab.parallel.Topology``, built on the ranks if it is not yet) defaults to the
strategy's own axis over all ranks. Chapter 00 ("From notebook to cluster") runs them on several nodes.
"""

from __future__ import annotations

from parlab.lab import runtime
from parlab.lab.compose import parallelize
from parlab.lab.topology import Topology
from parlab.lab.training import LR, make_model, train


def _run(topology: Topology, steps: int, global_batch: int, seed: int, **how) -> list[float]:
    parts = parallelize(make_model(seed), topology.built(), optimizer_kwargs={"lr": LR}, **how)
    return train(parts, steps, global_batch, seed)


def train_ddp(steps: int = 5, global_batch: int = 16, seed: int = 0, topology: Topology | None = None) -> list[float]:
    """Data parallel (DistributedDataParallel): every rank holds the whole model and a slice of the
    batch (chapter 03)."""
    topology = topology or Topology(dp=runtime.world_size())
    return _run(topology, steps, global_batch, seed, data_parallel="ddp")


def train_zero(steps: int = 5, global_batch: int = 16, seed: int = 0, topology: Topology | None = None) -> list[float]:
    """ZeRO-3 / FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded across ranks
    (chapter 04)."""
    topology = topology or Topology(dp=runtime.world_size())
    return _run(topology, steps, global_batch, seed, data_parallel="fsdp")


def train_tp(steps: int = 5, global_batch: int = 16, seed: int = 0, topology: Topology | None = None) -> list[float]:
    """Tensor parallel (DTensor ``parallelize_module``): every layer split across ranks, the whole batch
    on every rank (chapter 05)."""
    topology = topology or Topology(tp=runtime.world_size())
    return _run(topology, steps, global_batch, seed)


def train_pp(steps: int = 5, global_batch: int = 16, seed: int = 0, topology: Topology | None = None,
             num_micro_batches: int = 4) -> list[float]:
    """Pipeline parallel (``torch.distributed.pipelining``, GPipe): stage s holds the s-th run of blocks;
    micro-batches flow through (chapter 06)."""
    topology = topology or Topology(pp=runtime.world_size())
    return _run(topology, steps, global_batch, seed, num_micro_batches=num_micro_batches)


def train_2d(steps: int = 5, global_batch: int = 16, seed: int = 0, topology: Topology | None = None) -> list[float]:
    """FSDP2 across the ``dp`` axis and tensor parallelism within the ``tp`` axis of a 2-D mesh
    (chapter 07); by default ``tp = 2``."""
    topology = topology or Topology.infer(runtime.world_size(), tp=2)
    return _run(topology, steps, global_batch, seed, data_parallel="fsdp")


#: The strategies, by the name of their script in ``examples/``.
STRATEGIES = {"ddp": train_ddp, "zero": train_zero, "tp": train_tp, "pp": train_pp, "mix_2d": train_2d}
