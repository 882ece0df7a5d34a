"""Communication accounting: every collective recorded with the right op, bytes and group size."""

import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.lab.measure import (
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
    """Stands in for CUDA events on CPU ranks: says when it was asked to record, and gives a known duration."""

    def __init__(self, device, host_start):
        self.host_start, self.waitable, self.read = host_start, "not yet", False

    def end_after(self, waitable=None):
        self.waitable = waitable  # a GPU would make a side stream wait on it; the host does not wait

    def seconds(self):
        self.read = True
        return 0.25


def _gpu_recorded_async_all_reduce():
    from parlab.lab.measure.comm import CommLog
    from parlab.lab.parallel import comm as door

    door._on_cuda = lambda tensor: True  # this rank's tensors are "on a GPU"
    door.GpuTiming = _FakeGpuTiming
    torch.cuda.synchronize = lambda *a: (_ for _ in ()).throw(AssertionError("the host synchronised the GPU"))
    t = torch.ones(4)
    with CommLog() as log:
        work = door.communicate("all_reduce", t, async_op=True, label="bucket 0")
        pending = list(log._pending)  # handed over at once, not timed yet
        work.wait()
    timing = pending[0].timing
    read_before = timing.read
    records = log.records
    return {"pending": len(pending), "waited_on_side": timing.waitable is work, "read_before": read_before,
            "records": records, "value": t.tolist()}


def test_a_gpu_op_is_timed_by_events_when_the_log_is_read():
    """On GPUs NCCL only queues a collective: its record carries CUDA events and is timed when the log is read,
    so recording never blocks the host (which would hide the overlap being measured). Simulated on CPU."""
    for got in parlab.launch(_gpu_recorded_async_all_reduce, world_size=2, timeout=20, output="none", announce=False):
        assert got["value"] == [2.0] * 4
        assert got["pending"] == 1 and got["waited_on_side"] and not got["read_before"]
        (record,) = got["records"]
        assert (record.op, record.bytes, record.label) == ("all_reduce", 16, "bucket 0")
        assert record.seconds == pytest.approx(0.25)  # the events' time, not the host's


def test_a_timeline_read_first_still_gets_the_gpu_ops_spans():
    """A CommLog feeding a Timeline: reading the timeline's events times the log's pending GPU ops first."""
    from parlab.lab.measure.comm import CommLog, CommRecord, PendingRecord
    from parlab.lab.measure.timeline import Timeline

    tl = Timeline(sync=False)
    log = CommLog(timeline=tl)
    timing = _FakeGpuTiming(None, tl.zero + 1.0)
    log(PendingRecord(CommRecord("all_reduce", 16, 2, 0.0, 0.0), timing))
    (event,) = tl.events
    assert (event.name, event.kind, event.start, event.end) == ("all_reduce", "comm", 1.0, 1.25) and timing.read
