"""From the course to your own training job (chapter 08). One file per idea:

- ``train_fsdp.py``  the plain FSDP2 script (torch and transformers only): ``main`` for torchrun, ``train``
                     for any initialised group, ``save``/``load`` with ``torch.distributed.checkpoint``;
- ``reference.py``   the same job in one process, what every run must reproduce;
- ``torchrun.py``    run a script or module under ``torchrun --standalone`` from a cell;
- ``hf.py``          the job through the Hugging Face Trainer and accelerate, their FSDP and DeepSpeed configs;
- ``checkpoint.py``  what a sharded checkpoint holds on disk, per rank;
- ``debug.py``       a straggler's timeline and traces, memory per layout (and a CUDA memory snapshot);
- ``mfu.py``         FLOPs counted and by formula (Narayanan et al. 2021), MFU and HFU.
"""
