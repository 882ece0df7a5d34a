"""Pipeline parallelism from scratch: one executor that runs any schedule (chapter 06).

The model is cut into consecutive *stages*; each rank holds one (or, interleaved, several) and passes
activations forward and gradients backward to its neighbours with point-to-point messages. What differs
between naive model parallelism, GPipe (Huang et al. 2019, arXiv:1811.06965), 1F1B (PipeDream, Narayanan et
al. 2019; flushed every step as here, PipeDream-Flush, Narayanan et al. 2021, arXiv:2006.09503) and
interleaved 1F1B (Narayanan et al. 2021, arXiv:2104.04473) is only the *order* in
which each rank runs its forwards and backwards, so the order is data (``pipeline_schedule.Schedule``)
and this file has a single executor, :class:`Pipeline`, that runs whichever schedule it is given:

    stages = split_sequential(model, schedule.num_stages)            # the same cut on every rank
    pipe = Pipeline([stages[s] for s in schedule.stages_of(rank)], schedule, loss_fn=F.mse_loss,
                    activation_shape=(micro_batch, hidden))
    losses = pipe.step(x if first else None, y if last else None)    # one forward/backward of the batch
    optimizer.step()

Where it runs: on ``group`` (default: every rank), whose size must be the schedule's number of ranks;
chapter 07 passes the ``pp`` group of a mesh. Every message goes through
``parlab.lab.parallel.comm.communicate_batch``, so an attached ``parlab.lab.measure.CommLog`` (``with CommLog() as
log:``) sees each activation and gradient that crosses a stage boundary. Each operation is a span on any
attached ``parlab.lab.measure.Timeline``, and ``with ActivationTracker(...):`` around ``step`` counts the
activations the stages keep for backward (the loss is kept out of the count); :func:`record_stage` does
the same for a ``torch.distributed.pipelining`` stage, so PyTorch's schedules (zero-bubble, DualPipeV) can
be drawn beside ours.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab.lab import runtime
from parlab.lab.measure.attach import not_activations, span
from parlab.lab.parallel.comm import communicate_batch
from parlab.lab.parallel.pipeline_p2p import check_p2p, p2p_plan
from parlab.lab.parallel.pipeline_schedule import Schedule


class Pipeline:
    """Runs ``schedule`` on this rank's ``stages`` (its modules, in increasing stage order).

    ``loss_fn(output, target)`` is applied on the last stage to each micro-batch; gradients are those of
    the mean over micro-batches (every micro-batch's loss is divided by their number before its
    backward), which for equal micro-batches is the loss of the whole batch. ``activation_shape``: the
    shape of one micro-batch's tensor at every stage boundary, e.g. ``(micro_batch, seq, hidden)``, which
    a receiver must know before the data arrives (Megatron-LM asks for it the same way).
    """

    def __init__(self, stages, schedule: Schedule, *, activation_shape, loss_fn=F.mse_loss,
                 dtype: torch.dtype = torch.float32, group=None):
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a parlab.lab.parallel.pipeline_schedule.Schedule; got {type(schedule).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("a pipeline needs an initialised process group: run inside parlab.launch")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if dist.get_world_size(self.group) != schedule.num_ranks:
            raise ValueError(f"schedule {schedule.name!r} is for {schedule.num_ranks} ranks; the group has "
                             f"{dist.get_world_size(self.group)}")
        self.stages = list(stages) if isinstance(stages, (list, tuple, nn.ModuleList)) else [stages]
        self.stage_ids = schedule.stages_of(self.rank)
        if len(self.stages) != len(self.stage_ids) or not all(isinstance(m, nn.Module) for m in self.stages):
            raise ValueError(f"rank {self.rank} holds stages {self.stage_ids} in {schedule.name!r}: pass "
                             f"{len(self.stage_ids)} module(s), got {len(self.stages)}")
        split = sorted({op.kind for ops in schedule.ops for op in ops} - {"F", "B"})
        if split:
            raise ValueError(f"schedule {schedule.name!r} has {', '.join(split)} operations: this executor runs F and "
                             f"B; schedules that split the backward run with torch.distributed.pipelining "
                             f"(chapter 06, under the hood D)")
        check_p2p(schedule)  # refuse an order that could deadlock before any rank starts
        self.schedule = schedule
        self.plan = p2p_plan(schedule)[self.rank]  # plan[i]: messages to exchange before operation i
        self.module = dict(zip(self.stage_ids, self.stages))
        self.loss_fn = loss_fn
        self.activation_shape = tuple(activation_shape)
        self.dtype = dtype
        params = [p for m in self.stages for p in m.parameters()]
        self.device = params[0].device if params else runtime.device()
        # NCCL: a group's first batched send/recv must involve all its ranks, so every rank takes part in a
        # barrier here, on its device: without device_ids it would run on the group's gloo half in GPU mode
        # and create no NCCL communicator.
        dist.barrier(group=self.group, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def parameters(self):
        for m in self.stages:
            yield from m.parameters()

    def step(self, inputs=None, targets=None) -> list[torch.Tensor]:
        """One forward and backward of the batch. The first stage's rank passes ``inputs`` and the last
        stage's ``targets`` (whole batches: they are cut into the schedule's micro-batches here); others
        pass nothing. Returns the micro-batches' losses on the last stage's rank, else ``[]``.

        Each operation is a span named like ``F3`` (``F3s5`` with several stages per rank) on any attached
        timeline; an ``ActivationTracker`` around the step counts the stages' activations, not the loss's."""
        m, last = self.schedule.num_micro_batches, self.schedule.num_stages - 1
        micro_inputs = self._split(inputs, "inputs") if 0 in self.module else None
        micro_targets = self._split(targets, "targets") if last in self.module else None
        self._ready: dict = {}  # (what, stage, micro-batch) -> tensor: received, or produced for a neighbour
        kept: dict = {}  # (stage, micro-batch) -> (stage input, output or scaled loss), until its backward
        losses: dict = {}
        sends: list = []
        many = self.schedule.stages_per_rank > 1
        for i, op in enumerate(self.schedule.ops[self.rank]):
            sends += self._exchange(self.plan[i])
            s, k = op.stage, op.micro_batch
            with span(op.name(many)):
                if op.kind == "F":
                    x = micro_inputs[k] if s == 0 else self._ready.pop(("act", s, k))
                    if s > 0:  # a leaf of this stage's graph, so that backward leaves its gradient here
                        x = x.detach().requires_grad_()
                    out = self.module[s](x)  # (*activation_shape), or the model's output on the last stage
                    if s == last:
                        with not_activations():  # what the loss keeps is not a stage's activations
                            loss = self.loss_fn(out, micro_targets[k])
                            out = loss / m  # the mean over micro-batches, one backward at a time
                        losses[k] = loss.detach()
                    else:
                        self._ready["act", s + 1, k] = out.detach()
                    kept[s, k] = (x, out)
                else:  # "B" (schedules with I or W were refused in __init__)
                    x, out = kept.pop((s, k))
                    grad = None if s == last else self._ready.pop(("grad", s + 1, k))
                    torch.autograd.backward(out, grad)
                    if s > 0:
                        self._ready["grad", s, k] = x.grad
        sends += self._exchange(self.plan[-1])
        for w, _ in sends:
            w.wait()
        if kept or self._ready:
            raise RuntimeError(f"schedule {self.schedule.name!r} left work undone on rank {self.rank}: "
                               f"{sorted(kept) or sorted(self._ready)}")
        return [losses[k] for k in range(m)] if losses else []

    def _split(self, batch, name):
        m = self.schedule.num_micro_batches
        if batch is None:
            raise ValueError(f"rank {self.rank} holds stage {0 if name == 'inputs' else self.schedule.num_stages - 1}: "
                             f"pass {name}= to step()")
        if batch.shape[0] % m:
            raise ValueError(f"{name} has {batch.shape[0]} examples, which do not split into "
                             f"num_micro_batches={m} equal micro-batches")
        # copies: each micro-batch's memory is its own, as if it came from the data loader
        return [c.clone() for c in batch.to(self.device).tensor_split(m)]  # m × (batch / m, ...)

    def _exchange(self, batch) -> list:
        """Send what ``batch`` sends and receive what it receives, as one batch; wait for the receives.
        Returns the sends' (waitable, tensor) pairs, to be waited for at the end of the step."""
        messages = []
        for msg in batch:
            key = (msg.what, msg.stage, msg.micro_batch)
            tensor = (self._ready.pop(key) if msg.send else
                      torch.empty(self.activation_shape, dtype=self.dtype, device=self.device))
            if not msg.send:
                self._ready[key] = tensor
            messages.append(("send" if msg.send else "recv", tensor, msg.peer, f"{msg.what}{msg.micro_batch}s{msg.stage}"))
        waits = communicate_batch(messages, self.group)
        for w, msg in zip(waits, batch):
            if not msg.send:
                w.wait()
        # a send's tensor must outlive the send: keep it with its waitable until the end of the step
        return [(w, tensor) for w, msg, (_, tensor, _, _) in zip(waits, batch, messages) if msg.send]


