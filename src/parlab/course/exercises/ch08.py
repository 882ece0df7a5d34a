"""Chapter 08's exercise: a single-process transformers training loop becomes FSDP2 with a sharded
checkpoint. The check runs the learner's function on N ranks for the first steps (saving), then on M ranks
from the checkpoint for the rest, and compares every loss with the single-process loop's, and the rows each
rank trained on with its shard of each step's batch (the losses and weights cannot tell a rank that trains
on the whole batch from one that trains on its shard: FSDP averages equal gradients)."""

from __future__ import annotations

import os
import tempfile
from collections import Counter

import torch

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, without
from parlab.lab.job import train_fsdp
from parlab.lab.language import say
from parlab.lab.launch.plan import make_plan
from parlab.lab.models import tiny_llama, token_batch

#: The exercise's job: a tiny Llama (4 query and 4 K/V heads), SGD with momentum, 12 sequences of 16 tokens
#: (12: a batch that splits over 2, 3 and 4 ranks).
LOOP = dict(lr=0.3, momentum=0.9, global_batch=12, seq_len=16)


def single_process_loop(first_step=0, steps=4, model=None, opt=None, rows=lambda x: x):
    """The loop the learner is given: steps ``first_step`` … of the job, each on ``rows(batch)`` of the step's
    batch (the whole batch by default), training ``model`` with ``opt`` (a new tiny Llama and its SGD by
    default); returns each step's loss."""
    model = tiny_llama(heads=4, kv_heads=4, seed=0) if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=LOOP["lr"], momentum=LOOP["momentum"]) if opt is None else opt
    losses = []
    for step in range(first_step, first_step + steps):
        x = rows(token_batch(LOOP["global_batch"], LOOP["seq_len"], seed=step))  # (global_batch, seq_len)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _resumed_loop(steps, half):
    """The single-process loop, altered after ``half`` steps as the check alters the learner's checkpoint."""
    model = tiny_llama(heads=4, kv_heads=4, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LOOP["lr"], momentum=LOOP["momentum"])
    losses = single_process_loop(0, half, model, opt)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(WEIGHTS)
            opt.state[p]["momentum_buffer"].mul_(MOMENTUM)
    return losses + single_process_loop(half, steps - half, model, opt)


#: The block classes of the exercise's model (its ``_no_split_modules``): each must be an FSDP unit of its own.
BLOCKS = frozenset(tiny_llama(heads=4, kv_heads=4, seed=0)._no_split_modules)

#: The check resumes from the learner's checkpoint with every weight scaled by WEIGHTS and every momentum
#: buffer by MOMENTUM: a loop that does not load it (replaying the first steps instead) is caught.
WEIGHTS, MOMENTUM = 0.98, 0.5


