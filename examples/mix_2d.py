"""2-D parallel training: FSDP2 across nodes (dp axis), tensor parallelism within (tp axis), with `parlab.lab.builtin.train_2d` (chapter 07).

Started with plain Python, it launches the ranks itself; started by torchrun or SLURM, each process is
one rank of that job and runs the same function.

    python examples/mix_2d.py --world-size 4                       # one machine, ranks started by parlab
    torchrun --nproc-per-node 4 examples/mix_2d.py                 # one node, 4 processes
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint HEAD_NODE:29400 --rdzv-id mix_2d-run examples/mix_2d.py   # on each of 2 nodes
    sbatch --nodes 2 examples/slurm.sbatch examples/mix_2d.py      # SLURM: one torchrun agent per node

With 2 processes per node and --nnodes 2 the mesh is dp=2 × tp=2: TP pairs stay inside a node.
"""

from parlab.lab.builtin import train_2d
from parlab.lab.training import script_main

if __name__ == "__main__":
    script_main(train_2d)
