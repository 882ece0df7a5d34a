"""Parity of the from-scratch DDP (``parlab.lab.parallel.ddp``, chapter 03) with a single process trained on
the global batch and with ``torch.nn.parallel.DistributedDataParallel``.

One launch per world size trains every configuration (v1, v2 and v3 at several bucket sizes, PyTorch's
DDP, gradient accumulation, a planted bug) on the tiny MLP and the tiny GPT-2, and sends back the final
parameters and the recorded collectives; the assertions then run here.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

import parlab
from parlab.lab.launch import preload
from parlab.lab.measure import CommLog
from parlab.lab.models import regression_batch, shard, tiny_gpt2, tiny_mlp, token_batch
from parlab.lab.parallel import DDPBuckets, DDPNaive, DDPOverlap

STEPS = 3
GLOBAL_BATCH = 12  # splits evenly over 2, 3 and 4 ranks
ACCUM = 2  # micro-batches per step in the no_sync test
LR = 0.05
TASKS = ("mlp", "gpt2")
# 64 B is smaller than almost every parameter (each then fills a bucket alone); 1 KiB groups a few
# small ones; the default (25 MiB) puts the whole model in one bucket.
BUCKETS = (64, 1024, 25 * 1024 * 1024)


def build(task: str, seed: int):
    """(model, global batch for step s, loss(model, shard))."""
    if task == "mlp":
        model = tiny_mlp(seed=seed)
        return (model, lambda s, b=GLOBAL_BATCH: regression_batch(b, seed=100 + s),
                lambda m, xy: torch.nn.functional.mse_loss(m(xy[0]), xy[1]))
    model = tiny_gpt2(seed=seed)
    return model, lambda s, b=GLOBAL_BATCH: token_batch(b, seed=100 + s), lambda m, x: m(input_ids=x, labels=x).loss


class NoAverage(DDPNaive):
    """A planted bug: sums the gradients but forgets to divide by the world size."""

    def sync_gradients(self):
        for i, p in enumerate(self._params):
            self._communicate("all_reduce", p.grad, i)


def wrap(kind: str, model, bucket_bytes):
    if kind == "v1":
        return DDPNaive(model)
    if kind == "v2":
        return DDPBuckets(model, bucket_bytes)
    if kind == "v3":
        return DDPOverlap(model, bucket_bytes)
    if kind == "no_average":
        return NoAverage(model)
    return torch.nn.parallel.DistributedDataParallel(model)


def train(kind: str, task: str, bucket_bytes=None, accum: int = 1):
    """Runs on a rank: STEPS optimizer steps on this rank's shard; returns parameters and a trace."""
    rank, n = parlab.rank(), parlab.world_size()
    # Each rank starts from a different initialisation: only the wrapper's broadcast makes them agree.
    model, batch, loss_fn = build(task, seed=1 + rank)
    ddp = wrap(kind, model, bucket_bytes)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    trace = {"backward": [], "comm_in_no_sync": 0}
    for s in range(STEPS):
        mine = shard(batch(s, GLOBAL_BATCH * accum), rank, n)
        micro = [shard(mine, i, accum) for i in range(accum)]
        with CommLog() as log:  # this step's collectives
            for i, mb in enumerate(micro):
                last = i == accum - 1
                # Dividing by accum makes the summed micro-batch gradients those of the mean over all of them.
                with ddp.no_sync() if not last else contextlib.nullcontext():
                    loss = loss_fn(ddp, mb) / accum
                    start = time.perf_counter()
                    loss.backward()
                    trace["backward"].append((start, time.perf_counter()))
                    if not last:
                        trace["comm_in_no_sync"] += len(log.records)
            if kind != "torch":
                ddp.sync_gradients()
        opt.step()
        opt.zero_grad()
    trace["events"] = [e for e in log.records if e.op == "all_reduce"]  # the last step's collectives
    trace["buckets"] = [b.names for b in getattr(ddp, "buckets", [])]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, trace


def configs():
    out = []
    for task in TASKS:
        out.append(("torch", task, None, 1))
        out.append(("v1", task, None, 1))
        out += [("v2", task, b, 1) for b in BUCKETS]
        out += [("v3", task, b, 1) for b in BUCKETS[:1] + BUCKETS[2:]]
        out.append(("v3", task, BUCKETS[1], ACCUM))
        out.append(("torch", task, None, ACCUM))
    out.append(("no_average", "mlp", None, 1))
    return out


def run_all(cfgs):
    return {c: train(*c) for c in cfgs}


