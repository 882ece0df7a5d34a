"""ZeRO-3 (fully sharded data parallel, FSDP2) training, with `parlab.lab.builtin.train_zero` (chapter 04).

Started with plain Python, it launches the ranks itself; started by torchrun or SLURM, each process is
one rank of that job and runs the same function.

    python examples/zero.py --world-size 4                       # one machine, ranks started by parlab
    torchrun --nproc-per-node 4 examples/zero.py                 # one node, 4 processes
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint HEAD_NODE:29400 --rdzv-id zero-run examples/zero.py   # on each of 2 nodes
    sbatch --nodes 2 examples/slurm.sbatch examples/zero.py      # SLURM: one torchrun agent per node

"""

from parlab.lab.builtin import train_zero
from parlab.lab.training import script_main

if __name__ == "__main__":
    script_main(train_zero)
