"""Pipeline-parallel training (GPipe schedule, 4 micro-batches), with `parlab.lab.builtin.train_pp` (chapter 06).

Started with plain Python, it launches the ranks itself; started by torchrun or SLURM, each process is
one rank of that job and runs the same function.

    python examples/pp.py --world-size 4                       # one machine, ranks started by parlab
    torchrun --nproc-per-node 4 examples/pp.py                 # one node, 4 processes
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint HEAD_NODE:29400 --rdzv-id pp-run examples/pp.py   # on each of 2 nodes
    sbatch --nodes 2 examples/slurm.sbatch examples/pp.py      # SLURM: one torchrun agent per node

The world size must divide the model's 4 blocks: 1, 2 or 4 ranks.
"""

from parlab.lab.builtin import train_pp
from parlab.lab.training import script_main

if __name__ == "__main__":
    script_main(train_pp)
