"""Communication accounting: every collective recorded with the right op, bytes and group size."""

import contextlib
import time

import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.lab.measure import (
    Event,
    bus_factor,
    busbw,
    comm_table,
    fit_alpha_beta,
    record_comm,
    record_ddp,
    sweep,
    totals,
)


def _every_op():
    n, r = dist.get_world_size(), dist.get_rank()
    x = torch.ones(8)  # 32 bytes
    with record_comm() as log:
        dist.all_reduce(x)
        dist.broadcast(x, 0)
        dist.reduce(x, 0)
        dist.all_gather_into_tensor(torch.empty(8 * n), x)
        dist.all_gather([torch.empty(8) for _ in range(n)], x)
        dist.reduce_scatter_tensor(torch.empty(8 // n), x)
        dist.all_to_all_single(torch.empty(8), x)
        if r == 0:
            dist.send(x, 1)
        elif r == 1:
            dist.recv(x, 0)
    return [(rec.op, rec.bytes, rec.group_size) for rec in log.records]


@pytest.mark.parametrize("world_size", [2, 4])
def test_records_every_op_with_nccl_tests_sizes(world_size):
    results = parlab.launch(_every_op, world_size=world_size, timeout=20, output="none", announce=False)
    n = world_size
    common = [("all_reduce", 32, n), ("broadcast", 32, n), ("reduce", 32, n), ("all_gather", 32 * n, n),
              ("all_gather", 32 * n, n), ("reduce_scatter", 32, n), ("all_to_all", 32, n)]
    assert results[0] == common + [("send", 32, n)]
    assert results[1] == common + [("recv", 32, n)]
    assert all(res == common for res in results[2:])


def _subgroup():
    group = dist.new_group([1, 2])
    with record_comm() as log:
        if dist.get_rank() > 0:
            dist.all_reduce(torch.ones(4), group=group)
    return [(r.op, r.group_size, r.rank, r.group_rank) for r in log.records]


def test_group_size_and_ranks_of_a_subgroup():
    results = parlab.launch(_subgroup, world_size=3, timeout=20, output="none", announce=False)
    # global rank 2 is rank 1 of the group {1, 2}: both are recorded
    assert results == [[], [("all_reduce", 2, 1, 0)], [("all_reduce", 2, 2, 1)]]


def _ddp_on_a_subgroup():
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parlab.lab.measure import CommLog
    group = dist.new_group([1, 2])
    if dist.get_rank() == 0:
        return []
    ddp = DDP(torch.nn.Linear(4, 2), process_group=group)
    log = CommLog()
    record_ddp(ddp, log)
    ddp(torch.randn(3, 4)).sum().backward()
    return [(r.op, r.bytes, r.group_size, r.group_rank) for r in log.records]


def test_ddp_hook_records_the_models_group():
    results = parlab.launch(_ddp_on_a_subgroup, world_size=3, timeout=20, output="none", announce=False)
    assert results == [[], [("all_reduce", 40, 2, 0)], [("all_reduce", 40, 2, 1)]]


def _ddp_step():
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parlab.lab.measure import CommLog
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))  # 676 params
    ddp = DDP(model, bucket_cap_mb=1)
    log = CommLog()
    record_ddp(ddp, log)
    ddp(torch.randn(2, 16)).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return log.records, grads


def test_ddp_hook_records_buckets_and_still_averages():
    results = parlab.launch(_ddp_step, world_size=2, timeout=20, output="none", announce=False)
    (records, g0), (_, g1) = results
    assert sum(r.bytes for r in records) == 676 * 4  # every gradient went through a bucket once
    assert {r.op for r in records} == {"all_reduce"}
    torch.testing.assert_close(g0, g1)  # the hook still all-reduces: both ranks hold the same mean


def _fsdp2_step():
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    with record_comm() as log:
        model(torch.randn(2, 8)).sum().backward()
    return totals(log.records)


def test_fsdp2_collectives_are_seen():
    t = parlab.launch(_fsdp2_step, world_size=2, timeout=20, output="none", announce=False)[0]
    params = 2 * (8 * 8 + 8)
    # forward gathers each layer's weights, backward gathers them again (freed after forward: ZeRO-3)
    assert t["all_gather"]["bytes"] >= 2 * params * 4
    assert t["reduce_scatter"]["bytes"] == params * 4  # each gradient reduced once


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0
    assert busbw("all_reduce", 1e9, 1.0, 2) == pytest.approx(1e9)
    with pytest.raises(ValueError, match="op='gossip'"):
        bus_factor("gossip", 4)


