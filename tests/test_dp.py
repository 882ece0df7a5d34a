"""DataParallel's data flow played by ranks (``parlab.parallel.dp``, chapter 03) trains exactly like one
process on the global batch, and rank 0 carries the traffic."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import parlab
from parlab.launch import preload
from parlab.models import tiny_gpt2, token_batch
from parlab.parallel.dp import train_like_dataparallel

STEPS = 2


def _batches(n):
    return [token_batch(4 * n, seq_len=16, seed=s) for s in range(STEPS)]


@pytest.fixture(scope="module")
def warm_ranks():
    # As in test_ddp.py: have the zygote import the GPT-2 code once instead of every rank (~5 s each).
    preload("transformers.models.gpt2.modeling_gpt2")


def _played():
    rank, n = parlab.rank(), parlab.world_size()
    model = tiny_gpt2(seed=rank)  # only the replicate step makes the ranks agree
    log = []
    train_like_dataparallel(model, _batches(n), log=log)
    return model.state_dict() if rank == 0 else None, log


@pytest.mark.parametrize("n", [2, 3])
def test_played_dataparallel_equals_one_process(n, warm_ranks):
    per_rank = parlab.launch(_played, world_size=n, output="none", announce=False)
    model = tiny_gpt2(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in _batches(n):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    assert_close(per_rank[0][0], model.state_dict())
    hub = sum(b for s, _, _, b in per_rank[0][1] if s == 0)
    other = sum(b for s, _, _, b in per_rank[1][1] if s == 0)
    assert hub == (n - 1) * other  # every exchange goes through rank 0
    assert {p for _, p, _, _ in per_rank[0][1]} - {p for _, p, _, _ in per_rank[1][1]} == \
        {"4 loss on rank 0", "5 optimizer step"}  # work only rank 0 does
