"""Chapter 03's exercises: averaging gradients over shards of unequal size, predicting the buckets
PyTorch's DDP rebuilds, and how many of v3's buckets set off before backward has produced its last gradient."""

from __future__ import annotations

import random

import torch

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, _call, _name, refusing
from parlab.lab.language import say


def _shard_sizes(world_size: int, draw: random.Random) -> list[int]:
    """Examples each rank holds in the uneven-shard check, drawn anew at every call: unequal, and summing to
    no multiple of ``world_size`` (so no batch size assumed equal on every rank, times n, gives the total)."""
    while True:
        sizes = [draw.randrange(1, 10) for _ in range(world_size)]
        if len(set(sizes)) > 1 and sum(sizes) % world_size:
            return sizes


def _known_grads(rank: int, shapes) -> list[torch.Tensor]:
    """The gradients rank ``rank`` starts with: different on every rank, reproducible on any."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(s, generator=g) for s in shapes]


def _uneven_on_rank(fn, sizes) -> list[str]:
    from parlab.lab.models import tiny_mlp

    rank, n = parlab.rank(), parlab.world_size()
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
            text = say(".grad is {got}, expected shape {shape}", got=None if got is None else tuple(got.shape),
                       shape=tuple(want.shape))
        elif torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            continue
        elif torch.allclose(got, equal, rtol=1e-5, atol=1e-6):
            text = say("every rank weighs the same, but they hold {sizes} examples: a rank's mean gradient counts "
                       "as many times as it has examples", sizes=sizes)
        elif torch.allclose(got, everyone[rank][i]):
            text = say(".grad is unchanged: nothing was combined with the other ranks")
        elif torch.allclose(got, (scale := float((got * want).sum() / (want * want).sum())) * want, rtol=1e-4,
                            atol=1e-6):
            text = say(".grad points the right way but is {scale:.3g} times the global mean's: divide by the "
                       "number of examples all ranks hold together, which only the ranks' local_batch_size summed "
                       "tells (not a batch size assumed the same on every rank)", scale=scale)
        else:
            text = say(".grad differs from the gradient of the global mean loss by up to {most:.3g}",
                       most=(got - want).abs().max())
        problems.setdefault(text, []).append(name)
    return [say("every parameter: {problem}", problem=text) if len(ns) == len(names) else
            say("{names}: {problem}", names=", ".join(ns), problem=text) for text, ns in problems.items()]


def check_weighted_average(fn, world_size: int = 2) -> Passed:
    """Chapter 03: ``fn(params, local_batch_size)``, on ranks holding shards of different sizes (drawn
    anew at every call) whose ``.grad`` are the gradients of each shard's *mean* loss, must leave in every ``.grad``
    the gradient of the mean loss over all examples."""
    if not callable(fn):
        raise TypeError(say("fn must be a function weighted_average(params, local_batch_size); got {fn!r}", fn=fn))
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(say("world_size must be an int >= 2; got {world_size!r}", world_size=world_size))
    sizes = _shard_sizes(world_size, random.Random())
    per_rank = parlab.launch(_uneven_on_rank, world_size=world_size, args=(fn, sizes), announce=False, output="all")
    ranks_of: dict[str, list[int]] = {}  # the same finding on several ranks is reported once
    for r, lines in enumerate(per_rank):
        for line in lines:
            ranks_of.setdefault(line, []).append(r)
    report = [say("every rank: {finding}", finding=line) if len(rs) == world_size else
              say("rank {ranks}: {finding}", ranks=", ".join(map(str, rs)), finding=line)
              for line, rs in ranks_of.items()]
    if report:
        raise ExerciseFailed(say("{fn} is not right yet:", fn=_name(fn)) + "\n  " + "\n  ".join(report[:6]))
    return Passed(say("every gradient on {world_size} ranks holding {sizes} examples is the global mean's",
                      world_size=world_size, sizes=sizes))


#: Layers (in, out) of the model in the bucket check: 3.2 MiB of parameters of many sizes, so that a
#: 1 MiB first bucket and a 0.5 MiB cap give different layouts.
BUCKET_MODEL = ((128, 512), (512, 384), (384, 512), (512, 256), (256, 640), (640, 128))


def _ddp_buckets_on_rank(bucket_cap_mb):
    from torch.nn.parallel import DistributedDataParallel

    from parlab.lab.measure import ddp_buckets

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


def _buckets_of(fn, ready, cap):
    with refusing("ch03.2", say("the exercise asks for DDP's rule applied by you, not the package's bucket layout")):
        got = _call(fn, list(ready), cap) if cap is not None else _call(fn, list(ready))
    try:
        return list(got)
    except TypeError:
        raise ExerciseFailed(say("{fn}(ready_bytes, bucket_cap_mb={cap}) returned {got!r:.60}: return a list of "
                                 "the bytes of each bucket", fn=_name(fn), cap=cap, got=got)) from None


#: Gradient sizes that tell DDP's rule from its near misses every time (drawn sizes do so only by chance): buckets
#: of exactly the limit (1 MiB first at the default cap; 1 MiB and 0.5 MiB caps), and buckets that reach 10⁶ bytes
#: (or 0.5·10⁶) but not 2²⁰ (or 2¹⁹): a MiB is 2²⁰ bytes.
EDGE_CASES = (
    ([2**19, 2**19, 4096, 2**18, 2**18, 2**18, 2**18, 4096], None),  # a first bucket of exactly 1 MiB
    ([500_000, 500_000, 8_000, 65_536, 2**18, 2**18, 2**18, 2**18, 4096], 1),  # exactly 10⁶, then exactly 2²⁰
    ([2**17, 2**17, 2**16, 2**16, 2**17, 2**18, 245_760, 8192, 16384, 4096], 0.5),  # exactly 2¹⁹, then 507,904
)


def _bucket_mistake(got, ready, cap) -> str:
    """The hint naming the near miss of DDP's rule that ``got`` is, or ''."""
    unit = say("DDP counts bucket_cap_mb in MiB, 2²⁰ = 1,048,576 bytes (int(bucket_cap_mb * 1024 * 1024))")
    edge = say("a bucket closes once it holds the limit or more (>=), so a bucket of exactly the limit closes")
    named = {  # the single mistakes first: a combined one is named only when neither alone explains ``got``
        (10**6, ">=", "default", "after"): say("You read bucket_cap_mb's MB as 10⁶ bytes: {unit}.", unit=unit),
        (2**20, ">", "default", "after"): say("You close a bucket only above the limit (>): {edge}.", edge=edge),
        (10**6, ">", "default", "after"): say("You read bucket_cap_mb's MB as 10⁶ bytes ({unit}), and you close a "
                                              "bucket only above the limit (>): {edge}.", unit=unit, edge=edge),
        (2**20, ">=", "always", "after"): say("Only at DDP's default cap (bucket_cap_mb=None) is the first bucket's "
                                              "limit 1 MiB; a cap you pass applies to every bucket."),
        (2**20, ">=", "never", "after"): say("At DDP's default cap (bucket_cap_mb=None) the first bucket closes at "
                                             "1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), the later ones at 25 MiB."),
        (2**20, ">=", "default", "before"): say("DDP adds a gradient to the open bucket first and then closes it if "
                                                "it holds the limit or more: a bucket may end above the limit."),
    }
    right = _reference_buckets(ready, cap)
    for (unit_bytes, closes, first, when), hint in named.items():
        wrong = _reference_buckets(ready, cap, unit=unit_bytes, closes=closes, first=first, when=when)
        if wrong != right and got == wrong:
            return say(" {hint}", hint=hint)  # after the sentence before it: a space in English, none in Chinese
    return ""