# -- cutting a model into stages ---------------------------------------------------------------------------

def split_sequential(model: nn.Sequential, num_stages: int) -> list[nn.Sequential]:
    """``num_stages`` consecutive runs of an ``nn.Sequential``'s blocks, as equal as possible."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential of blocks; got {type(model).__name__}")
    return [nn.Sequential(*model[a:b]) for a, b in _runs(len(model), num_stages)]


def _runs(n: int, parts: int) -> list[tuple[int, int]]:
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= n:
        raise ValueError(f"num_stages must be an int in 1..{n} (the number of layers to share out); got {parts!r}")
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return list(zip(bounds, bounds[1:]))


class GPT2Stage(nn.Module):
    """Layers ``[start, end)`` of a transformers GPT-2 as one pipeline stage. The first stage embeds
    token ids, ``(batch, seq)`` → ``(batch, seq, hidden)``; the last applies the final norm and the LM head,
    → ``(batch, seq, vocab)``; the others map hidden states to hidden states."""

    def __init__(self, model, start: int, end: int):
        super().__init__()
        t, n = model.transformer, model.config.n_layer
        self.config = model.config
        self.wte, self.wpe = (t.wte, t.wpe) if start == 0 else (None, None)
        self.h = nn.ModuleList(t.h[start:end])
        self.ln_f, self.lm_head = (t.ln_f, model.lm_head) if end == n else (None, None)

    def forward(self, x):
        if self.wte is not None:
            positions = torch.arange(x.shape[1], device=x.device)[None]  # (1, seq)
            x = self.wte(x) + self.wpe(positions)  # (batch, seq) ids -> (batch, seq, hidden)
        seq = x.shape[1]
        # causal: position t attends to positions <= t (added to the attention scores before softmax)
        mask = torch.full((seq, seq), torch.finfo(x.dtype).min, device=x.device).triu(1)[None, None]
        for block in self.h:
            x = block(x, attention_mask=mask)
            x = x[0] if isinstance(x, tuple) else x  # transformers < 5 returns a tuple
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))  # (batch, seq, vocab)
        return x


def split_gpt2(model, num_stages: int) -> list[GPT2Stage]:
    """A ``GPT2LMHeadModel`` cut by layers into ``num_stages`` stages. Its LM head must not share the token
    embedding's weight (``tiny_gpt2(tie_word_embeddings=False)``): with tied weights the first and last
    stage would each need the other's gradient (Megatron-LM all-reduces it between them)."""
    if model.lm_head.weight is model.transformer.wte.weight:
        raise ValueError("the LM head and the token embedding share one weight; build the model with "
                         "tie_word_embeddings=False to cut it into pipeline stages")
    return [GPT2Stage(model, a, b) for a, b in _runs(model.config.n_layer, num_stages)]


