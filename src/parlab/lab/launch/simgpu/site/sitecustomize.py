"""Put on PYTHONPATH by parlab.lab.launch.simgpu: a Python process started under PARLAB_SIMULATE_GPUS (a
torchrun job's script, which may not import parlab) presents the same simulated GPUs as its parent."""

import os

if os.environ.get("PARLAB_SIMULATE_GPUS"):
    from parlab.lab.launch import simgpu

    simgpu.install()