def check_ddp_buckets(fn) -> Passed:
    """Chapter 03: ``fn(ready_bytes, bucket_cap_mb=None)`` → the bytes of each bucket PyTorch's DDP rebuilds,
    given each parameter's gradient size in the order the gradients became ready (all fp32) and the
    ``bucket_cap_mb`` passed to DDP (``None``: its default). Checked against DDP itself on two ranks."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    for cap in (None, 0.5):
        ready, real = parlab.launch(_ddp_buckets_on_rank, world_size=2, args=(cap,), announce=False,
                                    output="none")[0]
        got = _buckets_of(fn, ready, cap)
        if got != real:
            raise ExerciseFailed(say("{fn}(ready_bytes, bucket_cap_mb={cap}) = {got}; DDP built {real} from "
                                     "gradients of {ready} bytes, in that order.{hint}", fn=_name(fn), cap=cap,
                                     got=got, real=real, ready=ready, hint=_bucket_mistake(got, ready, cap)))
    # then DDP's rule (as DDP applied it above) at its edges, every time, and on gradients drawn afresh: a layout
    # copied from a message fails
    draw = random.Random()
    drawn = [([4 * draw.choice((64, 256, 4096, 65536, 262144)) for _ in range(draw.randrange(8, 24))], cap)
             for cap in (None, 0.25, 1)]
    for ready, cap in [*EDGE_CASES, *drawn]:
        want = _reference_buckets(ready, cap)
        got = _buckets_of(fn, ready, cap)
        if got != want:
            raise ExerciseFailed(say("{fn}(ready_bytes, bucket_cap_mb={cap}) = {got}; DDP's rule gives {want} for "
                                     "gradients of {ready} bytes, in that order.{hint}", fn=_name(fn), cap=cap,
                                     got=got, want=want, ready=list(ready), hint=_bucket_mistake(got, ready, cap)))
    return Passed(say("{fn} predicts DDP's rebuilt buckets at the default cap and at 0.5 MiB, and on fresh "
                      "gradient sizes", fn=_name(fn)))


def _reference_buckets(ready_bytes, bucket_cap_mb=None, *, unit=2**20, closes=">=", first="default",
                       when="after"):
    # DDP's rebuild (torch/nn/parallel/distributed.py, _compute_bucket_assignment_by_size): close a bucket
    # once it holds the limit; the first limit is 1 MiB only when the cap is the default 25 MiB. The keywords
    # give the near misses the check names (a MB of 10⁶ bytes, ">", the first limit always or never 1 MiB, a
    # bucket closed before the gradient that would take it over the limit).
    cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * unit)
    default_first = bucket_cap_mb is None if first == "default" else first == "always"
    limit = unit if default_first else cap
    buckets, size = [], 0
    for nbytes in ready_bytes:
        if when == "before" and size and size + nbytes > limit:
            buckets.append(size)
            size, limit = 0, cap
        size += nbytes
        if when == "after" and (size > limit or (closes == ">=" and size == limit)):
            buckets.append(size)
            size, limit = 0, cap
    return buckets + ([size] if size else [])


#: Exercise 3's bucket sizes: far below every weight matrix, and above the whole tiny model.
TRY_BUCKETS = (1024, 16 * 2**20)


def _early_launches(sizes, bucket_bytes, seq_len):
    from parlab.lab.models import tiny_gpt2, token_batch
    from parlab.lab.parallel import DDPOverlap

    model = DDPOverlap(tiny_gpt2(**sizes, seed=0), bucket_bytes)
    early = []  # per launch: did backward still owe gradients when it started?
    launch = model._launch

    def counted(bucket):
        early.append(len(model._ready) < len(model._params))
        launch(bucket)

    model._launch = counted
    x = token_batch(2, seq_len, sizes["vocab_size"], seed=parlab.rank())
    model(input_ids=x, labels=x).loss.backward()
    model.sync_gradients()
    return len(model.buckets), sum(early)


def check_early_buckets(answers, sizes: dict, seq_len: int = 8) -> Passed:
    """Chapter 03, exercise 3: ``answers`` maps each bucket size in :data:`TRY_BUCKETS` to ``(buckets,
    early)``: how many buckets v3 (``DDPOverlap``) builds for ``tiny_gpt2(**sizes)``, and how many of their
    all-reduces start before the last gradient of backward is ready. Measured on two ranks."""
    if not isinstance(answers, dict) or set(answers) != set(TRY_BUCKETS):
        raise ExerciseFailed(say("answers must be a dict with the keys {keys} (bucket_bytes), each holding "
                                 "(buckets, early); got {answers!r:.120}", keys=list(TRY_BUCKETS), answers=answers))
    for bucket_bytes in TRY_BUCKETS:
        real = tuple(parlab.launch(_early_launches, world_size=2, args=(sizes, bucket_bytes, seq_len),
                                   announce=False, output="none")[0])
        got = answers[bucket_bytes]
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseFailed(say("answers[{bucket_bytes}] must be (buckets, early); got {got!r}",
                                     bucket_bytes=bucket_bytes, got=got))
        if tuple(got)[0] != real[0]:
            raise ExerciseFailed(say("bucket_bytes={bucket_bytes}: you said {buckets} buckets; v3 builds a different "
                                     "number (rerun section 5 with this bucket_bytes and read "
                                     "len(v3[0]['buckets']))", bucket_bytes=bucket_bytes, buckets=got[0]))
        if tuple(got)[1] != real[1]:
            raise ExerciseFailed(say("bucket_bytes={bucket_bytes}: {early} of {buckets} buckets starting early is "
                                     "not what v3 does: a bucket starts once its own gradients and every earlier "
                                     "bucket's are in; which bucket holds the last gradient backward produces?",
                                     bucket_bytes=bucket_bytes, early=got[1], buckets=real[0]))
    small, large = TRY_BUCKETS
    return Passed(say("right for bucket_bytes {small} and {large}: with one bucket nothing can go before "
                      "backward's last gradient, so nothing overlaps", small=small, large=large))
