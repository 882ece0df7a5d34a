"""Measuring instruments: memory (estimate and measure), communication (record collectives), timelines.

Every later chapter measures with these; chapter 01 introduces memory, chapter 02 communication, and
chapter 03 (DDP) uses all three. Each module's docstring documents its API; in short:

- memory.py     ``estimate_memory(model | num_params=, precision=, optimizer=, world_size=, zero_stage=,
                tp_size=, pp_size=, micro_batch=, seq_len=, checkpointing=)`` → ``MemoryEstimate`` (bytes:
                ``params``, ``grads``, ``optimizer``, ``activations``, ``total``); ``measure_memory(model,
                optimizer)`` and ``measure_activations(model, *inputs)`` measure the same parts on a rank.
- comm.py       ``with record_comm(timeline=None) as log:`` records every collective on this thread
                (op, bytes, group_size, seconds); ``ddp_model.register_comm_hook(log, ddp_recorder)`` for
                DDP; ``totals(records)``, ``comm_table(records_by_rank)``, ``bus_factor``, ``busbw``.
- bandwidth.py  ``sweep(op, sizes)`` on every rank → ``BandwidthPoint``s; ``fit_alpha_beta(sizes, seconds)``.
- timeline.py   ``tl = Timeline()``; ``with tl.span("backward"):``; return ``tl.events``; in the notebook
                ``merge(results)``, ``idle_gaps(events)``, then ``parlab.plots.gantt(events)``.

A DDP step, recorded for chapter 03 (runs on each rank inside ``parlab.launch``)::

    tl, log = Timeline(), CommLog()
    log.timeline = tl                               # bucket all-reduces become "comm" spans
    ddp.register_comm_hook(log, ddp_recorder)
    with tl.span("forward"):
        loss = ddp(x).sum()
    with tl.span("backward"):
        loss.backward()                             # buckets all-reduce while backward still runs
    return {"events": tl.events, "records": log.records}
"""

from parlab.measure.bandwidth import BandwidthPoint, fit_alpha_beta, sweep
from parlab.measure.comm import (
    CommLog,
    CommRecord,
    algbw,
    bus_factor,
    busbw,
    comm_table,
    ddp_recorder,
    record_comm,
    totals,
)
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
from parlab.measure.timeline import Event, Timeline, idle_gaps, merge

__all__ = [
    "ZERO_PAPER_TABLE1",
    "BandwidthPoint",
    "CommLog",
    "CommRecord",
    "Event",
    "MemoryEstimate",
    "MemoryMeasurement",
    "Timeline",
    "activation_bytes_per_layer",
    "algbw",
    "bus_factor",
    "busbw",
    "comm_table",
    "count_params",
    "ddp_recorder",
    "estimate_memory",
    "fit_alpha_beta",
    "idle_gaps",
    "measure_activations",
    "measure_memory",
    "merge",
    "record_comm",
    "sweep",
    "totals",
]