def _alter(path, altered):
    """Rewrite the DCP checkpoint at ``path`` into ``altered`` (in this process, no group), whatever its
    layout: momentum buffers × MOMENTUM, every other floating tensor × WEIGHTS."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    def walk(node, key=""):
        if isinstance(node, dict):
            return {k: walk(v, k) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if isinstance(node, torch.Tensor) and node.is_floating_point():
            return node * (MOMENTUM if key == "momentum_buffer" else WEIGHTS)
        return node

    whole = altered + ".pt"
    dcp_to_torch_save(path, whole)
    torch.save(walk(torch.load(whole, weights_only=False)), whole)
    torch_save_to_dcp(whole, altered)


def _on_rank(fn, first_step, steps, save_to, load_from):
    from torch.distributed.fsdp import FSDPModule

    why = say("this exercise asks you to write the FSDP2 and checkpoint code yourself; parlab.lab.job.train_fsdp's "
              "functions are refused while your function runs")
    sharded = []  # did any forward run on a module fully_shard made (however the learner imported it)?
    blocks = {}  # each block class's instances seen in a forward: id -> was it an FSDP unit of its own?
    rows = []  # the token rows this rank's embedding looked up: what it trained on

    def seen(module, args):
        if not sharded and isinstance(module, FSDPModule):
            sharded.append(True)
        if type(module).__name__.removeprefix("FSDP") in BLOCKS:
            blocks[id(module)] = isinstance(module, FSDPModule)
        if isinstance(module, torch.nn.Embedding) and args and isinstance(args[0], torch.Tensor):
            rows.extend(tuple(r) for r in args[0].detach().cpu().reshape(-1, args[0].shape[-1]).tolist())

    hook = torch.nn.modules.module.register_module_forward_pre_hook(seen)
    try:
        with without(train_fsdp, ["shard", "save", "load", "train"], why):
            losses = fn(first_step, steps, save_to, load_from)  # by position: your parameters' names are yours
    except NotImplementedError:
        raise ExerciseFailed(say("sharded_loop is not written yet (it raises NotImplementedError)")) from None
    finally:
        hook.remove()
    units = sum(blocks.values())  # blocks that were FSDP units of their own
    losses = [float(v) for v in losses] if isinstance(losses, (list, tuple)) else losses
    return losses, bool(sharded), (units, len(blocks)), rows


def _batches(first_step, steps):
    return Counter(tuple(r) for step in range(first_step, first_step + steps)
                   for r in token_batch(LOOP["global_batch"], LOOP["seq_len"], seed=step).tolist())


def _check_rows(per_rank, first_step, steps, world_size):
    """Each step's batch, once over all ranks, each rank its share: else a hint that names the mistake."""
    batch, last = LOOP["global_batch"], first_step + steps - 1
    counts = [len(rows) for rows in per_rank]
    if all(n == steps * batch for n in counts):
        raise ExerciseFailed(say("on {world_size} ranks, every rank trained on the whole batch of {batch} rows "
                                 "each step ({counts} rows over {steps} steps): the shard step is missing. Each rank "
                                 "must train on its own rows, shard(x, dist.get_rank(), dist.get_world_size()); the "
                                 "losses and weights cannot show it (FSDP averages {world_size} equal gradients), "
                                 "but the job does the same work {world_size} times", world_size=world_size,
                                 batch=batch, counts=counts, steps=steps))
    got = sum((Counter(rows) for rows in per_rank), Counter())
    if got == _batches(first_step, steps):
        return
    if first_step and got == _batches(0, first_step + steps):
        raise ExerciseFailed(say("on {world_size} ranks, asked for steps {first_step}–{last}, your function "
                                 "trained steps 0–{last}: load the model and optimizer from load_from and go on "
                                 "from first_step, rather than replay the first steps", world_size=world_size,
                                 first_step=first_step, last=last))
    if first_step and got == _batches(0, steps):
        raise ExerciseFailed(say("on {world_size} ranks, steps {first_step}–{last} trained on the batches of "
                                 "steps 0–{replayed}: draw each step's batch with seed=step, for step from "
                                 "first_step", world_size=world_size, first_step=first_step, last=last,
                                 replayed=steps - 1))
    raise ExerciseFailed(say("on {world_size} ranks, steps {first_step}–{last}: the ranks' rows together are not "
                             "each step's batch once (rows per rank: {counts}; expected {each} per step each). Rank "
                             "r takes shard(x, r, {world_size}) of token_batch({batch}, {seq_len}, seed=step)",
                             world_size=world_size, first_step=first_step, last=last, counts=counts,
                             each=batch // world_size, batch=batch, seq_len=LOOP['seq_len']))


def _run(fn, world_size, first_step, steps, save_to, load_from):
    try:
        results = parlab.launch(_on_rank, world_size, args=(fn, first_step, steps, save_to, load_from), timeout=60,
                                announce=False)
    except parlab.RankError as err:
        if isinstance(err.exception, ExerciseFailed):
            raise err.exception from None
        raise ExerciseFailed(say("your function raised on rank {rank} of {world_size}: {type_name}: {message}",
                                 rank=err.rank, world_size=world_size, type_name=err.type_name,
                                 message=err.remote_message.splitlines()[0] if err.remote_message else '')) from None
    _, sharded, (units, blocks), _ = results[0]
    if not sharded:
        raise ExerciseFailed(say("on {world_size} ranks, no forward ran through a module fully_shard had made: "
                                 "the model is replicated, not sharded (call fully_shard on each of "
                                 "model.model.layers, then on the model, before training)", world_size=world_size))
    if units < blocks:
        raise ExerciseFailed(say("on {world_size} ranks, {missing} of the model's {blocks} decoder layers ran "
                                 "without being FSDP units of their own: fully_shard was called on the model's root "
                                 "only (or on some layers), so each forward gathers the whole model at once and "
                                 "sharding saves no peak memory (chapter 04). Call fully_shard on each of "
                                 "model.model.layers first, then on the model", world_size=world_size,
                                 missing=blocks - units, blocks=blocks))
    _check_rows([r[3] for r in results], first_step, steps, world_size)
    per_rank = [r[0] for r in results]
    if not all(isinstance(v, list) and len(v) == steps for v in per_rank):
        raise ExerciseFailed(say("on {world_size} ranks: expected a list of {steps} losses from every rank, got "
                                 "{got!r:.120}", world_size=world_size, steps=steps, got=per_rank[0]))
    return [sum(values) / world_size for values in zip(*per_rank)]  # the ranks' means: the global batch's


def _compare(got, want, what, first_hint, later_hint, world_size):
    # the loop ran in one CPU process: GPU ranks round differently, by the launch's tolerance (runtime.TOLERANCE)
    plan = make_plan(world_size)
    tol = plan.tolerance if plan.device_type == "cuda" else {"rtol": 1e-5, "atol": 1e-6}
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.isclose(torch.tensor(g), torch.tensor(w), **tol):
            if abs(g / w - world_size) < 1e-3:
                hint = say("it is {world_size} times the loop's: each rank's loss was summed over ranks (an "
                           "all_reduce with SUM). Return each rank's own loss: the check averages them",
                           world_size=world_size)
            else:
                hint = first_hint if i == 0 else later_hint
            raise ExerciseFailed(say("{what}: loss {i} (the ranks' mean) is {got:.7f}, the single-process loop's is "
                                     "{want:.7f}; {hint}", what=what, i=i, got=g, want=w, hint=hint))


def check_sharded_training(fn, world_size: int = 2, resume_world_size: int = 3, steps: int = 4) -> Passed:
    """Chapter 08: ``fn(first_step, steps, save_to, load_from)`` on every rank trains steps ``first_step`` …
    ``first_step + steps - 1`` with FSDP2, each rank on its shard of each step's batch, loading model and
    optimizer from ``load_from`` first and saving them to ``save_to`` after (with
    ``torch.distributed.checkpoint``, each rank its own shards), and returns this rank's loss of each step (the
    check averages the ranks'). Run on ``world_size`` ranks for half the steps, then resumed on
    ``resume_world_size`` ranks, against :func:`single_process_loop`; the rows each rank's embedding looked up
    must be its shard of each step's batch."""
    if not callable(fn):
        raise TypeError(say("fn must be the function you wrote; got {type}", type=type(fn).__name__))
    if world_size == resume_world_size:
        raise ValueError(say("resume_world_size must differ from world_size (both {world_size}): the point is "
                             "resharding", world_size=world_size))
    for name, n in (("world_size", world_size), ("resume_world_size", resume_world_size)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 2 or LOOP["global_batch"] % n:
            raise ValueError(say("{name} must be an int ≥ 2 dividing the batch of {batch}; got {n!r}", name=name,
                                 batch=LOOP["global_batch"], n=n))
    want = single_process_loop(0, steps)
    half = steps // 2
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt")
        first = _run(fn, world_size, 0, half, path, None)
        _compare(first, want[:half], say("on {world_size} ranks, steps 0–{last}", world_size=world_size,
                                         last=half - 1),
                 say("the first step already differs: start from tiny_llama(heads=4, kv_heads=4, seed=0), as the "
                     "loop does"),
                 say("the first step matches, a later one does not, so the update differs: build the optimizer "
                     "after fully_shard (before it, it holds the parameters fully_shard replaced), with the loop's "
                     "lr and momentum"), world_size)
        files = sorted(os.listdir(path)) if os.path.isdir(path) else []
        shards = [f for f in files if f.endswith(".distcp")]
        if len(shards) != world_size or ".metadata" not in files:
            raise ExerciseFailed(say("the checkpoint at save_to should hold one .distcp file per rank "
                                     "({world_size}) and a .metadata file (torch.distributed.checkpoint.save on "
                                     "every rank); found {files}", world_size=world_size, files=files))
        from torch.distributed.checkpoint import FileSystemReader

        keys = list(FileSystemReader(path).read_metadata().state_dict_metadata)
        if not any("momentum_buffer" in k for k in keys):
            raise ExerciseFailed(say("the checkpoint holds no optimizer state (no momentum buffers): save the "
                                     "optimizer's state dict too (get_state_dict(model, opt)), or the resumed run "
                                     "restarts its momentum from zero"))
        altered = os.path.join(folder, "altered")
        _alter(path, altered)
        rest = _run(fn, resume_world_size, half, steps - half, None, altered)
        want = _resumed_loop(steps, half)
        _compare(rest, want[half:], say("resumed on {resume_world_size} ranks from your checkpoint, which the "
                                        "check altered (weights × {weights}, momentum × {momentum}), steps "
                                        "{half}–{last}", resume_world_size=resume_world_size, weights=WEIGHTS,
                                        momentum=MOMENTUM, half=half, last=steps - 1),
                 say("the first resumed step is not the checkpoint's weights: does load_from load the model's state "
                     "(dcp.load, then set_state_dict), rather than replay the first steps?"),
                 say("the first resumed step matches, so the weights were loaded, but a later one does not: load the "
                     "optimizer's state too (set_state_dict's optim_state_dict), or its momentum restarts"),
                 resume_world_size)
    return Passed(say("{steps} losses equal the single-process loop's: {half} steps on {world_size} ranks, saved "
                      "as {world_size} shards, resumed from them on {resume_world_size} ranks, each rank on its "
                      "shard of every batch", steps=steps, half=half, world_size=world_size,
                      resume_world_size=resume_world_size))
