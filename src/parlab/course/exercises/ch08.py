"""Chapter 08's exercise: a single-process transformers training loop becomes FSDP2 with a sharded
checkpoint. The check runs the learner's function on N ranks for the first steps (saving), then on M ranks
from the checkpoint for the rest, and compares every loss with the single-process loop's."""

from __future__ import annotations

import os
import tempfile

import torch

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, without
from parlab.lab.job import train_fsdp
from parlab.lab.models import tiny_llama, token_batch

#: The exercise's job: a tiny Llama (4 query and 4 K/V heads), SGD with momentum, 12 sequences of 16 tokens
#: (12: a batch that splits over 2, 3 and 4 ranks).
LOOP = dict(lr=0.3, momentum=0.9, global_batch=12, seq_len=16)


def single_process_loop(steps: int = 4) -> list[float]:
    """The loop the learner is given: one process, the whole batch of each step."""
    return _loop(steps)


def _loop(steps, alter_at=None):
    model = tiny_llama(heads=4, kv_heads=4, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LOOP["lr"], momentum=LOOP["momentum"])
    losses = []
    for step in range(steps):
        if step == alter_at:  # what the check does to the checkpoint it resumes from (see _alter)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(WEIGHTS)
                    opt.state[p]["momentum_buffer"].mul_(MOMENTUM)
        x = token_batch(LOOP["global_batch"], LOOP["seq_len"], seed=step)  # (global_batch, seq_len)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


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

    why = ("this exercise asks you to write the FSDP2 and checkpoint code yourself; parlab.lab.job.train_fsdp's "
           "functions are refused while your function runs")
    sharded = []  # did any forward run on a module fully_shard made (however the learner imported it)?
    blocks = {}  # each block class's instances seen in a forward: id -> was it an FSDP unit of its own?

    def seen(module, args):
        if not sharded and isinstance(module, FSDPModule):
            sharded.append(True)
        if type(module).__name__.removeprefix("FSDP") in BLOCKS:
            blocks[id(module)] = isinstance(module, FSDPModule)

    hook = torch.nn.modules.module.register_module_forward_pre_hook(seen)
    try:
        with without(train_fsdp, ["shard", "save", "load", "train"], why):
            losses = fn(first_step=first_step, steps=steps, save_to=save_to, load_from=load_from)
    except NotImplementedError:
        raise ExerciseFailed("sharded_loop is not written yet (it raises NotImplementedError)") from None
    finally:
        hook.remove()
    units = sum(blocks.values())  # blocks that were FSDP units of their own
    return [float(v) for v in losses] if isinstance(losses, (list, tuple)) else losses, bool(sharded), (units, len(blocks))


def _run(fn, world_size, *args):
    try:
        losses, sharded, (units, blocks) = parlab.launch(_on_rank, world_size, args=(fn, *args), timeout=60,
                                                         announce=False)[0]
    except parlab.RankError as err:
        if isinstance(err.exception, ExerciseFailed):
            raise err.exception from None
        raise ExerciseFailed(f"your function raised on rank {err.rank} of {world_size}: {err.type_name}: "
                             f"{err.remote_message.splitlines()[0] if err.remote_message else ''}") from None
    if not sharded:
        raise ExerciseFailed(f"on {world_size} ranks, no forward ran through a module fully_shard had made: the "
                             f"model is replicated, not sharded (call fully_shard on each of model.model.layers, "
                             f"then on the model, before training)")
    if units < blocks:
        raise ExerciseFailed(f"on {world_size} ranks, {blocks - units} of the model's {blocks} decoder layers ran "
                             f"without being FSDP units of their own: fully_shard was called on the model's root "
                             f"only (or on some layers), so each forward gathers the whole model at once and "
                             f"sharding saves no peak memory (chapter 04). Call fully_shard on each of "
                             f"model.model.layers first, then on the model")
    return losses


def _compare(got, want, what, hint=""):
    if not isinstance(got, list) or len(got) != len(want):
        raise ExerciseFailed(f"{what}: expected a list of {len(want)} losses, got {got!r:.120}")
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.isclose(torch.tensor(g), torch.tensor(w), rtol=1e-5, atol=1e-6):
            raise ExerciseFailed(f"{what}: loss {i} is {g:.7f}, the single-process loop's is {w:.7f}"
                                 + (f"; {hint}" if hint else ""))


def check_sharded_training(fn, world_size: int = 2, resume_world_size: int = 3, steps: int = 4) -> Passed:
    """Chapter 08: ``fn(first_step, steps, save_to, load_from)`` on every rank trains steps ``first_step`` …
    ``first_step + steps - 1`` with FSDP2, loading model and optimizer from ``load_from`` first and saving
    them to ``save_to`` after (with ``torch.distributed.checkpoint``, each rank its own shards), and returns
    the global batch's loss of each step. Run on ``world_size`` ranks for half the steps, then resumed on
    ``resume_world_size`` ranks, against :func:`single_process_loop`."""
    if not callable(fn):
        raise TypeError(f"fn must be the function you wrote; got {type(fn).__name__}")
    if world_size == resume_world_size:
        raise ValueError(f"resume_world_size must differ from world_size (both {world_size}): the point is "
                         f"resharding")
    for name, n in (("world_size", world_size), ("resume_world_size", resume_world_size)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 2 or LOOP["global_batch"] % n:
            raise ValueError(f"{name} must be an int ≥ 2 dividing the batch of {LOOP['global_batch']}; got {n!r}")
    want = single_process_loop(steps)
    half = steps // 2
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt")
        first = _run(fn, world_size, 0, half, path, None)
        _compare(first, want[:half], f"on {world_size} ranks, steps 0–{half - 1}")
        files = sorted(os.listdir(path)) if os.path.isdir(path) else []
        shards = [f for f in files if f.endswith(".distcp")]
        if len(shards) != world_size or ".metadata" not in files:
            raise ExerciseFailed(f"the checkpoint at save_to should hold one .distcp file per rank ({world_size}) "
                                 f"and a .metadata file (torch.distributed.checkpoint.save on every rank); "
                                 f"found {files}")
        from torch.distributed.checkpoint import FileSystemReader

        keys = list(FileSystemReader(path).read_metadata().state_dict_metadata)
        if not any("momentum_buffer" in k for k in keys):
            raise ExerciseFailed("the checkpoint holds no optimizer state (no momentum buffers): save the "
                                 "optimizer's state dict too (get_state_dict(model, opt)), or the resumed run "
                                 "restarts its momentum from zero")
        altered = os.path.join(folder, "altered")
        _alter(path, altered)
        rest = _run(fn, resume_world_size, half, steps - half, None, altered)
        want = _loop(steps, alter_at=half)
        _compare(rest, want[half:], f"resumed on {resume_world_size} ranks from your checkpoint, which the check "
                 f"altered (weights × {WEIGHTS}, momentum × {MOMENTUM}), steps {half}–{steps - 1}",
                 hint="does load_from load the model and the optimizer's state, rather than replay the first steps?")
    return Passed(f"{steps} losses equal the single-process loop's: {half} steps on {world_size} ranks, saved "
                  f"as {world_size} shards, resumed from them on {resume_world_size} ranks")
