"""Tensor-parallel training: every layer split across the ranks, with `parlab.lab.builtin.train_tp` (chapter 05).

Started with plain Python, it launches the ranks itself; started by torchrun or SLURM, each process is
one rank of that job and runs the same function.

    python examples/tp.py --world-size 4                       # one machine, ranks started by parlab
    torchrun --nproc-per-node 4 examples/tp.py                 # one node, 4 processes
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint HEAD_NODE:29400 --rdzv-id tp-run examples/tp.py   # on each of 2 nodes
    sbatch --nodes 2 examples/slurm.sbatch examples/tp.py      # SLURM: one torchrun agent per node

Keep tensor parallelism inside a node (--nproc-per-node), where the links are fast: it communicates in
every layer, forward and backward.
"""

from parlab.lab.builtin import train_tp
from parlab.lab.training import script_main

if __name__ == "__main__":
    script_main(train_tp)
