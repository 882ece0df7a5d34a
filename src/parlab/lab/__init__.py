"""The lab: what runs on the ranks and what measures it — the launcher (``launch``), the GPU-mode
decision (``runtime``), the models (``models``, ``compose_models``, ``training``), the strategies
built from scratch and PyTorch's own (``parallel``, ``compose``, ``builtin``), the instruments
(``measure``), the drawings of what they measured (``plots``) and chapter 08's own job (``job``).

The bottom floor: nothing here imports ``parlab.decide`` or ``parlab.course``.
"""
