"""Chapter 03's exercises: averaging gradients over shards of unequal size, and predicting the buckets
PyTorch's DDP rebuilds."""

from __future__ import annotations

import torch
import torch.distributed as dist

import parlab
from parlab.exercises.core import ExerciseFailed, Passed, _name

#: Examples each rank holds in the uneven-shard check (rank r gets SHARD_SIZES[r % len]).
SHARD_SIZES = (3, 5, 2, 6)


def _known_grads(rank: int, shapes) -> list[torch.Tensor]:
    """The gradients rank ``rank`` starts with: different on every rank, reproducible on any."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(s, generator=g) for s in shapes]


def _uneven_on_rank(fn) -> list[str]:
    from parlab.models import tiny_mlp

    rank, n = parlab.rank(), parlab.world_size()
    sizes = [SHARD_SIZES[r % len(SHARD_SIZES)] for r in range(n)]
    names, params = zip(*tiny_mlp(seed=0).named_parameters())
    shapes = [p.shape for p in params]
    everyone = [_known_grads(r, shapes) for r in range(n)]
    for p, g in zip(params, everyone[rank]):
        p.grad = g.clone()
    fn(list(params), sizes[rank])
    problems = {}
    for i, (name, p) in enumerate(zip(names, params)):
        want = sum(b * e[i] for b, e in zip(sizes, everyone)) / sum(sizes)
        equal = sum(e[i] for e in everyone) / n
        got = p.grad
        if got is None or got.shape != want.shape:
            text = f".grad is {None if got is None else tuple(got.shape)}, expected shape {tuple(want.shape)}"
        elif torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            continue
        elif torch.allclose(got, equal, rtol=1e-5, atol=1e-6):
            text = (f"every rank weighs the same, but they hold {sizes} examples: a rank's mean gradient counts "
                    f"as many times as it has examples")
        elif torch.allclose(got, everyone[rank][i]):
            text = ".grad is unchanged: nothing was combined with the other ranks"
        else:
            text = f".grad differs from the gradient of the global mean loss by up to {(got - want).abs().max():.3g}"
        problems.setdefault(text, []).append(name)
    return [f"{'every parameter' if len(ns) == len(names) else ', '.join(ns)}: {text}"
            for text, ns in problems.items()]


def check_weighted_average(fn, world_size: int = 2) -> Passed:
    """Chapter 03: ``fn(params, local_batch_size)``, on ranks holding shards of different sizes (3, 5, …
    examples) whose ``.grad`` are the gradients of each shard's *mean* loss, must leave in every ``.grad``
    the gradient of the mean loss over all examples."""
    if not callable(fn):
        raise TypeError(f"fn must be a function weighted_average(params, local_batch_size); got {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2; got {world_size!r}")
    per_rank = parlab.launch(_uneven_on_rank, world_size=world_size, args=(fn,), announce=False, output="all")
    ranks_of: dict[str, list[int]] = {}  # the same finding on several ranks is reported once
    for r, lines in enumerate(per_rank):
        for line in lines:
            ranks_of.setdefault(line, []).append(r)
    report = [f"{'every rank' if len(rs) == world_size else 'rank ' + ', '.join(map(str, rs))}: {line}"
              for line, rs in ranks_of.items()]
    if report:
        raise ExerciseFailed(f"{_name(fn)} is not right yet:\n  " + "\n  ".join(report[:6]))
    sizes = [SHARD_SIZES[r % len(SHARD_SIZES)] for r in range(world_size)]
    return Passed(f"every gradient on {world_size} ranks holding {sizes} examples is the global mean's")


def _reference_weighted_average(params, local_batch_size):
    # the check's own answer, used by the tests
    total = torch.tensor([float(local_batch_size)])
    dist.all_reduce(total)
    for p in params:
        p.grad.mul_(local_batch_size / total)
        dist.all_reduce(p.grad)


#: Layers (in, out) of the model in the bucket check: 3.2 MiB of parameters of many sizes, so that a
#: 1 MiB first bucket and a 0.5 MiB cap give different layouts.
BUCKET_MODEL = ((128, 512), (512, 384), (384, 512), (512, 256), (256, 640), (640, 128))


def _ddp_buckets_on_rank(bucket_cap_mb):
    from torch.nn.parallel import DistributedDataParallel

    from parlab.measure import ddp_buckets

    torch.manual_seed(0)
    layers = [torch.nn.Linear(i, o) for i, o in BUCKET_MODEL]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())])
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    for _ in range(2):  # the rebuild happens at the second forward
        ddp(torch.randn(4, BUCKET_MODEL[0][0])).sum().backward()
    params = dict(model.named_parameters())
    order = [int(i) for i in ddp._get_ddp_logging_data()["prev_iteration_grad_ready_order_indices"].split(",")]
    names = list(params)
    ready = [params[names[i]].numel() * 4 for i in order]
    return ready, [nbytes for _, nbytes in ddp_buckets(ddp)]


def check_ddp_buckets(fn) -> Passed:
    """Chapter 03: ``fn(ready_bytes, bucket_cap_mb=None)`` → the bytes of each bucket PyTorch's DDP rebuilds,
    given each parameter's gradient size in the order the gradients became ready (all fp32) and the
    ``bucket_cap_mb`` passed to DDP (``None``: its default). Checked against DDP itself on two ranks."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote")
    for cap in (None, 0.5):
        ready, real = parlab.launch(_ddp_buckets_on_rank, world_size=2, args=(cap,), announce=False,
                                    output="none")[0]
        got = fn(list(ready), cap) if cap is not None else fn(list(ready))
        if list(got) != real:
            raise ExerciseFailed(f"{_name(fn)}(ready_bytes, bucket_cap_mb={cap}) = {list(got)}; DDP built "
                                 f"{real} from gradients of {ready} bytes, in that order")
    return Passed(f"{_name(fn)} predicts DDP's rebuilt buckets at the default cap and at 0.5 MiB")
