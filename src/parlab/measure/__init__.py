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
from parlab.measure.comm import CommLog, CommRecord, algbw, bus_factor, busbw, comm_table, ddp_recorder, \
    record_comm, totals
from parlab.measure.bandwidth import BandwidthPoint, fit_alpha_beta, sweep
from parlab.measure.timeline import Event, Timeline, idle_gaps, merge

__all__ = ["CommLog", "CommRecord", "algbw", "bus_factor", "busbw", "comm_table", "ddp_recorder",
           "record_comm", "totals", "BandwidthPoint", "fit_alpha_beta", "sweep", "Event", "Timeline",
           "idle_gaps", "merge", "ZERO_PAPER_TABLE1", "MemoryEstimate", "MemoryMeasurement", "activation_bytes_per_layer", "count_params",
           "estimate_memory", "measure_activations", "measure_memory"]
