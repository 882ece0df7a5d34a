"""Measuring instruments: memory (estimate and measure), communication (record collectives), timelines.

Every later chapter measures with these; chapter 01 introduces memory, chapter 02 communication, and
chapter 03 (DDP) uses all three. Each module's docstring documents its API; in short:

- memory.py     ``estimate_memory(model | num_params=, precision=, optimizer=, world_size=, zero_stage=,
                tp_size=, pp_size=, micro_batch=, seq_len=, checkpointing=)`` → ``MemoryEstimate`` (bytes:
                ``params``, ``grads``, ``optimizer``, ``buckets``, ``activations``, ``total``);
                ``measure_memory(model, optimizer)`` and ``measure_activations(model, *inputs)`` measure
                the same parts on a rank; ``with ActivationTracker(model) as t:`` follows the activations
                kept for backward over time (``t.live``, ``t.peak``, ``t.samples``), as pipelines need (chapter 06).
- activations.py the activations term by term, from a transformers config (``Architecture``,
                ``layer_terms``, ``end_terms``): what each op of GPT-2, Llama or BLOOM keeps.
- comm.py       ``CommRecord``: one op (op, bytes, group_size, start, end, global rank, group_rank, label),
                the one record of communication for every strategy; ``with record_comm(timeline=None) as
                log:`` records every collective on this thread; ``record_ddp(ddp_model, log)`` for
                PyTorch's DDP; ``with CommLog() as log:`` for the course's strategies (``parlab.lab.parallel``:
                whatever runs inside the block); ``totals(records)``, ``comm_table(records_by_rank)``,
                ``bus_factor``, ``busbw``.
- attach.py     how instruments attach from outside: ``with CommLog() as log:``, ``with Timeline() as tl:``
                (strategies name their steps with ``attach.span``), and ``not_activations()``.
- bandwidth.py  ``sweep(op, sizes)`` on every rank → ``BandwidthPoint``s; ``fit_alpha_beta(sizes, seconds)``;
                ``nccl_transports(log)``: which transports NCCL chose (P2P, SHM, NET).
- timeline.py   ``with Timeline() as tl:`` (or ``tl.span("backward")`` by hand); return ``tl.events``; in the notebook
                ``merge(results)``, ``idle_gaps(events)``, then ``parlab.lab.plots.gantt(events)``.
- gpu_clock.py  ``GpuClock``: in GPU mode a timeline's (or a log's) spans and records are CUDA events read
                against one reference event, so they sit where the GPU ran them, on one axis.
- peak.py       ``peak_memory(fn, device=)`` → (fn's result, the most bytes it had allocated at once): CUDA's
                statistics on a GPU, PyTorch's memory profiler on a CPU (ZeRO's steps in chapter 04).
- steptime.py   ``time_alternating({name: step_fn}, rounds, steps)`` on every rank: step times of several
                implementations timed in alternating rounds; ``summarize(times, reference)`` → medians and
                paired throughput ratios (chapter 03's DDP comparison, and every benchmark).

A DDP step, recorded for chapter 03 (runs on each rank inside ``parlab.launch``)::

    tl = Timeline()
    log = CommLog(timeline=tl)                      # bucket all-reduces become "comm" spans
    record_ddp(ddp, log)
    with tl.span("forward"):
        loss = ddp(x).sum()
    with tl.span("backward"):
        loss.backward()                             # buckets all-reduce while backward still runs
    return {"events": tl.events, "records": log.records}
"""

from parlab.lab.measure.bandwidth import BandwidthPoint, fit_alpha_beta, nccl_lines, nccl_transports, sweep
from parlab.lab.measure.comm import (
    CommLog,
    CommRecord,
    algbw,
    bus_factor,
    busbw,
    bytes_written,
    comm_table,
    describe_group,
    record_comm,
    record_ddp,
    totals,
)
from parlab.lab.measure.memory import (
    ZERO_PAPER_TABLE1,
    ActivationTracker,
    MemoryEstimate,
    MemoryMeasurement,
    activation_bytes_per_layer,
    count_params,
    ddp_buckets,
    estimate_memory,
    measure_activations,
    measure_memory,
)
from parlab.lab.measure.peak import peak_memory
from parlab.lab.measure.steptime import summarize, time_alternating
from parlab.lab.measure.timeline import Event, Timeline, idle_gaps, merge

__all__ = [
    "bytes_written",
    "ZERO_PAPER_TABLE1",
    "ActivationTracker",
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
    "ddp_buckets",
    "describe_group",
    "estimate_memory",
    "fit_alpha_beta",
    "idle_gaps",
    "measure_activations",
    "measure_memory",
    "merge",
    "nccl_lines",
    "nccl_transports",
    "peak_memory",
    "record_comm",
    "record_ddp",
    "summarize",
    "sweep",
    "time_alternating",
    "totals",
]