def test_fit_alpha_beta_recovers_a_known_line():
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    alpha, beta = 50e-6, 1 / 5e9
    a, b = fit_alpha_beta(sizes, [alpha + beta * m for m in sizes])
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_fit_alpha_beta_never_goes_negative():
    # times that fall as messages grow (a loaded machine): the best fit with β = 0, a constant time
    # (weighted by 1/T: α = Σ(1/T) / Σ(1/T²)), not the unconstrained line's α with its β clipped
    seconds = [2e-3, 1.5e-3, 1e-3]
    a, b = fit_alpha_beta([1e3, 1e5, 1e6], seconds)
    assert b == 0 and a == pytest.approx(sum(1 / t for t in seconds) / sum(1 / t**2 for t in seconds))
    # a line through below the origin: the best fit with α = 0, a pure bandwidth term
    sizes = [1e4, 1e6, 1e7]
    a, b = fit_alpha_beta(sizes, [1e-9 * m - 5e-6 for m in sizes])
    assert a == 0 and 0 < b < 1e-9


def _sweep():
    return sweep("all_reduce", sizes=(1024, 65536), iters=2, warmup=1)


def _ping_pong():
    return sweep("send", sizes=(1024, 1 << 20), iters=2, warmup=1)


def test_sweep_send_times_one_message_of_a_ping_pong():
    points = parlab.launch(_ping_pong, world_size=3, timeout=30, output="none", announce=False)
    assert [p.bytes for p in points[0]] == [1024, 1 << 20]
    assert points[0] == points[1] == points[2]  # the slowest rank's time, on every rank
    assert all(p.seconds > 0 and p.busbw == p.algbw for p in points[0])  # a message's factor is 1


def test_sweep_reports_consistent_bandwidths():
    points = parlab.launch(_sweep, world_size=2, timeout=20, output="none", announce=False)[0]
    assert [p.bytes for p in points] == [1024, 65536]
    for p in points:
        assert p.algbw == pytest.approx(p.bytes / p.seconds)
        assert p.busbw == pytest.approx(p.algbw * 1.0)  # 2(n-1)/n = 1 for n = 2


def test_comm_table_lists_each_rank():
    results = parlab.launch(_every_op, world_size=2, timeout=20, output="none", announce=False)
    from parlab.lab.measure import CommRecord
    table = comm_table([[CommRecord(op, b, n, 0.0, 0.001) for op, b, n in res] for res in results])
    assert "   1  recv" in table and "   0  send" in table


def _dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sharded = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])  # each rank: (8 / n,)
    with record_comm() as log:
        full = sharded.full_tensor()                                    # (8,) on every rank
    return [(r.op, r.bytes, r.group_size) for r in log.records], full


def test_dtensor_functional_collectives_are_seen():
    for records, full in parlab.launch(_dtensor, world_size=2, timeout=20, output="none", announce=False):
        assert records == [("all_gather", 32, 2)]  # the gathered size, as for dist.all_gather
        torch.testing.assert_close(full, torch.arange(8.0))


def _course_ddp_step():
    from parlab.lab.measure import CommLog, Timeline
    from parlab.lab.parallel.ddp import DDPOverlap
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))  # 676 params
    tl = Timeline()
    with CommLog(timeline=tl) as log:
        ddp = DDPOverlap(model)
        ddp(torch.randn(2, 16)).sum().backward()
        ddp.sync_gradients()
    return totals(log.records), [e.kind for e in tl.events]


def test_course_ddp_reports_into_a_comm_log():
    t, kinds = parlab.launch(_course_ddp_step, world_size=2, timeout=20, output="none", announce=False)[0]
    assert t["broadcast"]["bytes"] == 676 * 4      # initial weights, once
    assert t["all_reduce"]["bytes"] == 676 * 4     # every gradient, once per step
    assert set(kinds) == {"comm"}