def reference(task: str, accum: int):
    """One process, no wrapper, the whole global batch per step."""
    model, batch, loss_fn = build(task, seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for s in range(STEPS):
        loss_fn(model, batch(s, GLOBAL_BATCH * accum)).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


@pytest.fixture(scope="module")
def refs():
    return {(t, a): reference(t, a) for t in TASKS for a in (1, ACCUM)}


@pytest.fixture(scope="module")
def warm_ranks():
    # Modules every rank would otherwise import afresh after each fork: DistributedDataParallel imports
    # torch._dynamo (~7 s on a 2-core machine) and the GPT-2 code loads lazily (~5 s).
    preload("torch._dynamo", "transformers.models.gpt2.modeling_gpt2")


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def trained(request, warm_ranks):
    n = request.param
    cfgs = configs()
    per_rank = parlab.launch(run_all, world_size=n, args=(cfgs,), timeout=120, output="rank0", announce=False)
    return n, cfgs, per_rank


def _label(cfg):
    kind, task, b, accum = cfg
    return f"{kind}/{task}" + (f"/bucket={b}" if b else "") + (f"/accum={accum}" if accum > 1 else "")


def test_every_rank_ends_with_the_same_parameters(trained):
    n, cfgs, per_rank = trained
    for cfg in cfgs:
        if cfg[0] == "no_average":
            continue
        for r in range(1, n):
            assert_close(per_rank[r][cfg][0], per_rank[0][cfg][0], rtol=0, atol=0,
                         msg=lambda m, c=cfg, r=r: f"{_label(c)}: rank {r} differs from rank 0: {m}")


def test_matches_single_process_on_the_global_batch(trained, refs):
    n, cfgs, per_rank = trained
    for cfg in cfgs:
        kind, task, _, accum = cfg
        if kind == "no_average":
            continue
        assert_close(per_rank[0][cfg][0], refs[task, accum],
                     msg=lambda m, c=cfg: f"{_label(c)} at world size {n} vs single process: {m}")


def test_matches_pytorch_ddp(trained):
    n, cfgs, per_rank = trained
    for cfg in cfgs:
        kind, task, _, accum = cfg
        if kind in ("torch", "no_average"):
            continue
        assert_close(per_rank[0][cfg][0], per_rank[0][("torch", task, None, accum)][0],
                     msg=lambda m, c=cfg: f"{_label(c)} at world size {n} vs DistributedDataParallel: {m}")


def test_the_check_catches_a_missing_average(trained, refs):
    n, _, per_rank = trained
    with pytest.raises(AssertionError):
        assert_close(per_rank[0][("no_average", "mlp", None, 1)][0], refs["mlp", 1])


def test_bytes_per_step_equal_the_model_size(trained):
    """Every version all-reduces each gradient exactly once per step: Ψ numbers, 4Ψ bytes."""
    n, cfgs, per_rank = trained
    for cfg in cfgs:
        kind, task, b, accum = cfg
        if kind not in ("v1", "v2", "v3"):
            continue
        params = list(build(task, seed=0)[0].parameters())
        psi = sum(p.numel() for p in params)
        events = per_rank[0][cfg][1]["events"]
        assert sum(e.bytes for e in events) == 4 * psi, _label(cfg)
        expected = len(params) if kind == "v1" else len(per_rank[0][cfg][1]["buckets"])
        assert len(events) == expected, f"{_label(cfg)}: one collective per bucket"


def test_bucket_layout(trained):
    _, _, per_rank = trained
    one = per_rank[0][("v2", "mlp", BUCKETS[2], 1)][1]["buckets"]
    tiny = per_rank[0][("v2", "mlp", BUCKETS[0], 1)][1]["buckets"]
    names = [n for n, _ in tiny_mlp().named_parameters()]
    assert one == [names[::-1]]  # everything fits one bucket, in reverse parameter order
    # A bucket closes once it holds >= 64 B: out.bias (8 floats, 32 B) shares with out.weight; every
    # other parameter is 64 B or more and fills a bucket alone.
    assert tiny == [["out.bias", "out.weight"]] + [[n] for n in names[::-1][2:]]


def test_v3_communicates_during_backward_and_v2_after(trained):
    _, _, per_rank = trained
    for task in TASKS:
        v3 = per_rank[0][("v3", task, BUCKETS[0], 1)][1]
        v2 = per_rank[0][("v2", task, BUCKETS[0], 1)][1]
        assert min(e.start for e in v3["events"]) < v3["backward"][-1][1], f"v3/{task}: nothing overlapped"
        assert min(e.start for e in v2["events"]) >= v2["backward"][-1][1], f"v2/{task}: started early"


def test_no_sync_does_not_communicate(trained):
    _, _, per_rank = trained
    for task in TASKS:
        trace = per_rank[0][("v3", task, BUCKETS[1], ACCUM)][1]
        assert trace["comm_in_no_sync"] == 0
        assert len(trace["events"]) == len(trace["buckets"])


# -- bad use ---------------------------------------------------------------------------------------------


def test_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="process group"):
        DDPNaive(tiny_mlp())


def _misuse():
    model = DDPOverlap(tiny_mlp(), bucket_bytes=256)
    x, y = regression_batch(4)
    errors = []
    torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        torch.nn.functional.mse_loss(model.module(x), y).backward()
    except RuntimeError as exc:
        errors.append(str(exc))
    model.sync_gradients()
    torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        model(x)
    except RuntimeError as exc:
        errors.append(str(exc))
    model.sync_gradients()
    for bad in (0, -5, 1.5, True):
        try:
            DDPBuckets(tiny_mlp(), bucket_bytes=bad)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_misuse_is_explained():
    errors = parlab.launch(_misuse, world_size=2, output="none", announce=False)[0]
    assert "no_sync" in errors[0]
    assert "sync_gradients()" in errors[1]
    assert len(errors) == 6 and all("bucket_bytes" in e for e in errors[2:])


def test_shard_rejects_uneven_batches():
    with pytest.raises(ValueError, match="world_size=3"):
        shard(torch.zeros(10, 2), 0, 3)
    with pytest.raises(ValueError, match="rank"):
        shard(torch.zeros(12, 2), 3, 3)
    x, y = shard(regression_batch(12), 1, 3)
    assert x.shape == (4, 16) and y.shape == (4, 8)
    assert torch.equal(token_batch(4, seed=7), token_batch(4, seed=7))
    assert not torch.equal(token_batch(4, seed=7), token_batch(4, seed=8))
