"""DataParallel's data flow played by ranks (``parlab.lab.parallel.dp``, chapter 03) trains exactly like one
process on the global batch, moves the tensors nn.DataParallel moves, and leaves the extra work to rank 0."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import parlab
from parlab.lab.launch import preload
from parlab.lab.measure import CommLog, Timeline, totals
from parlab.lab.models import tiny_gpt2, token_batch
from parlab.lab.parallel.dp import dataparallel_step, train_like_dataparallel

STEPS = 2
VOCAB, SEQ = 128, 16


def _batches(n):
    return [token_batch(4 * n, seq_len=SEQ, vocab_size=VOCAB, seed=s) for s in range(STEPS)]


@pytest.fixture(scope="module")
def warm_ranks():
    # As in test_ddp.py: have the zygote import the GPT-2 code once instead of every rank (~5 s each).
    preload("transformers.models.gpt2.modeling_gpt2")


def _played():
    rank, n = parlab.rank(), parlab.world_size()
    model = tiny_gpt2(seed=rank)  # only the replicate step makes the ranks agree
    opt = torch.optim.SGD(model.parameters(), lr=0.05) if rank == 0 else None
    batches = _batches(n)
    losses = train_like_dataparallel(model, batches[:-1], opt)
    with Timeline() as timeline, CommLog(timeline=timeline) as log:
        losses.append(dataparallel_step(model, batches[-1], opt))
    grads_held = sum(p.grad is not None for p in model.parameters())
    return {"state": model.state_dict() if rank == 0 else None, "losses": losses, "records": log.records,
            "events": timeline.events, "grads_held": grads_held}


@pytest.mark.parametrize("n", [2, 3])
def test_played_dataparallel_equals_one_process(n, warm_ranks):
    per_rank = parlab.launch(_played, world_size=n, output="none", announce=False)
    model = tiny_gpt2(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x in _batches(n):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    assert_close(per_rank[0]["state"], model.state_dict())
    assert per_rank[0]["losses"] == pytest.approx(losses)  # the mean of the replicas' own losses
    psi = sum(p.numel() for p in model.parameters())
    per_rank_batch = 4  # sequences per rank
    for r, got in enumerate(per_rank):
        sent = {op: t["bytes"] for op, t in totals(got["records"]).items()}
        # nccl-tests sizes, the same on every rank: weights out and gradients in, Ψ fp32 values each way;
        # the logits of all n replicas come to rank 0, and the inputs and loss gradients go out from it
        assert sent == {"scatter": n * per_rank_batch * SEQ * 8 + n * 4, "broadcast": 4 * psi,
                        "gather": n * per_rank_batch * SEQ * VOCAB * 4 + n * 4, "reduce": 4 * psi}, r
        assert got["grads_held"] == (len(list(model.parameters())) if r == 0 else 0)
    only_rank0 = {e.name for e in per_rank[0]["events"]} - {e.name for e in per_rank[1]["events"]}
    assert only_rank0 == {"loss", "optimizer"}  # the work only GPU 0 does


def test_step_rejects_a_batch_that_does_not_split(warm_ranks):
    def step():
        dataparallel_step(tiny_gpt2(), token_batch(3, seq_len=SEQ, vocab_size=VOCAB))

    with pytest.raises(parlab.RankError, match="batch size 3 does not split over 2 ranks"):
        parlab.launch(step, world_size=2, output="none", announce=False)