def _batched_exchange():
    from parlab.lab.measure import CommLog
    from parlab.lab.parallel import communicate_batch

    r, n = dist.get_rank(), dist.get_world_size()
    mine = torch.full((3,), float(r))  # 12 bytes
    left, right = torch.empty(3), torch.empty(3)
    with CommLog() as log:
        # every rank sends to both neighbours and receives from both, in one batch: no order can deadlock
        waits = communicate_batch([("send", mine, (r + 1) % n, "to right"), ("send", mine, (r - 1) % n, "to left"),
                                   ("recv", left, (r - 1) % n, "from left"), ("recv", right, (r + 1) % n, "from right")])
    for w in waits:  # waited for after the block: each still reports to the log open when it was issued
        w.wait()
    return left.tolist(), right.tolist(), [(rec.op, rec.bytes, rec.label) for rec in log.records]


def test_communicate_batch_exchanges_and_reports_each_message():
    results = parlab.launch(_batched_exchange, world_size=3, timeout=20, output="none", announce=False)
    for r, (left, right, records) in enumerate(results):
        assert left == [float((r - 1) % 3)] * 3 and right == [float((r + 1) % 3)] * 3
        assert sorted(records) == sorted([("send", 12, "to right"), ("send", 12, "to left"),
                                          ("recv", 12, "from left"), ("recv", 12, "from right")])


def test_communicate_batch_refuses_a_collective():
    from parlab.lab.parallel import communicate_batch

    def bad():
        communicate_batch([("all_reduce", torch.ones(1), 0, None)])

    with pytest.raises(parlab.RankError, match="only 'send' and 'recv'"):
        parlab.launch(bad, world_size=2, timeout=20, output="none", announce=False)


def _rooted_ops():
    from parlab.lab.measure import CommLog
    from parlab.lab.parallel.comm import communicate
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.empty(3)
    chunks = [torch.full((3,), float(r)) for r in range(n)] if rank == 1 else None
    gathered = [torch.empty(3) for _ in range(n)] if rank == 1 else None
    total = torch.full((2,), float(rank + 1))
    with CommLog() as log:
        communicate("scatter", mine, src=1, chunks=chunks)
        communicate("gather", mine + 10, dst=1, chunks=gathered)
        communicate("reduce", total, dst=1)
    return mine, gathered, total if rank == 1 else None, [(r.op, r.bytes, r.group_size) for r in log.records]


def test_communicate_scatter_gather_reduce_to_a_root_other_than_zero():
    n = 3
    results = parlab.launch(_rooted_ops, world_size=n, timeout=20, output="none", announce=False)
    for rank, (mine, gathered, total, records) in enumerate(results):
        torch.testing.assert_close(mine, torch.full((3,), float(rank)))
        # sizes: the whole scattered / gathered buffer (n chunks), the reduced buffer, on every rank
        assert records == [("scatter", 12 * n, n), ("gather", 12 * n, n), ("reduce", 8, n)]
    torch.testing.assert_close(results[1][1], [torch.full((3,), r + 10.0) for r in range(n)])
    torch.testing.assert_close(results[1][2], torch.full((2,), 6.0))
    assert bus_factor("scatter", 4) == bus_factor("gather", 4) == pytest.approx(0.75)


def test_nccl_transports_reads_the_channels_of_an_nccl_log():
    from parlab.lab.measure import nccl_transports
    log = ("node1:7:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
           "node1:7:7 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
           "node1:7:7 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1\n")
    assert nccl_transports(log) == {"P2P", "SHM"}
    assert nccl_transports("NCCL INFO Init COMPLETE") == set()


class _FakeGpuTiming:
    """Stands in for CUDA events on CPU ranks: says when it was asked to record, and gives a known span."""

    def __init__(self, device, host_start, group=None):
        self.device, self.host_start, self.waitable, self.read = device, host_start, "not yet", False

    def end_after(self, waitable=None):
        self.waitable = waitable  # a GPU would make a side stream wait on it; the host does not wait

    def span(self, clock):
        self.read = True
        return self.host_start + 1.0, self.host_start + 1.25


class _NoClock:
    """A GPU clock that must not be needed (_FakeGpuTiming reads no events)."""

    def __init__(self, device, drain=True):
        self.device = device


