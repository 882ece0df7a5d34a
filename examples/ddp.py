"""Data-parallel training with DistributedDataParallel, with `parlab.lab.builtin.train_ddp` (chapter 03).

Started with plain Python, it launches the ranks itself; started by torchrun or SLURM, each process is
one rank of that job and runs the same function.

    python examples/ddp.py --world-size 4                       # one machine, ranks started by parlab
    torchrun --nproc-per-node 4 examples/ddp.py                 # one node, 4 processes
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint HEAD_NODE:29400 --rdzv-id ddp-run examples/ddp.py   # on each of 2 nodes
    sbatch --nodes 2 examples/slurm.sbatch examples/ddp.py      # SLURM: one torchrun agent per node

"""

from parlab.lab.builtin import train_ddp
from parlab.lab.training import script_main

if __name__ == "__main__":
    script_main(train_ddp)
