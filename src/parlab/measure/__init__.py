"""Measuring instruments: memory (estimate and measure), communication (record collectives), timelines.

Every later chapter measures with these; chapter 01 introduces memory, chapter 02 communication, and
chapter 03 (DDP) uses all three. See each module's docstring for its API.
"""

from parlab.measure.memory import (
    ZERO_PAPER_TABLE1,
    MemoryEstimate,
    MemoryMeasurement,
    activation_bytes_per_layer,
    count_params,
    estimate_memory,
    measure_activations,
    measure_memory,
)

__all__ = ["ZERO_PAPER_TABLE1", "MemoryEstimate", "MemoryMeasurement", "activation_bytes_per_layer", "count_params",
           "estimate_memory", "measure_activations", "measure_memory"]