def _gpu_recorded_async_all_reduce():
    from parlab.lab.measure import comm as measure_comm
    from parlab.lab.measure.comm import CommLog
    from parlab.lab.parallel import comm as door

    door._on_cuda = lambda tensor: True  # this rank's tensors are "on a GPU"
    door.GpuTiming = _FakeGpuTiming
    measure_comm.GpuClock = _NoClock
    torch.cuda.synchronize = lambda *a: (_ for _ in ()).throw(AssertionError("the host synchronised the GPU"))
    t = torch.ones(4)
    with CommLog() as log:
        work = door.communicate("all_reduce", t, async_op=True, label="bucket 0")
        pending = [p for p, _ in log._pending]  # handed over at once, not timed yet
        work.wait()
    timing = pending[0].timing
    read_before = timing.read
    records = log.records
    return {"pending": len(pending), "waited_on_side": timing.waitable is work, "read_before": read_before,
            "records": records, "value": t.tolist(), "issued": timing.host_start}


def test_a_gpu_op_is_timed_by_events_when_the_log_is_read():
    """On GPUs NCCL only queues a collective: its record carries CUDA events and is timed when the log is read,
    so recording never blocks the host (which would hide the overlap being measured). Simulated on CPU."""
    for got in parlab.launch(_gpu_recorded_async_all_reduce, world_size=2, timeout=20, output="none", announce=False):
        assert got["value"] == [2.0] * 4
        assert got["pending"] == 1 and got["waited_on_side"] and not got["read_before"]
        (record,) = got["records"]
        assert (record.op, record.bytes, record.label) == ("all_reduce", 16, "bucket 0")
        assert (record.start, record.end) == (got["issued"] + 1.0, got["issued"] + 1.25)  # the events' times


# -- a GPU on the host's clock ----------------------------------------------------------------------------------
# CPU torch has no CUDA, so these tests hand parlab.lab.measure.gpu_clock.cuda a simulated GPU. It keeps the
# host's clock (time.perf_counter) but not its pace: the host only queues work, each stream runs its queue in
# order and no earlier than the host queued it, a kernel takes simulated time, and NCCL runs a collective on a
# stream of its own once its inputs are ready on the issuing stream and its previous collective is done.
# wait() only makes the current stream wait, as NCCL's does; synchronize() makes the host wait (it sleeps).


class _Stream:
    def __init__(self, name):
        self.name, self.free = name, 0.0  # free: when this stream's queue drains, on the host's clock


class _Event:
    def __init__(self, gpu):
        self.gpu, self.time = gpu, None

    def record(self, stream=None):
        stream = stream if stream is not None else self.gpu.current
        self.time = max(stream.free, time.perf_counter())  # when the GPU gets here

    def synchronize(self):
        assert self.time is not None, "an event read before it was recorded"
        time.sleep(max(0.0, self.time - time.perf_counter()))

    def elapsed_time(self, other):
        return (other.time - self.time) * 1e3  # ms, as CUDA's


class _Work:
    """NCCL's Work: wait() orders the current stream after the op; _get_duration() only when timing is on."""

    def __init__(self, gpu, start, end, timed):
        self.gpu, self.start, self.end, self.timed = gpu, start, end, timed

    def wait(self):
        self.gpu.current.free = max(self.gpu.current.free, self.end)
        return True

    def _get_duration(self):
        if not self.timed:
            raise RuntimeError("getDuration only works if timing was enabled")
        return (self.end - self.start) * 1e3