def causal_lm_loss(logits, tokens):
    """Next-token cross-entropy, the mean over every predicted token, as transformers computes it:
    ``logits`` (batch, seq, vocab) at position t predict ``tokens`` (batch, seq) at t + 1."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


# -- recording PyTorch's own pipeline stages ------------------------------------------------------------

def record_stage(stage, *, with_stage: bool = False):
    """Make a ``torch.distributed.pipelining`` stage name each forward (``F3``), backward (``B3``), input
    gradient (``I3``) and weight gradient (``W3``) as spans on whatever ``Timeline`` is attached when it
    runs (none: it records nothing), named as our schedules name them (``F3s5`` with ``with_stage``). It
    wraps the stage object's own methods, so any of PyTorch's schedules can be recorded and drawn beside
    ours; wrapping a stage again wraps its original methods, not the wrappers. An ``ActivationTracker``
    around the schedule's step counts what the stage keeps; keep the loss out of it with
    ``parlab.lab.measure.attach.not_activations`` around the schedule's ``loss_fn``."""
    s = stage.stage_index
    suffix = f"s{s}" if with_stage else ""
    if not hasattr(stage, "_unrecorded"):
        stage._unrecorded = (stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk)
    forward, backward, weight = stage._unrecorded

    @functools.wraps(forward)
    def forward_one_chunk(chunk, *args, **kwargs):
        with span(f"F{chunk}{suffix}"):
            return forward(chunk, *args, **kwargs)

    @functools.wraps(backward)
    def backward_one_chunk(chunk, *args, full_backward: bool = True, **kwargs):
        with span(f"{'B' if full_backward else 'I'}{chunk}{suffix}"):
            return backward(chunk, *args, full_backward=full_backward, **kwargs)

    @functools.wraps(weight)
    def backward_weight_one_chunk(chunk, *args, **kwargs):
        with span(f"W{chunk}{suffix}"):
            return weight(chunk, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk
    return stage
