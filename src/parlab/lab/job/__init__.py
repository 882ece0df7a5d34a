"""From the course to your own training job (chapter 08). One file per idea:

- ``train_fsdp.py``  the plain FSDP2 script (torch and transformers only): ``main`` for torchrun, ``train``
                     for any initialised group, ``save``/``load`` with ``torch.distributed.checkpoint``;
- ``make_data.py``   the standalone data script (``python make_data.py data.json``): a byte-level BPE tokenizer
                     trained offline on a text file, and padded rows of its paragraphs, the jobs' data format;
- ``data.py``        the course's notebooks as that text (``make_data``'s functions, re-exported);
- ``reference.py``   the same jobs in one process (``one_process``; ``script_job`` for the chapter's
                     ``train.py``), what every run must reproduce;
- ``torchrun.py``    run a script or module under ``torchrun --standalone`` from a cell;
- ``hf.py``          the job through the Hugging Face Trainer and accelerate, their FSDP and DeepSpeed configs;
- ``checkpoint.py``  what a sharded checkpoint holds on disk, per rank;
- ``debug.py``       a straggler's timeline and traces, memory per layout (and a CUDA memory snapshot), a
                     group timeout and ``py-spy dump`` on a rank stuck in a collective;
- ``mfu.py``         FLOPs counted and by formula (Narayanan et al. 2021), MFU and HFU.
"""