class _FakeGpu:
    """The ``torch.cuda`` the instruments use (Event, current_stream, Stream, stream, synchronize), and
    ``kernel``/``collective`` to queue simulated work."""

    def __init__(self):
        self.current = self.compute = _Stream("compute")
        self.nccl, self.streams, self.timed = _Stream("nccl"), [self.compute], False

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda's names
        return _Event(self)

    def current_stream(self, device=None):
        return self.current

    def Stream(self, device=None):  # noqa: N802
        self.streams.append(_Stream("side"))
        return self.streams[-1]

    @contextlib.contextmanager
    def stream(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def synchronize(self, device=None):
        time.sleep(max(0.0, max(s.free for s in [*self.streams, self.nccl]) - time.perf_counter()))

    def kernel(self, seconds):
        self.current.free = max(self.current.free, time.perf_counter()) + seconds

    def collective(self, seconds):
        start = max(self.current.free, self.nccl.free, time.perf_counter())  # inputs ready, NCCL's stream free
        self.nccl.free = start + seconds
        return _Work(self, start, self.nccl.free, self.timed)


class _Group:
    """A process group that can switch NCCL's timing on (ProcessGroup._enable_collectives_timing)."""

    def __init__(self, gpu):
        self.gpu = gpu

    def _enable_collectives_timing(self):
        self.gpu.timed = True


@pytest.fixture
def gpu(monkeypatch):
    from parlab.lab.measure import gpu_clock
    from parlab.lab.parallel import comm as door

    fake = _FakeGpu()
    monkeypatch.setattr(gpu_clock, "cuda", fake)
    monkeypatch.setenv("PARLAB_DEVICE", "cuda:0")  # this process is a GPU-mode rank: timelines keep the GPU's clock
    monkeypatch.setattr(door, "_on_cuda", lambda tensor: True)
    monkeypatch.setattr(door, "_issue", lambda op, tensor, group, **kw: fake.collective(0.010))  # NCCL: 10 ms
    return fake


def _overlaps(events):
    """Chapter 04's claim about stage 2, as its cell asserts it: a reduce-scatter started before backward ended."""
    backward_end = max(e.end for e in events if e.name == "backward")
    return any(e.start < backward_end for e in events if e.name.startswith("reduce_scatter"))


def _backward_with_a_reduce_scatter(gpu, plant):
    """An 80 ms backward on the GPU; the host issues a 10 ms reduce-scatter of its first half's gradients while
    queuing it. plant: None (NCCL runs it beside the second half), "after compute" (its inputs are ready only
    when the compute stream has drained: it runs after the backward) or "behind a gather" (a 100 ms collective
    issued just before holds NCCL's stream until after the backward)."""
    from parlab.lab.measure import CommLog, Timeline
    from parlab.lab.parallel import comm as door

    tl = Timeline()
    with CommLog(timeline=tl) as log:
        host_start = time.perf_counter()
        with tl.span("backward"):
            gpu.kernel(0.040)
            if plant == "after compute":
                gpu.kernel(0.040)
            if plant == "behind a gather":
                gpu.nccl.free = max(gpu.current.free, time.perf_counter()) + 0.100
            door.communicate("reduce_scatter", torch.ones(4), _Group(gpu), output=torch.ones(2), async_op=True,
                             label=0)
            if plant != "after compute":
                gpu.kernel(0.040)
        issued = log._pending[0][0].record.start  # the host's issue time: where the old placement put it
        gpu.synchronize()
        host_end = time.perf_counter()  # the old Timeline waited for the device at the span's end
    events = tl.events
    rs = next(e for e in events if e.kind == "comm")
    old = [Event(0, "backward", "compute", 0.0, host_end - tl.zero),
           Event(0, rs.name, "comm", issued - tl.zero, issued - tl.zero + rs.seconds)]
    return events, old, host_start - tl.zero



@pytest.mark.parametrize("plant", [None, "after compute", "behind a gather"])
def test_comm_records_sit_on_the_gpus_clock_so_an_overlap_claim_can_fail(gpu, plant):
    """On a GPU the host issues an op long before it runs. Placed at its host issue time (the old way), a
    reduce-scatter issued during backward always 'overlaps' it, so chapter 04's assert held by construction.
    Placed on the GPU's clock, a planted serialisation (the op runs after the backward's compute) fails it."""
    events, old, host_start = _backward_with_a_reduce_scatter(gpu, plant)
    backward = next(e for e in events if e.name == "backward")
    rs = next(e for e in events if e.kind == "comm")
    assert rs.name == "reduce_scatter 0" and rs.seconds == pytest.approx(0.010, abs=1e-3)  # NCCL's own 10 ms
    assert backward.seconds == pytest.approx(0.080, abs=8e-3)  # the GPU's 80 ms, though the host took µs
    overlapped_on_the_gpu = plant is None
    assert _overlaps(events) == overlapped_on_the_gpu  # the chapter's assert fails on a planted serialisation
    assert _overlaps(old), "the old placement: an op issued inside the backward span always 'overlaps' it"
    if plant is None:
        assert rs.start == pytest.approx(backward.start + 0.040, abs=8e-3)  # beside the second half
    else:
        assert rs.start >= backward.end - 1e-6


def test_without_nccls_timing_a_record_starts_where_its_inputs_were_ready(gpu):
    """NCCL's own start (Work._get_duration, switched on by the door) is what catches an op queued behind an
    earlier one; without it the record starts at its ready event on the issuing stream."""
    _Group._enable_collectives_timing, before = lambda self: None, _Group._enable_collectives_timing
    try:
        events, _, _ = _backward_with_a_reduce_scatter(gpu, "behind a gather")
    finally:
        _Group._enable_collectives_timing = before
    backward = next(e for e in events if e.name == "backward")
    rs = next(e for e in events if e.kind == "comm")
    assert rs.start == pytest.approx(backward.start + 0.040, abs=8e-3) and _overlaps(events)


def _zero3_wait(gpu, compute_s, old):
    """ZeRO-3 with prefetch: entering block 0, the host issues block 1's 60 ms all-gather, computes block 0
    for compute_s, then waits for the gather (ZeroStage3._gather's wait span). Returns the wait's seconds.
    old: the old spans, host times with a device-wide synchronize at each span's end."""
    from parlab.lab.measure import Timeline
    from parlab.lab.measure.attach import mark, span_since

    tl = Timeline()
    with tl:
        work = gpu.collective(0.060)  # the prefetched gather, on NCCL's stream
        started, host = mark(), time.perf_counter()
        gpu.kernel(compute_s)
        span_since("f block0", started)
        if old:
            gpu.synchronize()  # the old _span: the host waits for every stream, NCCL's too
        started, host = mark(), time.perf_counter()
        work.wait()
        span_since("wait block1", started, "idle")
        if old:
            gpu.synchronize()
            return time.perf_counter() - host
    return next(e.seconds for e in tl.events if e.name == "wait block1")


def test_zero3_wait_spans_show_a_gather_that_prefetch_did_not_hide(gpu):
    """The wait is the compute stream's stall for the gather: 40 ms when 20 ms of compute cannot hide a
    60 ms gather, 0 when 80 ms can. The old device-wide synchronize read about 0 in both."""
    assert _zero3_wait(gpu, 0.020, old=False) == pytest.approx(0.040, abs=8e-3)
    assert _zero3_wait(gpu, 0.080, old=False) == pytest.approx(0.0, abs=1e-3)
    assert _zero3_wait(gpu, 0.020, old=True) < 8e-3  # what the old spans said of the exposed gather


def test_p2p_messages_end_when_the_gpu_delivers_them(gpu, monkeypatch):
    """Chapter 06's pipelines send through communicate_batch. NCCL's wait() returns at enqueue, so a host
    time ends a message there; on the GPU's clock it ends when the 10 ms transfer does."""
    from parlab.lab.measure import CommLog, Timeline
    from parlab.lab.parallel import comm as door

    monkeypatch.setattr(dist, "P2POp", lambda *a, **kw: a)
    monkeypatch.setattr(dist, "get_global_rank", lambda group, rank: rank)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [gpu.collective(0.010)])
    tl = Timeline()
    with CommLog(timeline=tl) as log:
        gpu.kernel(0.040)  # the forward whose output is sent
        (send,) = door.communicate_batch([("send", torch.ones(4), 1, "F0")])
        send.wait()
        enqueued = time.perf_counter() - tl.zero  # where a host time would end it
    (event,) = tl.events
    (record,) = log.records
    assert (record.op, record.label, record.peer) == ("send", "F0", 1)
    assert event.start == pytest.approx(0.040, abs=8e-3) and event.seconds == pytest.approx(0.010, abs=1e-3)
    assert enqueued < event.end - 0.040  # the host's end would have cut the message to almost nothing


def test_a_timeline_read_first_still_gets_the_gpu_ops_spans(gpu):
    """A CommLog feeding a Timeline: reading the timeline's events places the log's pending GPU ops first, on
    the timeline of the step they were issued in (a log may get a fresh timeline each step)."""
    from parlab.lab.measure.comm import CommLog
    from parlab.lab.measure.timeline import Timeline
    from parlab.lab.parallel import comm as door

    log = CommLog()
    first = log.timeline = Timeline()
    with log:
        door.communicate("all_reduce", torch.ones(4), async_op=True)
    second = log.timeline = Timeline()
    (event,) = first.events
    assert (event.name, event.kind) == ("all_reduce", "comm") and 0 <= event.start < event.end
    assert second.events == [] and len(log.records) == 1
